"""A compile as named steps, each from one inspectable artifact to the next.

========== ============================================================ ====================
step       what it does                                                 what it leaves
========== ============================================================ ====================
load       load and check the ONNX model, normalize its quantized      ``graph``: the
           forms (QOperator, FINN, QDQ, QONNX), fold constants,         frontend graph
           resolve geometry
quantize   quantize a float model from calibration data (or the float  ``graph`` quantized,
           inputs of a quantized one)                                   ``quant_info``
lower      lower the quantized graph into integer layers, host head     ``design``
           and tail
fold       choose each layer's parallelism (for a board, a rate or a   ``design`` folded
           lane budget), the ports' lanes and the FIFO depths
evaluate   a float model's quantization error on the calibration data  ``quant_info``
emit       generate the Verilog (top module ``name``) and the manifest  ``verilog``,
                                                                        ``manifest``
========== ============================================================ ====================

:func:`onnx2fpga.compile` runs them all; with ``stop_after=STEP`` (``--stop-after STEP``)
it stops after that step and writes what the step produced (:func:`write_artifacts`):
``graph.json`` after ``load`` and ``quantize``, ``design.json`` + ``design.npz`` after
``lower``, ``fold`` and ``evaluate`` (and ``quantization.json``), the whole design directory
after ``emit``.

Sizes are checked as the expensive steps start (:class:`~onnx2fpga.errors.SizeError`):
``lower``, the memory lowering the model's constants takes against what the machine has
available (:func:`check_lowering`); ``fold``, the weights against the board, or without one
against the largest supported device (:func:`check_sizes`); ``emit``, the memory generating
the Verilog takes (:func:`check_machine`).
"""

from __future__ import annotations

import copy
import json
import math
import numbers
import os
import warnings
from dataclasses import dataclass, field

import numpy as np

from .arrays import read_arrays
from .devicefit import device_caps, use_engine
from .devicefit import overflow as overflow_of
from .designdir import (
    DEFAULT_MODULE,
    WEIGHT_IMAGE,
    check_interrupted,
    file_hashes,
    hashed_files,
)
from .errors import CalibrationError, OptionError, SizeError
from .ir import REQUANT_MODES
from .ir.dataflow import Design
from .ir.layers import product_mapping
from .ir.serialize import save_design
from .manifest import core_text, filelist_text, make_manifest
from .plan import devices
from .plan.cmvm import MAX_ADDER_LEVELS
from .plan.devices import FAMILIES, logic_cells
from .plan.layers import at_full_folding
from .plan.optimize import check_optimize
from .plan.spram import FLASH_OFFSET, SPRAM_BITS, SPRAM_WORDS
from .report import write_report
from .sim.model import accepted_layouts, first_bad_element

__all__ = [
    "STEPS", "Compilation", "run_steps", "write_artifacts", "graph_json", "check_samples",
    "check_options", "fold_options", "device_check", "cheapest_cover", "logic_cells",
    "check_sizes", "check_machine", "check_lowering", "available_memory", "NO_BOARD_MARGIN",
    "partition_text",
]

#: The steps of a compile, in order.
STEPS = ("load", "quantize", "lower", "fold", "evaluate", "emit")


def check_samples(graph, x, what: str) -> np.ndarray:
    name = graph.inputs[0]
    info = graph.tensors[name]
    shape = tuple(info.shape)
    x = np.asarray(x)
    want = f"{' or '.join(accepted_layouts(shape))} {info.dtype}"
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
    x = x.astype(np.dtype(info.dtype))
    bad = first_bad_element(x, allow_inf=False)
    if bad is not None:
        raise CalibrationError(f"{what}: {bad}; calibration needs finite values (the "
                               f"quantization ranges are taken from them)")
    return x


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def check_options(weight_bits, activation_bits, multiplier_bits, folding=None,
                  requant=None, adder_levels=None) -> None:
    """Check the quantization options and the values of the folding overrides before any
    work (which layers the overrides name, and whether their values divide the layers' sizes,
    is checked when folding). ``OptionError`` names the option and what it accepts: weights
    and activations of 2 to 16 bits (what our quantizer makes), multipliers of 2 to 32
    significant bits, overrides ``{layer: {"simd"|"pe"|"lanes": positive int, ...}}``
    (:func:`plan.fold.fold` checks the rest)."""
    for name, v in (("weight_bits", weight_bits), ("activation_bits", activation_bits)):
        if not _is_int(v) or not 2 <= v <= 16:
            raise OptionError(f"{name} must be an integer from 2 to 16, not {v!r}")
    if multiplier_bits is not None and (not _is_int(multiplier_bits)
                                        or not 2 <= multiplier_bits <= 32):
        raise OptionError(f"multiplier_bits must be an integer from 2 to 32, not "
                          f"{multiplier_bits!r}")
    if adder_levels is not None and (not _is_int(adder_levels)
                                     or not 1 <= adder_levels <= MAX_ADDER_LEVELS):
        raise OptionError(f"adder_levels must be an integer from 1 to {MAX_ADDER_LEVELS}, "
                          f"not {adder_levels!r}")
    if requant is not None and requant not in REQUANT_MODES:
        raise OptionError(f"requant must be one of {', '.join(REQUANT_MODES)}, not "
                          f"{requant!r}")
    if folding is None:
        return
    if not isinstance(folding, dict):
        raise OptionError(f"folding must map layer names to dicts, not {folding!r}")
    for layer, o in folding.items():
        if not isinstance(o, dict):
            raise OptionError(f"Folding of layer {layer!r} must be a dict of simd, pe, lanes "
                              f"or multipliers, not {o!r}")
        for key in ("simd", "pe", "lanes"):
            v = o.get(key, 1)
            if not _is_int(v) or v < 1:
                raise OptionError(f"Folding of layer {layer!r}: {key} must be a positive "
                                  f"integer, not {v!r}")


