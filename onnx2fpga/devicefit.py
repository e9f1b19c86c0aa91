"""What overflows a board's device, and the layer engine as the fallback when no folding of
the dataflow fits it (:func:`engine_fit`, :func:`use_engine`: the compile's ``fold`` step)."""

from __future__ import annotations

import dataclasses
import warnings

from .errors import OptionError, SizeError
from .plan.devices import logic_cells
from .plan.engine import ENGINE_SPRAMS, EngineError, engine_cycles, engine_program
from .plan.spram import FLASH_OFFSET

__all__ = ["UNITS", "device_caps", "overflow", "engine_fit", "use_engine"]

#: What each resource of :func:`overflow` is called in a reason, per family.
UNITS = {"lut": "LUTs", "ff": "flip-flops", "logic cells": "logic cells",
         "bram": "block RAMs", "dsp": {"ice40": "SB_MAC16", "ecp5": "MULT18X18D"}}


def device_caps(target, utilization: float) -> tuple[dict, dict]:
    """``(caps, of)``: what a design may use of ``target``'s device (LUTs, flip-flops and
    hard multipliers within ``utilization``, every block RAM; logic cells on iCE40), and the
    device totals the capped ones are a share of."""
    lim = target.limits
    # Hard multipliers within `utilization` too: the jet tagger and the digits example with
    # 154 of the ECP5 85F's 156 MULT18X18D closed timing at only 49 and 57 MHz (paths through
    # DSPs placed far apart), against 90 to 130 MHz for designs using a third of them.
    caps = {"lut": int(lim.lut * utilization), "ff": int(lim.ff * utilization),
            "dsp": int(lim.dsp * utilization), "bram": lim.bram}
    of = {"lut": lim.lut, "ff": lim.ff, "dsp": lim.dsp, "logic cells": lim.lut}
    if target.family == "ice40":
        caps["logic cells"] = int(lim.lut * utilization)
    return caps, of


def overflow(total: dict, target, utilization: float, requant_dsps: int = 0) -> list[str]:
    """What of ``total`` (a design with its board wrapper: ``lut``, ``ff``, ``dsp``,
    ``bram``) exceeds ``target``'s caps (:func:`device_caps`), each with the figures:
    ``"136 MULT18X18D > 124 (156 x 0.8; 133 requantizing, ...)"``."""
    caps, of = device_caps(target, utilization)
    total = dict(total)
    if target.family == "ice40":
        # The device limit is on logic cells. Measured on the digits example: 4,183
        # cells = 3,324 LUTs + 0.48 x 1,808 flip-flops.
        total["logic cells"] = logic_cells(total)
    out = []
    for k, cap in caps.items():
        if total.get(k, 0) <= cap:
            continue
        unit = UNITS[k] if k != "dsp" else UNITS[k][target.family]
        why = f"{total[k]:,} {unit} > {cap:,}"
        if k in of:
            why += f" ({of[k]:,} x {utilization:g}"
            if k == "dsp" and requant_dsps:
                why += f"; {requant_dsps:,} requantizing, which stay when products move " \
                       f"to LUTs"
            why += ")"
        out.append(why)
    return out


def engine_fit(dataflow, target, utilization: float, weights: str = "auto"):
    """``(placement, figures, None)`` when the layer engine of ``dataflow``
    (:mod:`onnx2fpga.plan.engine`) fits ``target``'s device, ``(None, None, why)``
    otherwise. ``placement`` is the engine's weights: ``"spram"`` on a device with
    :data:`ENGINE_SPRAMS` SPRAMs (unless ``weights`` is ``"rom"``), else ``"rom"``;
    ``figures`` its estimated resources with the board wrapper."""
    from .hw.resources import engine_resources

    try:
        program = engine_program(dataflow)
    except EngineError as e:
        return None, None, str(e)
    sprams = getattr(target.limits, "spram", 0)
    place = "spram" if sprams >= ENGINE_SPRAMS and weights != "rom" else "rom"
    total = engine_resources(program, target.family, place)["board"]
    over = overflow(total, target, utilization)
    if over:
        return None, None, "the layer engine needs " + "; ".join(over)
    return place, total, None


def use_engine(df, target, utilization, weights, why, say, target_cycles=None) -> None:
    """Run ``df`` on the layer engine: on ``target``'s device if it fits
    (:func:`~onnx2fpga.devicefit.engine_fit`), or raise a SizeError, ``why`` (what no
    folding fit) with the engine's reason added; without a target, its weights in SPRAM
    only if ``weights`` is ``"spram"``. An OptionError if it takes more than
    ``target_cycles`` cycles per inference (``target_fps`` asks for them)."""
    if target is not None:
        place, total, reason = engine_fit(df, target, utilization, weights)
        if place is None:
            head = f"{why.rstrip('.')}; and" if why else "On " + target.name + ","
            raise SizeError(f"{head} {reason}") from None
    else:
        try:
            engine_program(df)
        except EngineError as e:
            raise SizeError(str(e)) from None
        place, total = ("spram" if weights == "spram" else "rom"), None
    df.engine = place
    df.spram_memories, df.logic_memories, df.block_memories = [], [], []
    df.input = dataclasses.replace(df.input, lanes=1, order=None)
    df.output = dataclasses.replace(df.output, lanes=1, order=None)
    cyc = engine_cycles(engine_program(df))["cycles_per_inference"]
    if target_cycles is not None and cyc > target_cycles:
        raise OptionError(f"The layer engine takes {cyc:,} cycles per inference, more than "
                          f"the {target_cycles:,} that target_fps asks for at clock_mhz")
    df.folding_info["limited_by"] = ("nothing fits as a core per layer: the layer engine"
                                     if why else "the layer engine, as asked")
    size = f", about {total['lut']:,} LUTs, {total['ff']:,} flip-flops" if total else ""
    msg = (f"the layer engine runs the model{' on ' + target.name if target else ''}, one "
           f"layer at a time: {cyc:,} cycles per inference{size}" +
           (f", weights in SPRAM (loaded at start-up from the board's flash at "
            f"{FLASH_OFFSET:#x}, weights.bin)" if place == "spram" else ""))
    say(msg)
    if why:     # not asked for: a warning too, so that it shows without progress output
        # stacklevel: this function, the fold step, run_steps, compile, its caller.
        warnings.warn(msg, stacklevel=5)
