"""The ECP5 netlist pass that makes the flip-flops behind a block RAM read the DP16KD's own
output register (boards.outreg), on netlists yosys 0.70 synthesizes as board builds do."""

import copy
import json
import shutil
import subprocess

import pytest
from amaranth import Elaboratable, Module, Signal
from amaranth.back import rtlil
from amaranth.lib.memory import Memory

from onnx2fpga.boards.build import NO_RW_CHECK_SCRIPT, tool_environment
from onnx2fpga.boards.outreg import absorb_output_registers, main
from onnx2fpga.plan.devices import NO_RW_CHECK

pytestmark = pytest.mark.synth


class _RamThenRegister(Elaboratable):
    """A RAM (one write port, one synchronous read port) whose read data goes into a register
    ``q``: loaded when ``load`` is high (``enable="high"``), low (``"low"``) or on every clock
    (``"always"``); with a reset or not; straight from the read or through an XOR (``lut``)."""

    def __init__(self, width, depth, *, enable="high", reset_less=True, lut=False):
        self.width, self.depth = width, depth
        self.enable, self.reset_less, self.lut = enable, reset_less, lut
        self.r_addr, self.r_en = Signal(range(depth), name="r_addr"), Signal(name="r_en")
        self.w_addr, self.w_en = Signal(range(depth), name="w_addr"), Signal(name="w_en")
        self.w_data, self.load = Signal(width, name="w_data"), Signal(name="load")
        self.q, self.q2 = Signal(width, name="q"), Signal(width, name="q2")

    def elaborate(self, platform):
        m = Module()
        m.submodules.mem = mem = Memory(shape=self.width, depth=self.depth,
                                        init=[(i * 40503) % (1 << self.width)
                                              for i in range(self.depth)], attrs=NO_RW_CHECK)
        rd, wr = mem.read_port(), mem.write_port()
        m.d.comb += [rd.addr.eq(self.r_addr), rd.en.eq(self.r_en), wr.addr.eq(self.w_addr),
                     wr.en.eq(self.w_en), wr.data.eq(self.w_data)]
        reg = Signal(self.width, reset_less=self.reset_less)
        data = rd.data ^ self.w_data if self.lut else rd.data
        load = {"high": self.load, "low": ~self.load, "always": 1}[self.enable]
        with m.If(load):
            m.d.sync += reg.eq(data)
        m.d.comb += self.q.eq(reg)
        m.d.sync += self.q2.eq(reg ^ self.w_data)      # a timed path behind the register
        return m

    def ports(self):
        return [self.r_addr, self.r_en, self.load, self.w_addr, self.w_en, self.w_data, self.q,
                self.q2]