def default_utilization(board) -> float:
    """The folding utilization of ``board`` (a name, or None) unless the user gives one:
    :attr:`BoardTarget.utilization <onnx2fpga.boards.targets.BoardTarget.utilization>`."""
    from .boards.targets import DEFAULT_UTILIZATION, get_board
    if board is None:
        return DEFAULT_UTILIZATION[None]
    return get_board(board).utilization       # UnknownBoardError names the boards there are


def fold_options(board, target_fps, clock_mhz, utilization, max_lanes,
                  pinned=frozenset(), optimize="throughput", weights="auto",
                  architecture="auto", folding=None) -> dict:
    """Check the folding options; the keyword arguments of :func:`plan.fold.fold`.
    ``pinned``: the layers whose multipliers the user chose; ``optimize``: one of
    :data:`onnx2fpga.plan.optimize.OPTIMIZE`; ``weights``: one of
    :data:`onnx2fpga.plan.spram.WEIGHT_PLACES` (``"spram"`` needs a board with SPRAMs);
    ``architecture``: one of :data:`onnx2fpga.plan.engine.ARCHITECTURES`; ``folding``: the
    per-layer overrides, which the layer engine has no use for."""
    from .plan.engine import ARCHITECTURES
    from .plan.spram import WEIGHT_PLACES

    check_optimize(optimize)
    if architecture not in ARCHITECTURES:
        raise OptionError(f"architecture must be one of {', '.join(ARCHITECTURES)}, not "
                          f"{architecture!r}")
    if architecture == "engine":
        # The engine has one multiplier and no per-layer folding: these options would be
        # silently ignored.
        for what, v in (("folding", folding), ("max_lanes", max_lanes)):
            if v:
                raise OptionError(f"{what} sets the folding of a core per layer; the layer "
                                  f"engine (architecture 'engine') has one multiplier for "
                                  f"all layers: drop one of the two")
    if weights not in WEIGHT_PLACES:
        raise OptionError(f"weights must be one of {', '.join(WEIGHT_PLACES)}, not "
                          f"{weights!r}")
    if (target_fps is None) != (clock_mhz is None):
        raise OptionError("target_fps and clock_mhz go together: the rate in inferences per "
                          "second and the clock in MHz it is reached at")
    for name, v in (("target_fps", target_fps), ("clock_mhz", clock_mhz)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Real)
                              or not 0 < v < math.inf):
            raise OptionError(f"{name} must be a positive finite number, not {v!r}")
    if isinstance(utilization, bool) or not isinstance(utilization, numbers.Real) \
            or not 0 < utilization <= 1:
        raise OptionError(f"utilization must be a number in (0, 1], not {utilization!r}")
    if max_lanes is not None and (not _is_int(max_lanes) or max_lanes < 1):
        raise OptionError(f"max_lanes must be a positive integer, not {max_lanes!r}")
    opts = {"max_lanes": max_lanes if max_lanes is not None or board or target_fps else 8,
            "optimize": optimize}
    if target_fps is not None:
        cycles = int(clock_mhz * 1e6 // target_fps)
        if cycles < 1:
            raise OptionError(f"target_fps {target_fps} at {clock_mhz} MHz leaves less than "
                              f"one cycle per inference")
        opts["target_cycles"] = cycles
    if board is not None:
        from .boards.targets import get_board
        target = get_board(board)       # UnknownBoardError names the boards there are
        if target.family not in FAMILIES:
            raise OptionError(f"--board {target.name}: folding for a board needs resource "
                              f"estimates of its device, which exist for "
                              f"{' and '.join(FAMILIES)} only, not {target.family} "
                              f"({target.device}); compile without --board (or with "
                              f"--target-fps) and build for {target.name}")
        if weights == "spram" and not target.limits.spram:
            raise OptionError(f"weights='spram' needs a board whose device has SPRAMs (an "
                              f"iCE40 UltraPlus: icebreaker, icesugar), not {target.name} "
                              f"({target.device})")
        opts["fits"] = device_check(target, utilization, pinned, weights)
        opts["lut_budget"] = device_caps(target, utilization)[0]["lut"]
    elif weights == "spram":
        raise OptionError("weights='spram' needs a board whose device has SPRAMs (an iCE40 "
                          "UltraPlus: --board icebreaker or icesugar)")
    return opts


def cheapest_cover(items, need: int) -> list:
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


def spram_cover(df, res, excess: int, sprams: int) -> list:
    """The MatVec weight memories (``"stage/w_mem"``) to move from block RAM into ``sprams``
    SPRAMs to free ``excess`` block RAMs: the largest first, each that fits beside the
    others (:func:`onnx2fpga.plan.spram.place_weights`), until enough are freed or none
    fits; ``res`` is the design's estimate with ``memories``."""
    from .plan.graph import plan_graph
    from .plan.spram import place_weights, weight_memories

    cells = {b[0]: b[1] for b in res["block_memories"]}
    mems = [m for m in weight_memories(plan_graph(df).stages) if cells.get(m[0], 0) > 0]
    for n in range(1, len(mems) + 1):
        chosen = place_weights(mems, sprams, wanted=n)
        if len(chosen) < n or sum(cells[c] for c in chosen) >= excess:
            return chosen
    return place_weights(mems, sprams)


def device_check(target, utilization: float, pinned=frozenset(), weights: str = "auto"):
    """``fits(dataflow)`` for :func:`plan.fold.fold`: ``None`` if the estimated resources
    of the design plus the board wrapper fit ``target``'s device, otherwise what overflows,
    with the figures: ``"136 MULT18X18D > 124 (156 x 0.8; 133 requantizing, ...)"``.

    When the hard multipliers overflow, the layers folded to take their whole matrix per
    cycle become adder graphs (``multipliers = "adders"``), then layers move their products
    into LUTs (``multipliers = "lut"``): the set of layers whose products free enough
    multipliers with the fewest products moved (each costs LUTs; :func:`cheapest_cover`;
    ties: the fewest layers), where the layers with the most products first had moved 36
    more than needed on MobileNetV1; a layer's requantization keeps its
    hard multipliers (the ``"products"`` and ``"requant"`` parts of
    :func:`~onnx2fpga.hw.resources.dataflow_resources`), and layers in ``pinned`` keep the
    user's choice. When the block RAMs overflow, memories move into soft logic
    (``dataflow.logic_memories``): the set that frees enough block RAMs for the fewest
    logic cells (:func:`cheapest_cover`). When LUTs run short and block RAMs do not, the
    weight ROMs yosys would build in LUTs move into block RAM
    (``dataflow.block_memories``): the set that frees enough LUTs for the fewest block
    RAMs, if they are spare. The plan then fits if its LUTs and flip-flops do
    too. On a device with SPRAMs (an iCE40 UltraPlus) and ``weights`` not ``"rom"``, weight
    memories go to SPRAM (``dataflow.spram_memories``) first: with ``"spram"`` the largest
    that fit, with ``"auto"`` the largest while the block RAMs overflow
    (:func:`spram_cover`); their folding must give them no more weights per cycle than
    their SPRAMs (:func:`onnx2fpga.plan.spram.spram_fits`), or they stay in block RAM."""
    from .hw.resources import dataflow_resources, logic_weight_roms
    from .plan.devices import logic_cost

    caps, _ = device_caps(target, utilization)
    sprams = getattr(target.limits, "spram", 0)

    def overflow(res):
        kept = sum(lr["requant"]["dsp"] for lr in res["layers"])
        return overflow_of(res["board"], target, utilization, kept)

    def fits(df):
        if weights == "spram" and sprams:
            from .plan.graph import plan_graph
            from .plan.spram import place_weights, weight_memories
            df.spram_memories = place_weights(weight_memories(plan_graph(df).stages), sprams)
        res = dataflow_resources(df, target.family, wrapper=True, memories=True)
        over = overflow(res)
        if weights == "auto" and sprams and over and res["board"]["bram"] > caps["bram"]:
            df.spram_memories = spram_cover(df, res, res["board"]["bram"] - caps["bram"],
                                            sprams)
            if df.spram_memories:
                res = dataflow_resources(df, target.family, wrapper=True, memories=True)
                over = overflow(res)
        if over and res["board"]["dsp"] > caps["dsp"]:
            # Layers that take their whole matrix per cycle become adder graphs: their
            # weights as constants, no multiplier, the requantization folded in.
            whole = [ly for ly in df.layers if ly.name not in pinned
                     and product_mapping(ly) == "dsp" and at_full_folding(ly)]
            for ly in whole:
                ly.multipliers = "adders"
            if whole:
                res = dataflow_resources(df, target.family, wrapper=True, memories=True)
                over = overflow(res)
        if over and res["board"]["dsp"] > caps["dsp"]:
            by_name = {ly.name: ly for ly in df.layers}
            movable = [(lr["name"], lr["products"]["dsp"], lr["products"]["dsp"])
                       for lr in res["layers"] if lr["products"]["dsp"] > 0
                       and lr["name"] not in pinned
                       and product_mapping(by_name[lr["name"]]) == "dsp"]
            moved = cheapest_cover(movable, res["board"]["dsp"] - caps["dsp"])
            for name in moved:
                by_name[name].multipliers = "lut"
            if moved:
                res = dataflow_resources(df, target.family, wrapper=True, memories=True)
                over = overflow(res)
        if over and res["board"]["lut"] > caps["lut"] and res["board"]["bram"] < caps["bram"]:
            # LUTs run short and block RAMs do not: the weight ROMs yosys would build in LUTs
            # that free enough of them for the fewest block RAMs go into block RAM.
            roms = logic_weight_roms(df, target.family)
            moved = cheapest_cover(roms, res["board"]["lut"] - caps["lut"])
            if moved and sum(b for n, _, b in roms if n in moved) <= \
                    caps["bram"] - res["board"]["bram"]:
                df.block_memories = sorted(df.block_memories + moved)
                res = dataflow_resources(df, target.family, wrapper=True, memories=True)
                over = overflow(res)
        if over and res["board"]["bram"] > caps["bram"]:
            # Block RAMs run out: the memories to move into soft logic are the set that
            # frees enough block RAMs for the fewest logic cells (a knapsack over the
            # block RAMs still missing).
            moved = cheapest_cover(
                [(mem[0], mem[1], logic_cells(logic_cost(*mem[:1], *mem[2:])))
                 for mem in res["block_memories"]],
                res["board"]["bram"] - caps["bram"])
            df.logic_memories = sorted(df.logic_memories + moved)
            over = overflow(dataflow_resources(df, target.family, wrapper=True))
        return "; ".join(over) or None
    return fits


#: Without a board, a design whose weights take more than this many times the block RAM of
#: the largest supported device is refused (:func:`check_sizes`): it fits no board by far.
NO_BOARD_MARGIN = 4

#: Bytes lowering takes per element of the model's constants (the weights as 64-bit integers
#: and their copies; 4096 x 4096 int8 weights: 340 MB over the loaded model), with a margin.
_LOWER_BYTES_PER_CONSTANT = 32

#: What a compile takes per bit of weight memory when it generates the Verilog, where its
#: cost lies for a large model (Amaranth's netlist and RTLIL of a weight ROM hold a few
#: objects per bit; the folding's estimates take the ROMs by their shape): peak memory, over
#: a base of :data:`_COMPILE_BASE_BYTES`, and time. One int8 MatMul: 512 x 512 (2 Mbit)
#: 0.33 GB and 8 s, 1024 x 1024 (8 Mbit) 1.1 GB and 70-90 s (``benchmarks/big_layers.py``).
_COMPILE_BYTES_PER_WEIGHT_BIT = 140
_COMPILE_BASE_BYTES = 200 << 20
_COMPILE_SECONDS_PER_WEIGHT_BIT = 1e-5


def _bits(n: int) -> str:
    """``n`` bits in kbit (1,024 bits) or Mbit (1,024 kbit)."""
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} Mbit"
    return f"{n / 1024:.1f} kbit" if n < 10 * 1024 else f"{n // 1024:,} kbit"


