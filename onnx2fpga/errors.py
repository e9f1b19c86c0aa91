"""The project's error types. Every error a user can cause is one of these."""

__all__ = ["Onnx2FpgaError", "LoadError", "CheckError", "UnsupportedError", "CalibrationError",
           "DesignDirError", "OptionError", "InputError", "SizeError", "MissingExtraError"]


class Onnx2FpgaError(Exception):
    """Base of every error onnx2fpga raises on bad input; the CLI prints it as one line."""


class LoadError(Onnx2FpgaError):
    """The model file cannot be read or parsed."""


class CheckError(Onnx2FpgaError):
    """The model is not valid ONNX (checker, shape inference, unbound dimensions)."""


class UnsupportedError(Onnx2FpgaError):
    """The model uses operators or options we cannot compile. ``problems`` lists them all."""

    def __init__(self, problems):
        self.problems = list(problems)
        n = len(self.problems)
        head = f"{n} unsupported node{'s' if n != 1 else ''}: " if n > 1 else ""
        super().__init__(head + "; ".join(self.problems))


class CalibrationError(Onnx2FpgaError):
    """Calibration data is missing or does not match the model's input."""


class DesignDirError(Onnx2FpgaError):
    """The output or design directory is unusable (exists, not a design, ...)."""


class OptionError(Onnx2FpgaError, ValueError):
    """An option does not fit the model (a folding override a layer cannot take, ...)."""


class InputError(Onnx2FpgaError, ValueError):
    """Inputs given to run a design are unusable: not a regular ``.npy`` file, a header that
    does not match the file, the wrong dtype or shape, a NaN (which has no quantized value)."""


class SizeError(Onnx2FpgaError):
    """The model is too large: for the board (no folding fits it), for every supported device
    by far, or for this machine's memory. Raised before the expensive steps."""


class MissingExtraError(Onnx2FpgaError, ImportError):
    """An optional dependency is not installed. The message names the extra of onnx2fpga
    that installs it (``pip install 'onnx2fpga[gowin]'``); ``extra`` holds its name."""

    def __init__(self, what: str, packages, extra: str):
        self.extra = extra
        self.packages = tuple(packages)
        names = ", ".join(self.packages[:-1]) + " and " * (len(self.packages) > 1) + \
            self.packages[-1]
        super().__init__(f"{what} needs {names}, which "
                         f"{'is' if len(self.packages) == 1 else 'are'} not installed: "
                         f"pip install 'onnx2fpga[{extra}]'")
