"""onnx2fpga: ONNX models to verified streaming FPGA accelerators on open toolchains.

>>> design = onnx2fpga.compile("mlp.onnx", "out/", calibration=x_cal)   # doctest: +SKIP
>>> with onnx2fpga.connect("out/", sim=True) as board:                   # doctest: +SKIP
...     y = board.infer(x)

``import onnx2fpga`` stays light (no onnx, numpy or Amaranth): the verbs import their module
when called, and the error classes of the subpackages are imported when first named
(``from onnx2fpga import RtlSimulationError``). Every error a user can cause derives from
:class:`Onnx2FpgaError`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .errors import (
    CalibrationError,
    CheckError,
    DesignDirError,
    InputError,
    LoadError,
    MissingExtraError,
    Onnx2FpgaError,
    OptionError,
    SizeError,
    UnsupportedError,
)
from .version import __version__

if TYPE_CHECKING:
    from .api import CompiledDesign
    from .runtime import Board

#: Errors defined beside the code that raises them: name -> module (imported on first use).
_LAZY_ERRORS = {
    "RtlSimulationError": "onnx2fpga.sim.verilator_build",
    "SimulatorCrash": "onnx2fpga.sim.driver",
    "BuildError": "onnx2fpga.boards.build",
    "ClockError": "onnx2fpga.boards.clocking",
    "FlashError": "onnx2fpga.boards.flash",
    "UnknownBoardError": "onnx2fpga.boards.targets",
    "LinkError": "onnx2fpga.boards.protocol",
    "LinkTimeout": "onnx2fpga.boards.protocol",
    "ProtocolVersionError": "onnx2fpga.boards.protocol",
    "SimBoardError": "onnx2fpga.boards.simboard",
    "BoardMismatchError": "onnx2fpga.runtime",
    "Onnx2FpgaWarning": "onnx2fpga.frontend.check",
}

__all__ = ["compile", "load", "connect", "explore", "__version__", "Onnx2FpgaError", "LoadError",
           "CheckError", "UnsupportedError", "CalibrationError", "DesignDirError",
           "OptionError", "InputError", "SizeError", "MissingExtraError", *_LAZY_ERRORS]


def __getattr__(name: str):
    module = _LAZY_ERRORS.get(name)
    if module is None:
        raise AttributeError(f"module 'onnx2fpga' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_ERRORS))


def compile(model, output_dir=None, *, calibration=None, lenient: bool = False,  # noqa: A001
            allow_host_compute: bool = False, force: bool = False, weight_bits: int = 8,
            activation_bits: int = 8, per_channel: bool = True, pow2_scales: bool = False,
            max_lanes: int | None = None,
            folding: dict | None = None, multiplier_bits: int | None = None,
            requant: str | None = None,
            board: str | None = None, target_fps: float | None = None,
            clock_mhz: float | None = None, utilization: float | None = None,
            optimize: str = "throughput", verbose: bool = False, stop_after: str = "emit",
            name: str = "top", weights: str = "auto",
            architecture: str = "auto", adder_levels: int | None = None) -> CompiledDesign:
    """Compile an ONNX model (path or ``onnx.ModelProto``) into a design directory; see
    :func:`onnx2fpga.api.compile`, whose parameters these are."""
    from .api import compile as _compile
    return _compile(model, output_dir, calibration=calibration, lenient=lenient,
                    allow_host_compute=allow_host_compute, force=force,
                    weight_bits=weight_bits, activation_bits=activation_bits,
                    per_channel=per_channel, pow2_scales=pow2_scales, max_lanes=max_lanes,
                    folding=folding,
                    multiplier_bits=multiplier_bits, requant=requant, board=board,
                    target_fps=target_fps, clock_mhz=clock_mhz, utilization=utilization,
                    optimize=optimize, verbose=verbose, stop_after=stop_after, name=name,
                    weights=weights, architecture=architecture, adder_levels=adder_levels)


def load(directory) -> CompiledDesign:
    """Open a compiled design directory; see :func:`onnx2fpga.api.load`."""
    from .api import load as _load
    return _load(directory)


def connect(directory, port=None, *, baud=None, sim=False, timeout=None, retries=5,
            sim_options=None) -> Board:
    """Connect to a board (or ``sim=True``: a simulated board) running the design in
    ``directory``; see :func:`onnx2fpga.runtime.connect`, whose parameters these are."""
    from .runtime import connect as _connect
    return _connect(directory, port, baud=baud, sim=sim, timeout=timeout, retries=retries,
                    sim_options=sim_options)


def explore(model, output_dir, board: str, **options) -> dict:
    """Compile ``model`` at several foldings, build each for ``board`` at several seeds and
    clocks on a Dask cluster, and write the sweep's rows, Pareto fronts and chosen design
    into ``output_dir``; see :func:`onnx2fpga.dse.explore`, whose parameters these
    are."""
    from .dse import explore as _explore
    return _explore(model, output_dir, board, **options)