def _bytes(n: int) -> str:
    return f"{n / (1 << 30):.1f} GB" if n >= 1 << 30 else f"{n / (1 << 20):,.0f} MB"


def weight_sizes(dataflow) -> list:
    """``[(layer name, bits), ...]`` of the layers with weights, the largest first: the
    memory their weights take at least (:meth:`LayerKind.weight_bits
    <onnx2fpga.plan.layers.base.LayerKind.weight_bits>`)."""
    from .plan.layers import kind_of

    sizes = [(ly.name, kind_of(ly).weight_bits(ly)) for ly in dataflow.layers]
    return sorted(((n, b) for n, b in sizes if b), key=lambda s: (-s[1], s[0]))


def _weights_text(sizes) -> str:
    total = sum(b for _, b in sizes)
    shown = ", ".join(f"layer {n!r} {_bits(b)}" for n, b in sizes[:3])
    more = f" and {len(sizes) - 3} more" if len(sizes) > 3 else ""
    return f"{_bits(total)} ({shown}{more})"


def _block_ram_bits(limits) -> int:
    return limits.bram * limits.bram_kbit * 1024


def check_sizes(dataflow, board, utilization: float, say=lambda msg: None,
                weights: str = "auto") -> None:
    """Refuse, before folding, a design whose weights cannot fit: with ``board``, more
    weight bits (:func:`weight_sizes`) than the device holds in block RAM, in its SPRAMs
    (unless ``weights`` is ``"rom"``) and in all of
    its LUTs (within ``utilization``) as ROM, even at the slowest folding; without a
    board, more than :data:`NO_BOARD_MARGIN` times the block RAM of the largest supported
    device. Raises :class:`~onnx2fpga.errors.SizeError` naming the sizes."""
    from .boards.targets import get_board, list_boards
    from .plan.checks import weight_capacity_bits

    sizes = weight_sizes(dataflow)
    total = sum(b for _, b in sizes)
    if not total:
        return
    if board is not None:
        target = get_board(board)
        lim = target.limits
        luts = int(lim.lut * utilization)
        cap = weight_capacity_bits(lim.bram, lim.bram_kbit * 1024, luts)
        sprams = lim.spram if weights != "rom" else 0
        cap += sprams * SPRAM_WORDS * SPRAM_BITS
        if total > cap:
            spram = f", {sprams} SPRAMs of 256 kbit" if sprams else ""
            raise SizeError(
                f"The weights take {_weights_text(sizes)} even at the slowest folding; "
                f"{target.name} ({target.device}) holds at most {_bits(cap)} of them: "
                f"{lim.bram} block RAMs of {lim.bram_kbit} kbit{spram} and {luts:,} LUTs "
                f"({utilization:.0%} of {lim.lut:,}) as ROM")
        return
    targets = [get_board(name) for name in list_boards()]
    most = max(_block_ram_bits(t.limits) for t in targets)
    if total > NO_BOARD_MARGIN * most:
        names = ", ".join(t.name for t in targets if _block_ram_bits(t.limits) == most)
        big = next(t for t in targets if _block_ram_bits(t.limits) == most).limits
        raise SizeError(
            f"The weights take {_weights_text(sizes)}; the largest supported device "
            f"({names}) has {_bits(most)} of block RAM ({big.bram} of {big.bram_kbit} "
            f"kbit): a design needing more than {NO_BOARD_MARGIN} times that fits no board")


