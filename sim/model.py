"""Run a whole :class:`~onnx2fpga.ir.Design`: host head, hardware, host tail.

The hardware part is executed by an engine: the golden model by default, or any function
``(dataflow, x_int) -> y_int`` (the RTL simulation, a board). The host parts always run in
numpy, one sample at a time, because the model's batch dimension is bound to 1.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from ..ir.dataflow import Design
from . import golden, host

__all__ = ["stack_inputs", "accepted_layouts", "run_head", "run_tail", "run_design",
           "first_bad_element"]


def first_bad_element(x: np.ndarray, allow_inf: bool = True) -> str | None:
    """Where the first NaN (and, unless ``allow_inf``, infinity) of a batch ``x`` stacked
    along axis 0 is, as ``"sample K, element [i, j] (flat index F) is nan"``; None if there
    is none. Integer arrays have none."""
    if not np.issubdtype(x.dtype, np.floating) and not np.issubdtype(x.dtype,
                                                                      np.complexfloating):
        return None
    bad = np.isnan(x) if allow_inf else ~np.isfinite(x)
    if not bad.any():
        return None
    first = np.unravel_index(int(np.argmax(bad.reshape(-1))), x.shape)
    sample, element = int(first[0]), tuple(int(i) for i in first[1:])
    flat = int(np.ravel_multi_index(element, x.shape[1:])) if element else 0
    count = int(bad.sum())
    more = f" ({count} such elements in all)" if count > 1 else ""
    return (f"sample {sample}, element [{', '.join(map(str, element))}] (flat index {flat}) "
            f"is {x[first]}{more}")


def stack_inputs(design: Design, x) -> tuple:
    """Check a batch of model inputs; return it as ``(batch, *input_shape)`` and whether the
    caller stacked samples on a new axis (True) or concatenated them along the batch axis.

    ``x`` holds samples stacked along axis 0: shape ``(batch, *input_shape)``; when the
    model's batch dimension is 1, ``(batch, *input_shape[1:])`` is accepted too (and the
    outputs then come back without their batch dimension of 1). ``x`` may also be a dict
    holding that array under the input's name; a model of several inputs takes a dict of one
    such array per input name (the same batch and layout for all) and gets back a dict of
    ``(batch, *shape)`` arrays. A NaN is refused (:class:`~onnx2fpga.errors.InputError`
    naming its sample and element): it has no quantized value. Infinities saturate as
    onnxruntime's QuantizeLinear does.
    """
    names = [d["name"] for d in design.inputs]
    if isinstance(x, dict):
        if sorted(map(str, x)) != sorted(names):
            raise InputError(f"Inputs must be named {', '.join(map(repr, names))}, not "
                             f"{', '.join(map(repr, x)) or 'none'}")
    elif len(names) > 1:
        raise InputError(f"The model has {len(names)} inputs ({', '.join(map(repr, names))}): "
                         f"pass a dict (a .npz file) of one array per input name")
    else:
        x = {names[0]: x}
    out = {}
    for spec in design.inputs:
        out[spec["name"]] = _stack_one(spec, x[spec["name"]])
    layouts = {stacked for _, stacked in out.values()}
    batches = {len(v) for v, _ in out.values()}
    if len(layouts) > 1 or len(batches) > 1:
        raise InputError(f"Inputs {', '.join(map(repr, names))} must hold the same number of "
                         f"samples in the same layout, not shapes "
                         f"{', '.join(str(tuple(np.shape(x[n]))) for n in names)}")
    if len(names) == 1:
        return out[names[0]]
    return {n: v for n, (v, _) in out.items()}, layouts.pop()


def _stack_one(spec: dict, x) -> tuple[np.ndarray, bool]:
    shape = tuple(spec["shape"])
    x = np.asarray(x)
    dtype = np.dtype(spec["dtype"])
    if x.dtype != dtype and not (np.issubdtype(dtype, np.floating)
                                 and np.issubdtype(x.dtype, np.floating)):
        raise InputError(f"Input {spec['name']!r} must have dtype {dtype.name}, not "
                         f"{x.dtype.name}")
    if x.ndim == len(shape) + 1 and x.shape[1:] == shape:
        stacked = True
    elif shape and shape[0] == 1 and x.ndim == len(shape) and x.shape[1:] == shape[1:]:
        x, stacked = x.reshape((x.shape[0],) + shape), False
    else:
        raise InputError(f"Input {spec['name']!r} must be stacked as "
                         f"{' or '.join(accepted_layouts(shape))}, not {tuple(x.shape)}")
    x = x.astype(dtype, copy=False)
    bad = first_bad_element(x)
    if bad is not None:
        raise InputError(f"Input {spec['name']!r}: {bad}; NaN has no quantized value")
    return x, stacked


def accepted_layouts(shape) -> list[str]:
    """The layouts a batch of inputs of model shape ``shape`` may take, as text:
    ``(batch, 1, 64)``, and ``(batch, 64)`` too when the batch dimension is 1."""
    shape = tuple(shape)
    out = [f"({', '.join(['batch'] + [str(d) for d in shape])})"]
    if shape and shape[0] == 1:
        out.append(f"({', '.join(['batch'] + [str(d) for d in shape[1:]])})")
    return out


def run_head(design: Design, x_stacked) -> np.ndarray:
    """Model inputs ``(batch, *shape)`` (a dict of them by name for several inputs, as
    :func:`stack_inputs` gives) to the accelerator's input integers ``(batch, n)``."""
    xs = x_stacked if isinstance(x_stacked, dict) else {design.inputs[0]["name"]: x_stacked}
    port = design.dataflow.input
    batch = len(next(iter(xs.values())))
    out = np.empty((batch, port.size), dtype=np.int64)
    for k in range(batch):
        env = host.run_nodes(design.head, {n: v[k] for n, v in xs.items()},
                             design.constants)
        out[k] = np.asarray(env[port.name]).reshape(-1)
    return out


def run_tail(design: Design, y_int: np.ndarray) -> dict[str, np.ndarray]:
    """Accelerator output integers ``(batch, n)`` to every model output, ``{name: (batch,
    *shape)}`` in the order of the graph's outputs."""
    port = design.dataflow.output
    outs = {spec["name"]: [] for spec in design.outputs}
    for row in np.asarray(y_int, dtype=np.int64):
        value = row.reshape(port.shape)
        env = host.run_nodes(design.tail, {port.name: value}, design.constants)
        for name, values in outs.items():
            values.append(np.asarray(env[name]))
    return {spec["name"]: (np.stack(outs[spec["name"]]) if outs[spec["name"]] else
                           np.zeros((0, *spec["shape"]))).astype(np.dtype(spec["dtype"]))
            for spec in design.outputs}


def run_design(design: Design, x, engine=None, stacked: bool | None = None):
    """The model's outputs for a batch of inputs, the hardware part run by ``engine``: one
    array for a model with one output, else a dict of arrays by output name."""
    xs, was_stacked = stack_inputs(design, x)
    q = run_head(design, xs)
    y_int = (engine or golden.run_dataflow)(design.dataflow, q)
    ys = run_tail(design, y_int)
    if stacked is None:
        stacked = was_stacked
    if not stacked:
        ys = {spec["name"]: ys[spec["name"]].reshape((-1,) + tuple(spec["shape"][1:]))
              if spec["shape"] and spec["shape"][0] == 1 else ys[spec["name"]]
              for spec in design.outputs}
    return ys[design.outputs[0]["name"]] if len(design.outputs) == 1 else ys
