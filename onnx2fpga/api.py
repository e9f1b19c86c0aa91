"""The Python API: compile a model, simulate the design, build a bitstream.

>>> design = onnx2fpga.compile("mlp.onnx", "out/", calibration=x_cal)   # doctest: +SKIP
>>> y = design.simulate(x, engine="rtl")                                 # doctest: +SKIP
>>> report = design.build("icebreaker")                                  # doctest: +SKIP

A design directory holds ``top.v`` (the accelerator), ``manifest.json`` (ports, element
order, widths, scales and zero points, the partition between host and hardware, per-layer
parallelism and cycle figures), ``design.json`` + ``design.npz`` (everything needed to run
the model again without the ONNX file) and ``report.html`` + ``report.md`` (the same figures
to look at, :mod:`onnx2fpga.report`; refreshed by every build).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

from . import __version__
from .errors import CalibrationError, DesignDirError, OptionError
from .ir import DenseLayer, Design, load_design, product_mapping, save_design
from .report import write_report

__all__ = ["compile", "load", "CompiledDesign", "progress"]

_FILES = ("top.v", "manifest.json", "design.json", "design.npz")


def progress(msg: str) -> None:
    """Progress lines go to stderr so that ``--json`` output on stdout stays clean."""
    print(f"[onnx2fpga] {msg}", file=sys.stderr, flush=True)


def _check_samples(graph, x, what: str) -> np.ndarray:
    name = graph.inputs[0]
    info = graph.tensors[name]
    shape = tuple(info.shape)
    x = np.asarray(x)
    want = f"({', '.join(['batch'] + [str(d) for d in shape])}) {info.dtype}"
    if not np.issubdtype(x.dtype, np.floating):
        raise CalibrationError(f"{what} must be {want}, not {tuple(x.shape)} {x.dtype.name}")
    if x.ndim == len(shape) + 1 and x.shape[1:] == shape:
        pass
    elif shape and shape[0] == 1 and x.ndim == len(shape) and x.shape[1:] == shape[1:]:
        x = x.reshape((x.shape[0],) + shape)
    else:
        raise CalibrationError(f"{what} must be {want}, not {tuple(x.shape)} {x.dtype.name}")
    if len(x) == 0:
        raise CalibrationError(f"{what} is empty")
    if not np.all(np.isfinite(x)):
        raise CalibrationError(f"{what} contains NaN or infinite values")
    return x.astype(np.dtype(info.dtype))


def _prepare_dir(output_dir, force: bool) -> str:
    out = os.path.abspath(os.fspath(output_dir))
    if os.path.exists(out):
        if not os.path.isdir(out):
            raise DesignDirError(f"{out}: exists and is not a directory")
        if os.listdir(out) and not force:
            raise DesignDirError(f"{out}: directory is not empty (use --force to overwrite)")
    return out


def compile(model, output_dir=None, *, calibration=None, lenient: bool = False,  # noqa: A001
            force: bool = False, weight_bits: int = 8, activation_bits: int = 8,
            per_channel: bool = True, max_lanes: int | None = None,
            folding: dict | None = None, multiplier_bits: int | None = None,
            board: str | None = None, target_fps: float | None = None,
            clock_mhz: float | None = None, utilization: float = 0.8,
            verbose: bool = False) -> CompiledDesign:
    """Compile an ONNX model into a design directory.

    Parameters
    ----------
    model : path or onnx.ModelProto
    output_dir : path, optional
        Where to write the design; a new temporary directory if omitted. An existing
        non-empty directory is refused unless ``force``.
    calibration : array or path to .npy, optional
        A batch of real inputs (stacked along axis 0) for post-training quantization of a
        float model. Ignored, with a warning, for models that are already quantized.
    lenient : bool
        Accept the common exporter deviations from the ONNX spec (see ``frontend.load``).
    weight_bits, activation_bits, per_channel : quantization of float models.
    max_lanes : int, optional
        Budget of multiply lanes (sum of simd*pe over layers) for automatic folding; 8 by
        default when neither ``board`` nor ``target_fps`` is given, otherwise no budget.
    folding : dict, optional
        ``{layer_name: {"simd": s, "pe": p, "lanes": l, "multipliers": "lut" or "dsp"}}``
        overrides (``multipliers`` of a dense or convolution layer: its products in LUTs or
        in hard multipliers; a board's folding leaves an overridden layer's choice alone).
    board : str, optional
        Fold for this board (``"ulx3s-85f"``...): the fastest design whose estimated
        resources (:mod:`onnx2fpga.hw.resources`, with the board wrapper) fit the device, LUTs,
        flip-flops and hard multipliers within ``utilization`` of what it has, block RAM
        within all of it (memories move into soft logic and products into LUTs when those
        run out; the manifest's ``folding`` lists them). On an iCE40 board, MatVec products
        may take the device's SB_MAC16s (``Dataflow.ice40_dsps``); without a board an
        iCE40 build makes every product in LUTs.
    target_fps, clock_mhz : float, optional
        Fold for a rate instead: the cheapest design that reaches ``target_fps`` inferences per
        second at ``clock_mhz`` (both needed; with ``board`` it must also fit).
    utilization : float
        Share of the device's LUTs and flip-flops a ``board`` fold may use (routing margin).
    multiplier_bits : int, optional
        Significant bits of requantization multipliers. By default 24 for models quantized
        elsewhere (the golden model then agrees with onnxruntime within one LSB) and 16 for
        our own calibration (the golden model is the only definition; cheaper hardware).

    Raises
    ------
    Onnx2FpgaError
        For every problem with the model, the options or the directory; nothing is written
        to ``output_dir`` before all checks pass.
    """
    import warnings

    from .frontend.finn import normalize_finn
    from .frontend.fold import fold
    from .frontend.load import load_model
    from .frontend.lower import lower
    from .frontend.qdq import normalize_qdq
    from .frontend.qonnx import normalize_qonnx
    from .frontend.qop import normalize_qoperators
    from .frontend.quantize import (
        fold_constants,
        is_quantized,
        quantize_float_inputs,
        quantize_graph,
    )
    from .frontend.resolve import resolve_geometry
    from .hw.emit import emit_verilog
    from .sim.model import run_design

    t0 = time.monotonic()
    fold_options = _fold_options(board, target_fps, clock_mhz, utilization, max_lanes,
                                 pinned={name for name, o in (folding or {}).items()
                                         if isinstance(o, dict) and "multipliers" in o})
    out = _prepare_dir(output_dir, force) if output_dir is not None else None
    say = progress if verbose else (lambda msg: None)
    say("loading and checking the model")
    graph = load_model(model, lenient=lenient)
    normalize_qoperators(graph)
    normalize_finn(graph)       # FINN MultiThreshold activations: quantizers by thresholds
    normalize_qdq(graph)
    normalize_qonnx(graph)      # QONNX quantizers and QCDQ Clips into the same QDQ form
    fold_constants(graph)       # computed constants (a Pow of two initializers, ...)
    resolve_geometry(graph)
    float_graph = None
    quant_info = {"source": "qdq"}
    if isinstance(calibration, (str, os.PathLike)):
        try:
            calibration = np.load(calibration, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise CalibrationError(f"{calibration}: cannot read calibration data: "
                                   f"{e}") from None
    if is_quantized(graph):
        if calibration is not None:
            samples = _check_samples(graph, calibration, "Calibration data")
            quantized_inputs = quantize_float_inputs(graph, samples,
                                                     activation_bits=activation_bits)
            if quantized_inputs:
                say(f"quantized the float inputs of {', '.join(quantized_inputs)} at "
                    f"{activation_bits} bits from {len(samples)} calibration samples")
                quant_info["float_inputs_quantized"] = {
                    "tensors": quantized_inputs, "activation_bits": activation_bits,
                    "calibration_samples": int(len(samples))}
            else:
                warnings.warn("the model is already quantized; calibration data is not used",
                              stacklevel=2)
    else:
        if calibration is None:
            raise CalibrationError(
                f"Graph {graph.name!r} is a float model: pass calibration data "
                f"(--calibration X.npy, a batch of real inputs) to quantize it")
        samples = _check_samples(graph, calibration, "Calibration data")
        say(f"calibrating on {len(samples)} samples")
        float_graph = copy.deepcopy(graph)
        quantize_graph(graph, samples, weight_bits=weight_bits,
                       activation_bits=activation_bits, per_channel=per_channel)
        quant_info = {"source": "calibration", **graph.metadata["quantization"]}
    if multiplier_bits is None:
        multiplier_bits = 24 if quant_info["source"] == "qdq" else 16
    quant_info["multiplier_bits"] = multiplier_bits
    say("lowering to integer layers")
    design = lower(graph, multiplier_bits=multiplier_bits)
    if board is not None:
        from .boards.targets import get_board
        target = get_board(board)
        if target.family == "ice40":
            # MatVec products may take the device's SB_MAC16s (registered at both ends),
            # within the utilization as every other resource.
            design.dataflow.ice40_dsps = int(target.limits.dsp * utilization)
    say("choosing the folding" + (f" for {board}" if board else ""))
    fold(design.dataflow, overrides=folding, **fold_options)
    design.dataflow.folding_info.update(
        {"board": board, "target_fps": target_fps, "clock_mhz": clock_mhz,
         "utilization": utilization if board else None})
    if float_graph is not None:
        from .sim import host
        points = _layer_float_points(design.dataflow, graph, float_graph)
        keep = {float_graph.outputs[0]} | {p[0] for p in points.values()}
        envs = []                      # only the tensors compared, not every intermediate
        for s in samples:
            env = host.run_nodes(float_graph.nodes, {float_graph.inputs[0]: s},
                                 float_graph.constants)
            envs.append({t: env[t] for t in keep})
        ref = np.stack([env[float_graph.outputs[0]] for env in envs])
        quant_info["layers"] = _layer_errors(design, samples, points, envs)
        del envs
        got = run_design(design, samples, stacked=True)
        err = np.abs(got.astype(np.float64) - ref.astype(np.float64))
        quant_info["calibration_max_abs_error"] = float(err.max())
        quant_info["calibration_mean_abs_error"] = float(err.mean())
        if ref.ndim >= 2 and ref.shape[-1] > 1:
            agree = np.argmax(got.reshape(len(got), -1), 1) == np.argmax(
                ref.reshape(len(ref), -1), 1)
            quant_info["calibration_argmax_agreement"] = float(agree.mean())
    say("generating Verilog")
    verilog = emit_verilog(design.dataflow, name="top")
    manifest = make_manifest(design, verilog, quant_info)
    if out is None:
        out = tempfile.mkdtemp(prefix="onnx2fpga-")
    elif os.path.isdir(out) and os.listdir(out):
        for name in os.listdir(out):  # --force: replace what was there
            path = os.path.join(out, name)
            shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) \
                else os.remove(path)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "top.v"), "w") as f:
        f.write(verilog)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.write("\n")
    save_design(design, os.path.join(out, "design.json"), os.path.join(out, "design.npz"))
    write_report(out)
    say(f"wrote {out} in {time.monotonic() - t0:.1f} s")
    return CompiledDesign(out, design, manifest)


def _fold_options(board, target_fps, clock_mhz, utilization, max_lanes,
                  pinned=frozenset()) -> dict:
    """Check the folding options; the keyword arguments of :func:`frontend.fold.fold`.
    ``pinned``: the layers whose multipliers the user chose."""
    if (target_fps is None) != (clock_mhz is None):
        raise OptionError("target_fps and clock_mhz go together: the rate in inferences per "
                          "second and the clock in MHz it is reached at")
    for name, v in (("target_fps", target_fps), ("clock_mhz", clock_mhz)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                              or not v > 0):
            raise OptionError(f"{name} must be a positive number, not {v!r}")
    if isinstance(utilization, bool) or not isinstance(utilization, (int, float)) \
            or not 0 < utilization <= 1:
        raise OptionError(f"utilization must be a number in (0, 1], not {utilization!r}")
    opts = {"max_lanes": max_lanes if max_lanes is not None or board or target_fps else 8}
    if target_fps is not None:
        cycles = int(clock_mhz * 1e6 // target_fps)
        if cycles < 1:
            raise OptionError(f"target_fps {target_fps} at {clock_mhz} MHz leaves less than "
                              f"one cycle per inference")
        opts["target_cycles"] = cycles
    if board is not None:
        from .boards.targets import get_board
        target = get_board(board)       # UnknownBoardError names the boards there are
        opts["fits"] = _device_check(target, utilization, pinned)
    return opts


def _cells(res: dict) -> int:
    """Logic cells of an estimate: LUTs plus half the flip-flops (an iCE40 logic cell holds
    one of each; flip-flops that do not pack with their LUT take cells of their own)."""
    return res["lut"] + res["ff"] // 2


def _cheapest_cover(items, need: int) -> list:
    """Names of the ``(name, size, cost)`` items whose sizes add up to at least ``need`` at
    the least total cost (0/1 knapsack by dynamic programming over ``need``; ties: fewer
    items, then names in order). All of them if even that is not enough."""
    if need <= 0:
        return []
    items = sorted(items)
    if sum(size for _, size, _ in items) < need:
        return [name for name, _, _ in items]
    inf = float("inf")
    best = [(0, 0, ())] + [(inf, 0, ())] * need     # (cost, count, names) to free >= e
    for name, size, cost in items:
        for e in range(need, 0, -1):
            c, k, names = best[max(0, e - size)]
            cand = (c + cost, k + 1, names + (name,))
            if cand[:2] < best[e][:2]:
                best[e] = cand
    return list(best[need][2])


def _device_check(target, utilization: float, pinned=frozenset()):
    """``fits(dataflow)`` for :func:`frontend.fold.fold`: ``None`` if the estimated resources
    of the design plus the board wrapper fit ``target``'s device, otherwise what overflows.

    When the hard multipliers overflow, layers move their products into LUTs
    (``multipliers = "lut"``), those with the most multipliers first (the fewest layers
    change), until the multipliers fit; layers in ``pinned`` keep the user's choice. When
    the block RAMs overflow, memories move into soft logic (``dataflow.logic_memories``):
    the set that frees enough block RAMs for the fewest logic cells (:func:`_cheapest_cover`).
    The plan then fits if its LUTs and flip-flops do too."""
    from .hw.resources import dataflow_resources, logic_cost

    lim = target.limits
    # Hard multipliers within `utilization` too: the jet tagger and the digits example with
    # 154 of the ECP5 85F's 156 MULT18X18D closed timing at only 49 and 57 MHz (paths through
    # DSPs placed far apart), against 90 to 130 MHz for designs using a third of them.
    caps = {"lut": int(lim.lut * utilization), "ff": int(lim.ff * utilization),
            "dsp": int(lim.dsp * utilization), "bram": lim.bram}
    if target.family == "ice40":
        caps["logic cells"] = int(lim.lut * utilization)

    def overflow(res):
        total = dict(res["board"])
        if target.family == "ice40":
            # The device limit is on logic cells. Measured on the digits example: 4,183
            # cells = 3,324 LUTs + 0.48 x 1,808 flip-flops.
            total["logic cells"] = _cells(total)
        return [f"{k} {total[k]} > {cap}" for k, cap in caps.items() if total.get(k, 0) > cap]

    def fits(df):
        res = dataflow_resources(df, target.family, wrapper=True, memories=True)
        over = overflow(res)
        if over and res["board"]["dsp"] > caps["dsp"]:
            by_name = {ly.name: ly for ly in df.layers}
            movable = sorted((lr for lr in res["layers"] if lr["dsp"] > 0
                              and lr["name"] not in pinned
                              and product_mapping(by_name[lr["name"]]) == "dsp"),
                             key=lambda lr: (-lr["dsp"], lr["name"]))
            excess = res["board"]["dsp"] - caps["dsp"]
            for lr in movable:
                if excess <= 0:
                    break
                by_name[lr["name"]].multipliers = "lut"
                excess -= lr["dsp"]
            if movable:
                res = dataflow_resources(df, target.family, wrapper=True, memories=True)
                over = overflow(res)
        if over and res["board"]["bram"] > caps["bram"]:
            # Block RAMs run out: the memories to move into soft logic are the set that
            # frees enough block RAMs for the fewest logic cells (a knapsack over the
            # block RAMs still missing).
            moved = _cheapest_cover(
                [(mem[0], mem[1], _cells(logic_cost(*mem[:1], *mem[2:])))
                 for mem in res["block_memories"]],
                res["board"]["bram"] - caps["bram"])
            df.logic_memories = sorted(df.logic_memories + moved)
            over = overflow(dataflow_resources(df, target.family, wrapper=True))
        return "; ".join(over) or None
    return fits


def _folding_json(df, bottleneck) -> dict:
    """How the folding was chosen and what stopped it from going faster (each layer's
    parallelism is in its own entry)."""
    info = {k: v for k, v in sorted(df.folding_info.items()) if v is not None}
    return {**info, "bottleneck": bottleneck}


def _layer_float_points(dataflow, graph, float_graph) -> dict:
    """Layer name -> ``(float tensor, scale, zero point)``: where a layer's integer output
    stands for a tensor of the float model. Our quantizer names the ``QuantizeLinear`` of
    tensor ``t`` ``t__quant`` and lowering records it among the layer's nodes; a layer whose
    output no quantizer writes (a view: wires only) has no entry."""
    quant = {n.name: n for n in graph.nodes if n.op == "QuantizeLinear"}
    points = {}
    for layer in dataflow.layers:
        for name in layer.nodes:
            q = quant.get(name)
            if q is None or q.outputs[0] != layer.output or name != f"{q.inputs[0]}__quant":
                continue
            if q.inputs[0] not in float_graph.tensors:
                continue
            points[layer.name] = (q.inputs[0], np.asarray(q.attrs["scale"], np.float64),
                                  np.asarray(q.attrs["zero_point"], np.int64))
            break
    return points


def _layer_errors(design, samples, points: dict, envs: list) -> list[dict]:
    """Per layer with a float counterpart: the max and mean absolute error of its dequantized
    golden-model output against the float model's tensor, over the calibration samples."""
    from .sim import golden
    from .sim.model import run_head, stack_inputs

    xs, _ = stack_inputs(design, samples)
    trace: dict = {}
    golden.run_dataflow(design.dataflow, run_head(design, xs), trace)
    out = []
    for layer in design.dataflow.layers:
        if layer.name not in points:
            continue
        tensor, scale, zp = points[layer.name]
        q = trace[layer.name].astype(np.int64)
        if scale.size > 1:             # per channel: along axis 0 of the logical tensor
            shape = (1, -1) + (1,) * (q.ndim - 2)
            scale, zp = scale.reshape(shape), zp.reshape(shape)
        real = (q - zp).astype(np.float64) * scale
        ref = np.stack([np.asarray(env[tensor], np.float64) for env in envs])
        err = np.abs(real.reshape(len(q), -1) - ref.reshape(len(ref), -1))
        out.append({"name": layer.name, "tensor": tensor,
                    "scale": [float(v) for v in scale.reshape(-1)] if scale.size > 1
                    else float(scale), "zero_point": [int(v) for v in zp.reshape(-1)]
                    if zp.size > 1 else int(zp), "max_abs_error": float(err.max()),
                    "mean_abs_error": float(err.mean())})
    return out


def _element_order(port) -> str:
    from .frontend.ir import logical_shape
    from .hw.graph import hwc_order

    if port.order is None:
        return "C order (row-major) over shape, batch dimension bound to 1"
    shape = logical_shape(port.shape)
    hwc = hwc_order(shape)
    if hwc is not None and np.array_equal(port.order, hwc):
        dims = "H, W, C" if len(shape) == 3 else "W, C"
        return (f"channels-last: row-major over ({dims}) of the NCHW tensor, batch dimension "
                f"bound to 1 (stream position p holds C-order element order[p])")
    return "permuted: stream position p holds C-order element order[p] (see design.npz)"


def _port_json(port) -> dict:
    return {
        "tensor": port.name, "shape": list(port.shape),
        "element_order": _element_order(port),
        "type": port.type.name, "bits": port.type.bits, "signed": port.type.signed,
        "scale": port.scale, "zero_point": port.zero_point,
        "lanes": port.lanes, "tdata_width": port.tdata_width, "beats": port.beats,
        "packing": "element j of a beat at tdata bits [j*bits, (j+1)*bits), little-endian",
        "tlast": "high on the last beat of each tensor",
    }


def _stage_json(st) -> dict:
    from .ir import ThresholdStage

    if isinstance(st, ThresholdStage):
        return {"thresholds": int(st.thresholds.shape[1]), "per_channel": st.per_element,
                "base": st.base, "step": st.step, "clip": [st.lo, st.hi]}
    return {"shift": st.shift,
            "multiplier_bits": int(max(int(np.abs(st.multiplier).max()), 1)).bit_length(),
            "per_channel": bool(st.per_element), "zero_point": st.zero_point,
            "clip": [st.lo, st.hi], "rounding": st.rounding,
            "leaky": st.neg_multiplier is not None}


def _layer_json(ly, figures: dict, fifo_after: int) -> dict:
    """One layer's manifest entry: what it computes, its folding and its figures."""
    from .ir import AddLayer, ConcatLayer, ConvLayer, PoolLayer, ViewLayer

    entry = {
        "name": ly.name, "kind": ly.kind, "onnx_nodes": list(ly.nodes),
        "inputs": list(ly.inputs), "output": ly.output,
        "in_shapes": [list(s) for s in ly.in_shapes], "out_shape": list(ly.out_shape),
        "in_size": ly.in_size, "out_size": ly.out_size,
        "in_type": ly.in_type.name, "out_type": ly.out_type.name,
        "cycles": figures["cycles"], "latency_cycles": figures["latency"],
        "bottleneck": figures["bottleneck"], "fifo_depth_after": fifo_after,
    }
    if "reorder_cycles" in figures:
        entry["reorder_cycles"] = figures["reorder_cycles"]
    if isinstance(ly, ViewLayer):
        entry["perm"] = list(ly.perm) if ly.perm is not None else None
        return entry
    entry.update({"in_lanes": ly.in_lanes, "out_lanes": ly.out_lanes})
    stages = list(getattr(ly, "requant", []))
    if isinstance(ly, ConcatLayer):
        stages = [st for sts in ly.requant for st in sts]
    entry["requant"] = [_stage_json(st) for st in stages]
    if isinstance(ly, DenseLayer):
        entry.update({"in_features": ly.in_features, "out_features": ly.out_features,
                      "simd": ly.simd, "pe": ly.pe, "multipliers": ly.multipliers,
                      "weight_type": ly.weight_type.name,
                      "acc_type": ly.acc_type.name, "in_zero_point": ly.in_zero_point,
                      "weight_memory_bits": int(ly.weight.size * ly.weight_type.bits),
                      "macs": int(ly.weight.size)})
    elif isinstance(ly, ConvLayer):
        pixels = ly.out_hw[0] * ly.out_hw[1]
        entry.update({"kernel": list(ly.kernel), "stride": list(ly.stride),
                      "dilation": list(ly.dilation), "pads": list(ly.pads), "group": ly.group,
                      "depthwise": ly.depthwise, "lanes": ly.lanes, "simd": ly.simd,
                      "pe": ly.pe, "multipliers": ly.multipliers,
                      "weight_type": ly.weight_type.name,
                      "acc_type": ly.acc_type.name, "in_zero_point": ly.in_zero_point,
                      "weight_memory_bits": int(ly.weight.size * ly.weight_type.bits),
                      "macs": int(ly.weight.size * pixels)})
    elif isinstance(ly, PoolLayer):
        entry.update({"op": ly.op, "kernel": list(ly.kernel), "stride": list(ly.stride),
                      "dilation": list(ly.dilation), "pads": list(ly.pads),
                      "global": ly.is_global})
    elif isinstance(ly, AddLayer):
        entry.update({"in_zero_points": ly.in_zero_points,
                      "multipliers": [int(m[0]) for m in ly.multipliers]})
    elif isinstance(ly, ConcatLayer):
        entry["axis"] = ly.axis
    return entry


def _streams_json(df, plan) -> dict:
    """Every tensor crossing a stream inside the accelerator: who writes it, its element
    order, lanes and element type (as the producer's net carries it)."""
    from .frontend.ir import logical_shape
    from .hw.graph import hwc_order

    shapes = {df.input.name: logical_shape(df.input.shape)}
    producers = {df.input.name: "s_axis"}
    for ly in df.layers:
        shapes[ly.output] = tuple(ly.out_shape)
        producers[ly.output] = ly.name
    out = {}
    for tensor, net in plan.tensor_nets.items():
        type_, lanes, size = plan.nets[net]
        order = plan.orders.get(tensor)
        if order is None:
            label = "C order"
        elif np.array_equal(order, hwc_order(shapes[tensor])):
            label = "channels-last"
        else:
            label = "permuted"
        out[tensor] = {"producer": producers[tensor], "order": label, "lanes": int(lanes),
                       "type": type_.name, "size": int(size)}
    return out


def make_manifest(design: Design, verilog: str, quant_info: dict) -> dict:
    from .hw import cost
    from .hw.graph import plan_graph

    df = design.dataflow
    plan = plan_graph(df)
    figures = cost.dataflow_cycles(df, plan)
    per_layer = {f["name"]: f for f in figures["layers"]}
    layers = [_layer_json(ly, per_layer[ly.name], df.fifo_depths[k])
              for k, ly in enumerate(df.layers)]
    resources = _resources_json(df)
    for k, entry in enumerate(layers):
        entry["resources"] = {fam: {key: v for key, v in r["layers"][k].items() if key != "name"}
                              for fam, r in resources.items()}
    hw_nodes = [n for ly in df.layers for n in ly.nodes]
    bottleneck = [f["name"] for f in figures["layers"] if f["bottleneck"]]
    return {
        "format": "onnx2fpga-manifest", "version": 1, "onnx2fpga_version": __version__,
        "top": {"module": "top", "file": "top.v", "clock": "clk", "reset": "rst (synchronous, "
                "active high)", "verilog_sha256": hashlib.sha256(verilog.encode()).hexdigest()},
        "model": {k: v for k, v in design.metadata.items()},
        "inputs": design.inputs, "outputs": design.outputs,
        "ports": {"s_axis": _port_json(df.input), "m_axis": _port_json(df.output)},
        "partition": {
            "host_head": [n.name or n.outputs[0] for n in design.head],
            "hardware": hw_nodes,
            "host_tail": [n.name or n.outputs[0] for n in design.tail],
        },
        "layers": layers,
        "edge_fifos": dict(sorted(df.edge_fifos.items())),
        "streams": _streams_json(df, plan),
        "bottleneck": bottleneck,
        "folding": _folding_json(df, bottleneck),
        "cycles_per_inference": figures["cycles_per_inference"],
        "latency_cycles": figures["latency_cycles"],
        "quantization": quant_info,
        "resources": {fam: {key: r[key] for key in ("total", "edges", "wrapper", "board")}
                      for fam, r in resources.items()},
    }


def _resources_json(df) -> dict:
    """:func:`~onnx2fpga.hw.resources.dataflow_resources` for iCE40 and ECP5 (estimates before
    synthesis: DSPs and block RAMs as yosys infers them, LUTs and FFs from a fitted model)."""
    from .hw import resources

    return {fam: resources.dataflow_resources(df, fam, wrapper=True)
            for fam in resources.FAMILIES}


class CompiledDesign:
    """A compiled design directory: simulate it, build it for a board.

    Attributes
    ----------
    directory : str
    design : onnx2fpga.ir.Design
    manifest : dict
    last_run : dict or None
        Figures of the last RTL simulation (``cycles_per_inference``, ``latency_cycles``).
    """

    def __init__(self, directory, design: Design, manifest: dict):
        self.directory = os.fspath(directory)
        self.design = design
        self.manifest = manifest
        self.last_run = None

    @property
    def verilog_path(self) -> str:
        return os.path.join(self.directory, "top.v")

    def simulate(self, x, engine: str = "rtl", *, stall_in: float = 0.3,
                 stall_out: float = 0.3, seed: int = 0, progress: bool = False) -> np.ndarray:
        """Run the model on a batch ``x`` (stacked along axis 0) and return its outputs.

        ``engine="golden"`` runs the integer golden model; ``"rtl"`` runs the emitted Verilog
        in Verilator through cocotb with random stalls on both AXI-Stream sides (then
        ``last_run`` holds the measured cycles). Host parts run in numpy in both cases.
        """
        from .sim.model import run_design

        if engine == "golden":
            return run_design(self.design, x)
        if engine != "rtl":
            raise ValueError(f"engine must be 'rtl' or 'golden', not {engine!r}")
        from .sim.rtl import simulate_rtl

        def rtl_engine(dataflow, x_int):
            res = simulate_rtl(self.verilog_path, dataflow.input, dataflow.output, x_int,
                               toplevel="top",
                               build_dir=os.path.join(self.directory, "sim_build"),
                               stall_prob_in=stall_in, stall_prob_out=stall_out, seed=seed,
                               max_cycles_per_inference=10_000 + 4 * int(
                                   self.manifest["latency_cycles"]),
                               progress=progress)
            self.last_run = {"cycles_per_inference": res.cycles_per_inference,
                             "latency_cycles": res.latency_cycles,
                             "total_cycles": res.total_cycles, "inferences": len(x_int)}
            return res.outputs

        return run_design(self.design, x, engine=rtl_engine)

    def build(self, board: str, *, seed: int | list[int] | None = None, progress: bool = True,
              clock_mhz: float | None = None, baud: int = 115200,
              link: str | None = None) -> dict:
        """Build a bitstream for ``board``; writes ``build/<board>/report.json`` and returns
        it. A design that misses timing has ``timing_met`` false. The accelerator sits behind
        the framed host link (:mod:`onnx2fpga.boards.framed`), which answers HELLO with the
        manifest's ``verilog_sha256``.

        ``clock_mhz``: run the design at this frequency, made by the board's PLL (default: the
        board oscillator). ``baud``: the serial link's bit rate (the host runtime reads it from
        the report). ``link``: ``"uart"`` or ``"usb"`` (the board's own USB port as a CDC-ACM
        serial device; the OrangeCrab's default), ``None`` for the board's default. ``seed``:
        nextpnr's placement seed, or a list of seeds to place and route with, keeping the best
        run (see :func:`onnx2fpga.boards.build.build_bitstream`)."""
        from .boards.build import build_bitstream
        from .hw.top import Accelerator

        df = self.design.dataflow
        report = build_bitstream(lambda: Accelerator(df), df.input, df.output, board,
                                 os.path.join(self.directory, "build", board), seed=seed,
                                 progress=progress,
                                 cycles_per_inference=self.manifest["cycles_per_inference"],
                                 latency_cycles=self.manifest["latency_cycles"],
                                 design_id=self.manifest["top"]["verilog_sha256"],
                                 clock_mhz=clock_mhz, baud=baud, link=link,
                                 logic_memories=df.logic_memories)
        write_report(self.directory)      # now with this build's measured figures
        return report


def load(directory) -> CompiledDesign:
    """Open a design directory written by :func:`compile`."""
    d = os.fspath(directory)
    missing = [f for f in _FILES if not os.path.isfile(os.path.join(d, f))]
    if not os.path.isdir(d):
        raise DesignDirError(f"{d}: no such design directory")
    if missing:
        raise DesignDirError(f"{d}: not a design directory (missing {', '.join(missing)}); "
                             f"create one with 'onnx2fpga compile'")
    try:
        with open(os.path.join(d, "manifest.json")) as f:
            manifest = json.load(f)
        design = load_design(os.path.join(d, "design.json"), os.path.join(d, "design.npz"))
    except (OSError, ValueError, KeyError) as e:
        raise DesignDirError(f"{d}: design files are damaged ({e})") from None
    return CompiledDesign(d, design, manifest)