def _read_int(path):
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def available_memory() -> int | None:
    """Bytes of memory available to a new process: Linux's ``MemAvailable``
    (``/proc/meminfo``), less if the process's control group (v2 or v1) has a limit nearer
    its usage; elsewhere the free physical pages; ``None`` if unknown."""
    have = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    have.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                          "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        lim, used = _read_int(limit), _read_int(usage)
        if lim is not None and used is not None and lim < 1 << 60:    # "max": no limit
            have.append(max(0, lim - used))
    if not have:
        try:
            have.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (AttributeError, ValueError, OSError):
            return None
    return min(have)


def check_lowering(graph) -> None:
    """Refuse, before lowering, a model whose constants take more memory as integer layers
    than the machine has available."""
    elements = sum(int(np.asarray(v).size) for v in graph.constants.values())
    need = _COMPILE_BASE_BYTES + _LOWER_BYTES_PER_CONSTANT * elements
    have = available_memory()
    if have is not None and need > have:
        raise SizeError(f"Lowering the model's {elements:,} constant elements takes about "
                        f"{_bytes(need)} of memory; this machine has {_bytes(have)} available")


def check_machine(dataflow, say=lambda msg: None) -> None:
    """Refuse, before any hardware is built, a design whose Verilog would need more memory
    than the machine has available (estimated from its weight bits); say how long and how
    much memory a large one takes."""
    sizes = weight_sizes(dataflow)
    total = sum(b for _, b in sizes)
    need = _COMPILE_BASE_BYTES + _COMPILE_BYTES_PER_WEIGHT_BIT * total
    seconds = _COMPILE_SECONDS_PER_WEIGHT_BIT * total
    have = available_memory()
    if have is not None and need > have:
        raise SizeError(f"Generating the Verilog of weights of {_weights_text(sizes)} takes "
                        f"about {_bytes(need)} of memory; this machine has {_bytes(have)} "
                        f"available")
    if seconds >= 30:
        say(f"{_bits(total)} of weights: generating the Verilog takes about "
            f"{seconds:.0f} s and {_bytes(need)}")


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