def _synthesize(design, tmp_path):
    """yosys' JSON netlist of ``design`` for ECP5, read from RTLIL as board builds do."""
    env = tool_environment()
    if not shutil.which(env["YOSYS"]):
        pytest.skip("needs yosys")
    (tmp_path / "top.il").write_text(rtlil.convert(design, name="top", ports=design.ports()))
    steps = ["read_rtlil top.il", *NO_RW_CHECK_SCRIPT.splitlines(),
             # the LUT mapping of build.py's abc fallback (abc9 fails on some designs here)
             "synth_ecp5 -top top -run :map_luts", "techmap -map +/lattice/latches_map.v",
             "abc -lut 4 -dress", "clean", "synth_ecp5 -top top -run map_cells:",
             "write_json top.json"]
    run = subprocess.run([env["YOSYS"], "-q", "-p", "; ".join(steps)], env=env,
                         capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    return json.loads((tmp_path / "top.json").read_text())


def _cells(netlist, kind):
    return {n: c for n, c in netlist["modules"]["top"]["cells"].items() if c["type"] == kind}


def _drivers(netlist):
    drivers = {}
    for name, cell in netlist["modules"]["top"]["cells"].items():
        for port, bits in cell["connections"].items():
            if cell["port_directions"][port] == "output":
                for bit in bits:
                    drivers[bit] = (name, port)
    return drivers


def _port_bits(netlist, name):
    return netlist["modules"]["top"]["ports"][name]["bits"]


@pytest.mark.parametrize("width, depth, pdp", [(36, 512, True), (18, 1024, False),
                                                (9, 2048, False), (72, 256, True)])
def test_register_behind_a_block_ram_read_becomes_its_output_register(tmp_path, width, depth,
                                                                      pdp):
    netlist = _synthesize(_RamThenRegister(width, depth), tmp_path)
    rams = _cells(netlist, "DP16KD")
    assert rams and all(c["parameters"]["REGMODE_A"] == "NOREG" for c in rams.values())
    ffs = len(_cells(netlist, "TRELLIS_FF"))
    load = _port_bits(netlist, "load")[0]
    assert absorb_output_registers(netlist) == len(rams)
    # The flip-flops of q are gone; the block RAMs' data outputs drive q.
    assert len(_cells(netlist, "TRELLIS_FF")) == ffs - width
    drivers = _drivers(netlist)
    assert {drivers[b][0] for b in _port_bits(netlist, "q")} == set(rams)
    for cell in rams.values():
        wide = int(cell["parameters"]["DATA_WIDTH_A"], 2) == 36
        assert wide == pdp
        # Pseudo-dual-port: the read is port B's, both halves; otherwise the read port's.
        read = "AB" if pdp else next(p for p in "AB" if cell["connections"][f"WE{p}"] == ["0"])
        for p in read:
            assert cell["parameters"][f"REGMODE_{p}"] == "OUTREG"
            assert cell["connections"][f"OCE{p}"] == [load]
        for p in set("AB") - set(read):
            assert cell["parameters"][f"REGMODE_{p}"] == "NOREG"


@pytest.mark.parametrize("case", ["reset", "lut"])
def test_a_read_with_a_reset_or_logic_in_front_of_its_register_is_left_alone(tmp_path, case):
    design = _RamThenRegister(36, 512, reset_less=case != "reset", lut=case == "lut")
    netlist = _synthesize(design, tmp_path)
    assert _cells(netlist, "DP16KD")
    before = copy.deepcopy(netlist)
    assert absorb_output_registers(netlist) == 0
    assert netlist == before


@pytest.mark.parametrize("enable", ["low", "always"])
def test_output_clock_enable_follows_the_register(tmp_path, enable):
    netlist = _synthesize(_RamThenRegister(36, 512, enable=enable), tmp_path)
    ff = next(iter(_cells(netlist, "TRELLIS_FF").values()))
    assert absorb_output_registers(netlist) == 1
    ram = next(iter(_cells(netlist, "DP16KD").values()))
    oce = ram["connections"]["OCEB"]
    assert ram["connections"]["OCEA"] == oce
    if enable == "always":
        assert oce == ["1"]
        return
    # Active low: yosys gives the flip-flops an inverted clock enable (CEMUX INV); the output
    # register's enable is the load signal through one inverter LUT, or the load itself where
    # yosys inverted it in front of the flip-flops already.
    load = _port_bits(netlist, "load")[0]
    driver = _drivers(netlist).get(oce[0])
    if ff["parameters"]["CEMUX"].strip() == "INV":
        inverter = netlist["modules"]["top"]["cells"][driver[0]]
        assert inverter["type"] == "LUT4" and inverter["connections"]["A"] == [load]
        assert int(inverter["parameters"]["INIT"], 2) == 0x5555
    else:
        assert driver is not None


def test_nextpnr_times_the_output_register(tmp_path):
    """nextpnr's speed-6 clock-to-out of the block RAM, from its timing report: 5.8 ns
    without the output register, under 1 ns with it."""
    env = tool_environment()
    if not shutil.which(env["NEXTPNR_ECP5"]):
        pytest.skip("needs nextpnr-ecp5")
    netlist = _synthesize(_RamThenRegister(36, 512), tmp_path)
    (tmp_path / "before.json").write_text(json.dumps(netlist))
    (tmp_path / "after.json").write_text(json.dumps(netlist))
    main([str(tmp_path / "after.json")])
    paths = {}
    for name in ("before", "after"):
        run = subprocess.run([env["NEXTPNR_ECP5"], "--85k", "--package", "CABGA381",
                              "--json", f"{name}.json", "--freq", "100", "--seed", "1",
                              "--report", f"{name}_pnr.json", "--timing-allow-fail"],
                             env=env, capture_output=True, text=True, cwd=tmp_path)
        assert run.returncode == 0, run.stderr[-2000:]
        report = json.loads((tmp_path / f"{name}_pnr.json").read_text())
        (path,) = [p for p in report["critical_paths"]
                   if p["from"].startswith("posedge") and p["to"].startswith("posedge")]
        paths[name] = path["path"][0]
    ram = next(iter(_cells(netlist, "DP16KD")))
    # The slowest path starts at the block RAM's data output both times.
    for step in paths.values():
        assert step["type"] == "clk-to-q" and step["from"]["cell"] == ram
    assert paths["before"]["delay"] > 5.0 and paths["after"]["delay"] < 1.0
