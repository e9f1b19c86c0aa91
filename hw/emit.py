"""Verilog emission of an accelerator."""

from __future__ import annotations

from amaranth.back import verilog

from ..ir.dataflow import Dataflow
from .collect import fewer_collections
from .top import make_top

__all__ = ["emit_verilog"]


def emit_verilog(dataflow: Dataflow, name: str = "top", *, platform=None,
                 flash_image=None) -> str:
    """Verilog source of the top level of ``dataflow`` (:func:`~onnx2fpga.hw.top.make_top`: the
    :class:`~onnx2fpga.hw.top.Accelerator`, or the layer engine with ``dataflow.engine``).

    The module is called ``name``; its ports are ``clk``, ``rst`` and the AXI4-Stream signals
    documented on the Accelerator. The text depends only on ``dataflow`` and ``name``: the same
    input gives byte-identical output on every call and on every machine (no source locations
    are emitted, so the checkout path does not leak into it).

    ``platform`` (an Amaranth platform, default none) elaborates the cores as a board build
    does for it: on an ECP5, for instance, hard products become ``MULT18X18D`` instances
    (black boxes here) with the same cycle behaviour as the platform-free design.

    ``flash_image`` (bytes): for a simulation of a design with weights in SPRAM, a model of
    the SPI flash holding them inside the module in place of its flash ports (the
    Accelerator's ``flash_image``; usually ``Accelerator(dataflow).weight_image``).

    Raises
    ------
    TypeError
        If ``name`` is not a string.
    ValueError
        If ``name`` is not a plain Verilog identifier, or the dataflow is malformed.
    """
    if not isinstance(name, str):
        raise TypeError(f"Module name must be a string, not {name!r}")
    if not name.isidentifier() or not name.isascii():
        raise ValueError(f"Module name must be a Verilog identifier, not {name!r}")
    with fewer_collections():
        top = make_top(dataflow, flash_image=flash_image)
        return verilog.convert(top, name=name, emit_src=False, platform=platform)