@dataclass
class Compilation:
    """What a compile has produced so far (each step fills its part) and the options it runs
    with (those of :func:`onnx2fpga.compile`).

    Attributes
    ----------
    graph : frontend graph
        After ``load``; quantized after ``quantize``.
    float_graph : frontend graph or None
        A float model's graph before quantization (for ``evaluate``).
    samples : array or None
        The checked calibration samples.
    quant_info : dict
        How the model was quantized (the manifest's ``quantization``).
    design : onnx2fpga.ir.Design
        After ``lower``; folded after ``fold``.
    verilog, manifest : str, dict
        After ``emit``.
    weight_image : bytes or None
        After ``emit``, for weights in SPRAM: the image for the flash
        (:func:`onnx2fpga.plan.spram.weight_image`), written as ``weights.bin``.
    done : list of str
        The steps run so far.
    """
    model: object
    options: dict
    graph: object = None
    float_graph: object = None
    samples: object = None
    quant_info: dict = field(default_factory=lambda: {"source": "qdq"})
    design: Design | None = None
    verilog: str | None = None
    manifest: dict | None = None
    done: list = field(default_factory=list)
    weight_image: bytes | None = None


def _load(c: Compilation, say) -> None:
    from .frontend.finn import normalize_finn
    from .frontend.load import load_model
    from .frontend.qdq import normalize_qdq
    from .frontend.qonnx import normalize_qonnx
    from .frontend.qop import CONTRIB_CONVERTED, QOP_OPS, normalize_qoperators
    from .frontend.quantize import fold_constants
    from .frontend.resolve import resolve_geometry
    from .frontend.sklearn import normalize_ml

    say("loading and checking the model")
    graph = load_model(c.model, lenient=c.options["lenient"])
    # onnxruntime's quantizer (QDQ or QOperator) writes producer "onnx.quantize"; QOperator
    # nodes are onnxruntime's kernels: both choose its requantization by default.
    graph.metadata["onnxruntime_quantized"] = \
        graph.metadata.get("producer_name") == "onnx.quantize" or \
        any(n.op in QOP_OPS + CONTRIB_CONVERTED for n in graph.nodes)
    normalize_ml(graph)         # skl2onnx's linear models: a Gemm and host operators
    normalize_qoperators(graph)
    normalize_finn(graph)       # FINN MultiThreshold activations: quantizers by thresholds
    normalize_qdq(graph)
    normalize_qonnx(graph)      # QONNX quantizers and QCDQ Clips into the same QDQ form
    fold_constants(graph)       # computed constants (a Pow of two initializers, ...)
    resolve_geometry(graph)
    c.graph = graph


