"""onnx2fpga: ONNX models to verified streaming FPGA accelerators on open toolchains."""

from .version import __version__

__all__ = ["compile", "load", "connect", "__version__"]


def compile(model, output_dir=None, **options):  # noqa: A001 - the public verb is "compile"
    """Compile an ONNX model (path or ``onnx.ModelProto``); see :func:`onnx2fpga.api.compile`."""
    from .api import compile as _compile
    return _compile(model, output_dir, **options)


def load(directory):
    """Open a compiled design directory; see :func:`onnx2fpga.api.load`."""
    from .api import load as _load
    return _load(directory)


def connect(directory, port=None, **options):
    """Connect to a board (or ``sim=True``: a simulated board) running the design in
    ``directory``; see :func:`onnx2fpga.runtime.connect`."""
    from .runtime import connect as _connect
    return _connect(directory, port, **options)