def _quantize(c: Compilation, say) -> None:
    from .frontend.quantize import is_quantized, quantize_float_inputs, quantize_graph

    o, graph = c.options, c.graph
    calibration, activation_bits = o["calibration"], o["activation_bits"]
    if isinstance(calibration, (str, os.PathLike)):
        calibration = read_arrays(calibration, "calibration data", CalibrationError)
    if isinstance(calibration, dict):            # a .npz (or a dict) by graph input name
        if sorted(map(str, calibration)) != sorted(graph.inputs):
            raise CalibrationError(f"Calibration data must be named "
                                   f"{', '.join(map(repr, graph.inputs))}, not "
                                   f"{', '.join(map(repr, calibration)) or 'none'}")
        calibration = calibration[graph.inputs[0]]
    if is_quantized(graph):
        if calibration is not None:
            samples = check_samples(graph, calibration, "Calibration data")
            quantized_inputs = quantize_float_inputs(graph, samples,
                                                     activation_bits=activation_bits,
                                                     pow2_scales=o.get("pow2_scales", False))
            if quantized_inputs:
                say(f"quantized the float inputs of {', '.join(quantized_inputs)} at "
                    f"{activation_bits} bits from {len(samples)} calibration samples")
                c.quant_info["float_inputs_quantized"] = {
                    "tensors": quantized_inputs, "activation_bits": activation_bits,
                    "pow2_scales": bool(o.get("pow2_scales", False)),
                    "calibration_samples": int(len(samples))}
            else:
                # stacklevel: this step, run_steps, compile, the caller of compile.
                warnings.warn("the model is already quantized; calibration data is not used",
                              stacklevel=4)
    else:
        if calibration is None:
            raise CalibrationError(
                f"Graph {graph.name!r} is a float model: pass calibration data "
                f"(--calibration X.npy, a batch of real inputs) to quantize it")
        samples = check_samples(graph, calibration, "Calibration data")
        say(f"calibrating on {len(samples)} samples")
        c.samples = samples
        c.float_graph = copy.deepcopy(graph)
        quantize_graph(graph, samples, weight_bits=o["weight_bits"],
                       activation_bits=activation_bits, per_channel=o["per_channel"],
                       pow2_scales=o.get("pow2_scales", False))
        c.quant_info = {"source": "calibration", **graph.metadata["quantization"]}
    multiplier_bits = o["multiplier_bits"]
    if multiplier_bits is None:
        multiplier_bits = 24 if c.quant_info["source"] == "qdq" else 16
    c.quant_info["multiplier_bits"] = multiplier_bits
    requant = o.get("requant")
    if requant is None:
        requant = "onnxruntime" if c.quant_info["source"] == "qdq" and \
            graph.metadata.get("onnxruntime_quantized") else "exact"
    c.quant_info["requant"] = requant


def _lower(c: Compilation, say) -> None:
    from .frontend.lower import lower

    check_lowering(c.graph)
    say("lowering to integer layers")
    c.design = lower(c.graph, multiplier_bits=c.quant_info["multiplier_bits"],
                     requant=c.quant_info.get("requant", "exact"),
                     allow_host_compute=c.options.get("allow_host_compute", False))
    say(f"partition: {partition_text(c.design)}")


def partition_text(design) -> str:
    """The partition in one line: the host's operators before and after the hardware part
    (its quantizers, dequantizers, renames and the (de)multiplexing of several inputs or
    results left out) and the number of hardware layers, e.g. ``host: Softmax (tail);
    hardware: 3 layers``, then how many tensors share each stream where several do."""
    def ops(nodes):
        seen = []
        for n in nodes:
            if n.op not in ("QuantizeLinear", "DequantizeLinear", "Identity") and \
                    n.op not in seen and "multiplex" not in n.name:
                seen.append(n.op)
        return ", ".join(seen)
    host = [f"{text} ({where})" for where, text in (("head", ops(design.head)),
                                                     ("tail", ops(design.tail))) if text]
    k = len(design.dataflow.layers)
    shared = [f"{len(port.parts)} {what} multiplexed" for port, what in
              ((design.dataflow.input, "inputs"), (design.dataflow.output, "results"))
              if port.parts]
    return (f"host: {', '.join(host) if host else 'quantize and dequantize only'}; "
            f"hardware: {k} layer{'s' if k != 1 else ''}" +
            "".join(f"; {text}" for text in shared))


def _fold(c: Compilation, say) -> None:
    from .plan.fold import fold

    o = c.options
    board, utilization = o["board"], o["utilization"]
    check_sizes(c.design.dataflow, board, utilization, say, o.get("weights", "auto"))
    from .boards.targets import get_board
    target = get_board(board) if board is not None else None
    if target is not None:
        if target.family == "ice40":
            # MatVec products may take the device's SB_MAC16s (registered at both ends),
            # within the utilization as every other resource.
            c.design.dataflow.ice40_dsps = int(target.limits.dsp * utilization)
        # ECP5 DSP products: a fabric register behind each MULT18X18D's output.
        c.design.dataflow.ecp5_dsp_registers = target.family == "ecp5"
        # ECP5 block RAM reads feeding another core (windows, deep queues): a register.
        c.design.dataflow.bram_registers = target.family == "ecp5"
        # Adder graphs: as many adder levels per register stage as the clock allows.
        c.design.dataflow.adder_levels = devices.adder_levels(
            target.family, o["clock_mhz"] or devices.PLANNING_CLOCK_MHZ[target.family])
    if o.get("adder_levels") is not None:      # the user's choice over the delay model's
        c.design.dataflow.adder_levels = int(o["adder_levels"])
    arch, weights = o.get("architecture", "auto"), o.get("weights", "auto")
    if arch == "engine":
        say("the layer engine, as asked (one layer at a time)")
        use_engine(c.design.dataflow, target, utilization, weights, None, say,
                   o["fold_options"].get("target_cycles"))
    else:
        say("choosing the folding" + (f" for {board}" if board else ""))
        try:
            fold(c.design.dataflow, overrides=o["folding"], progress=say, **o["fold_options"])
        except SizeError as e:   # no folding fits the board's device: the engine, if it does
            msg = str(e).replace("fits:", f"fits {board}:", 1)
            if board is None or o["folding"] or arch == "dataflow":
                raise SizeError(msg) from None
            say(f"{msg.rstrip('.')}; trying the layer engine (one layer at a time)")
            use_engine(c.design.dataflow, target, utilization, weights, msg, say)
    c.design.dataflow.folding_info.update(
        {"board": board, "target_fps": o["target_fps"], "clock_mhz": o["clock_mhz"],
         "utilization": utilization if board else None})
    if any(product_mapping(ly) == "adders" for ly in c.design.dataflow.layers):
        c.design.dataflow.folding_info["adder_levels"] = c.design.dataflow.adder_levels
    spram = c.design.dataflow.spram_memories
    if spram:
        say(f"weights in SPRAM: {', '.join(spram)} (loaded at start-up from the board's "
            f"flash at {FLASH_OFFSET:#x}, weights.bin)")


def _evaluate(c: Compilation, say) -> None:
    if c.float_graph is None:
        return
    from .sim import host
    from .sim.model import run_design

    design, graph, float_graph, samples = c.design, c.graph, c.float_graph, c.samples
    points = _layer_float_points(design.dataflow, graph, float_graph)
    # The output compared: the first float one (a classifier's probabilities, not its label).
    out = next((t for t in float_graph.outputs
                if float_graph.tensors[t].dtype.startswith("float")),
               float_graph.outputs[0])
    keep = {out} | {p[0] for p in points.values()}
    envs = []                      # only the tensors compared, not every intermediate
    for s in samples:
        env = host.run_nodes(float_graph.nodes, {float_graph.inputs[0]: s},
                             float_graph.constants)
        envs.append({t: env[t] for t in keep})
    ref = np.stack([env[out] for env in envs])
    quant_info = c.quant_info
    quant_info["layers"] = _layer_errors(design, samples, points, envs)
    del envs
    got = run_design(design, samples, stacked=True)
    if isinstance(got, dict):
        got = got[out]
    err = np.abs(got.astype(np.float64) - ref.astype(np.float64))
    quant_info["calibration_max_abs_error"] = float(err.max())
    quant_info["calibration_mean_abs_error"] = float(err.mean())
    if ref.ndim >= 2 and ref.shape[-1] > 1:
        agree = np.argmax(got.reshape(len(got), -1), 1) == np.argmax(
            ref.reshape(len(ref), -1), 1)
        quant_info["calibration_argmax_agreement"] = float(agree.mean())


def _emit(c: Compilation, say) -> None:
    from .hw.emit import emit_verilog

    check_machine(c.design.dataflow, say)
    say("generating Verilog")
    name = c.options.get("name", DEFAULT_MODULE)
    c.verilog = emit_verilog(c.design.dataflow, name=name)
    say("estimating the resources on iCE40 and ECP5 for the manifest")
    c.manifest = make_manifest(c.design, c.verilog, c.quant_info, name)
    df = c.design.dataflow
    if df.spram_memories or df.engine == "spram":
        from .hw.top import weight_image_of
        from .plan.spram import image_sha256

        c.weight_image = weight_image_of(df)
        c.manifest["spram"] = {
            "file": WEIGHT_IMAGE, "flash_offset": FLASH_OFFSET, "bytes": len(c.weight_image),
            "sha256": image_sha256(c.weight_image),
            "memories": list(df.spram_memories) or ["engine"]}


_RUN = {"load": _load, "quantize": _quantize, "lower": _lower, "fold": _fold,
        "evaluate": _evaluate, "emit": _emit}


def run_steps(c: Compilation, until: str = "emit", say=lambda msg: None) -> Compilation:
    """Run the steps of :data:`STEPS` that ``c`` has not run yet, up to and including
    ``until``."""
    if until not in STEPS:
        raise OptionError(f"stop_after must be one of {', '.join(STEPS)}, not {until!r}")
    for step in STEPS[:STEPS.index(until) + 1]:
        if step not in c.done:
            check_interrupted()
            _RUN[step](c, say)
            c.done.append(step)
    return c


def graph_json(graph) -> dict:
    """A readable summary of a frontend graph: inputs, outputs, tensors (dtype, shape),
    constants (dtype, shape; small ones' values) and nodes (op, domain, version, inputs,
    outputs, attributes; arrays as dtype and shape unless small)."""
    def value(v):
        if isinstance(v, np.ndarray):
            if v.size <= 16:
                return {"dtype": v.dtype.name, "shape": list(v.shape), "values": v.tolist()}
            return {"dtype": v.dtype.name, "shape": list(v.shape)}
        if isinstance(v, (list, tuple)):
            return [value(x) for x in v]
        if isinstance(v, dict):
            return {str(k): value(x) for k, x in v.items()}
        if isinstance(v, (np.integer, np.floating, np.bool_)):
            return v.item()
        if isinstance(v, bytes):
            return v.decode("utf-8", "replace")
        if v is None or isinstance(v, (int, float, str, bool)):
            return v
        return repr(v)

    return {
        "name": graph.name, "inputs": list(graph.inputs), "outputs": list(graph.outputs),
        "opsets": dict(graph.opsets),
        "tensors": {t: {"dtype": i.dtype, "shape": value(list(i.shape))}
                    for t, i in graph.tensors.items()},
        "constants": {t: value(v) for t, v in graph.constants.items()},
        "nodes": [{"name": n.name, "op": n.op, "domain": n.domain, "version": n.version,
                   "inputs": list(n.inputs), "outputs": list(n.outputs),
                   "attrs": value(n.attrs)} for n in graph.nodes],
        "metadata": value(graph.metadata),
    }


def write_artifacts(c: Compilation, out: str) -> list[str]:
    """Write what the last step of ``c`` produced into directory ``out`` (see the module
    docstring); the names of the files written."""
    def dump(name, doc):
        with open(os.path.join(out, name), "w") as f:
            json.dump(doc, f, indent=2, sort_keys=True)
            f.write("\n")
        return name

    last = c.done[-1]
    if last in ("load", "quantize"):
        written = [dump("graph.json", graph_json(c.graph))]
        if last == "quantize":
            written.append(dump("quantization.json", c.quant_info))
        return written
    if last in ("lower", "fold", "evaluate"):
        save_design(c.design, os.path.join(out, "design.json"),
                    os.path.join(out, "design.npz"))
        return ["design.json", "design.npz", dump("quantization.json", c.quant_info)]
    top = c.manifest["top"]
    extra = []
    if c.weight_image is not None:
        with open(os.path.join(out, WEIGHT_IMAGE), "wb") as f:
            f.write(c.weight_image)
        extra.append(WEIGHT_IMAGE)
    for name, text in ((top["file"], c.verilog), (top["filelist"], filelist_text(c.manifest)),
                       (top["core"], core_text(c.manifest))):
        with open(os.path.join(out, name), "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
    save_design(c.design, os.path.join(out, "design.json"), os.path.join(out, "design.npz"))
    # load() checks the folder against these
    c.manifest["files"] = file_hashes(out, hashed_files(top["module"]))
    dump("manifest.json", c.manifest)
    write_report(out)
    return [top["file"], top["filelist"], top["core"], "manifest.json", "design.json",
            "design.npz", "report.html", "report.md", *extra]
