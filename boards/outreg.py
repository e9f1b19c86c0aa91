"""ECP5 block RAM output registers from the flip-flops behind them (a netlist pass).

An ECP5 ``DP16KD`` without its output register (``REGMODE = "NOREG"``, the only mode yosys
0.70 infers: ``brams_map_16kd.v`` hard-codes it) drives its read data 5.6 ns after the clock
(nextpnr's speed-6 figure); with it (``"OUTREG"``), 0.97 ns. A block RAM's read data that
goes straight into a register of the design (the read is then two stages deep) can use the
block's own register instead. :func:`absorb_output_registers` rewrites yosys' JSON netlist,
between synthesis and place and route: for each read port of a ``DP16KD`` whose every used
data output drives exactly one ``TRELLIS_FF`` and nothing else, where those flip-flops share
the port's clock, one clock enable, no set or reset and power up at 0, it sets the port's
``REGMODE`` to ``"OUTREG"``, drives its output clock enable (``OCE``) with the flip-flops'
enable, makes the data outputs drive the flip-flops' outputs and removes the flip-flops.

The block's output register is loaded from the read latch when ``OCE`` is high at the clock
edge, as the flip-flop was loaded from the latch's outputs; the read latch is still loaded
when ``CE`` is high, so the values are the same on every cycle. The port's reset (``RST``)
also resets the output register, so a port whose reset is used is left alone, as is a port
whose data goes anywhere else (a LUT, a second flip-flop, a top-level port). In the 36-bit
pseudo-dual-port mode (``DATA_WIDTH_A = 36``) both halves of the read data belong to port
B's clock (as nextpnr times them), and both ``REGMODE`` and both ``OCE`` are set.

The design's Verilog, and so every simulation of it, is unchanged: this is a mapping choice,
like yosys' choice of block or LUT RAM. Run by :func:`~onnx2fpga.boards.build.build_bitstream`
for ECP5 boards; the build script it leaves (``build_top.sh``) runs :func:`main` on the
netlist file.
"""

from __future__ import annotations

from collections import defaultdict

from .pnr import netlist_pass_main

__all__ = ["absorb_output_registers", "main"]

_RAM = "DP16KD"
_FF = "TRELLIS_FF"
_LUT = "LUT4"
_INVERTER_INIT = format(0x5555, "016b")     # LUT4 Z = !A


def _param(cell, name, default=""):
    """A cell parameter as a string; yosys writes a string that looks like bits with a
    trailing space, and numbers as 32 binary digits."""
    value = cell.get("parameters", {}).get(name, default)
    return value.rstrip(" ") if isinstance(value, str) else value


def _int_param(cell, name, default=0):
    value = _param(cell, name, None)
    if value is None:
        return default
    try:
        return int(value, 2) if set(value) <= {"0", "1"} else int(value)
    except (TypeError, ValueError):
        return default


def _bit(cell, port):
    """The one bit a single-bit port connects to (a net number or "0"/"1"), or None."""
    bits = cell["connections"].get(port)
    return bits[0] if bits else None


def _read_groups(cell):
    """The read ports of a DP16KD: (REGMODE names, OCE ports, clock port, reset ports,
    clock-mux parameter and its plain value, data output ports)."""
    if _int_param(cell, "DATA_WIDTH_A") == 36:       # pseudo-dual-port: reads on B's clock
        outputs = [f"DO{p}{i}" for p in "AB" for i in range(18)]
        return [(("REGMODE_A", "REGMODE_B"), ("OCEA", "OCEB"), "CLKB", ("RSTA", "RSTB"),
                 ("CLKBMUX", "CLKB"), outputs)]
    return [((f"REGMODE_{p}",), (f"OCE{p}",), f"CLK{p}", (f"RST{p}",), (f"CLK{p}MUX", f"CLK{p}"),
             [f"DO{p}{i}" for i in range(18)]) for p in "AB"]


def _absorbable(cell, group, sinks, cells, port_bits):
    """The flip-flops behind a read port if it can take them as its output register."""
    regmodes, _oces, clock_port, resets, (clkmux, clkmux_plain), outputs = group
    if any(_param(cell, r, "NOREG") != "NOREG" for r in regmodes):
        return None
    if any(_bit(cell, r) not in (None, "0") for r in resets):
        return None
    if _param(cell, clkmux, clkmux_plain) != clkmux_plain:
        return None
    clock = _bit(cell, clock_port)
    ffs = []
    for port in outputs:
        bit = _bit(cell, port)
        if not isinstance(bit, int) or not sinks.get(bit) and bit not in port_bits:
            continue                                    # unused output
        users = sinks.get(bit, [])
        if bit in port_bits or len(users) != 1:
            return None
        name, pin = users[0]
        ff = cells[name]
        if ff["type"] != _FF or pin != "DI":
            return None
        if (_bit(ff, "CLK") != clock or _param(ff, "CLKMUX", "CLK") != "CLK"
                or _bit(ff, "LSR") not in (None, "0") or _param(ff, "LSRMUX", "LSR") != "LSR"
                or _param(ff, "REGSET", "RESET") != "RESET" or _bit(ff, "M") is not None):
            return None
        ffs.append((port, name, ff))
    if not ffs:
        return None
    enables = {(_param(ff, "CEMUX", "1"), _bit(ff, "CE")) for _, _, ff in ffs}
    if len(enables) != 1:
        return None
    ((cemux, ce),) = enables
    if cemux not in ("1", "CE", "INV") or (cemux != "1" and not isinstance(ce, int)):
        return None
    return ffs, cemux, ce


def absorb_output_registers(netlist: dict, top: str = "top") -> int:
    """Rewrite ``netlist`` (yosys' JSON, as loaded) in place; returns how many block RAM read
    ports now use their output register."""
    module = netlist["modules"][top]
    cells = module["cells"]
    sinks = defaultdict(list)
    for name, cell in cells.items():
        directions = cell.get("port_directions", {})
        for port, bits in cell["connections"].items():
            if directions.get(port) == "input":
                for bit in bits:
                    if isinstance(bit, int):
                        sinks[bit].append((name, port))
    port_bits = {bit for port in module.get("ports", {}).values()
                 if port.get("direction") != "input" for bit in port["bits"]}
    next_bit = 1 + max((b for c in cells.values() for bits in c["connections"].values()
                        for b in bits if isinstance(b, int)), default=1)
    inverters = {}
    absorbed = 0
    for name in sorted(n for n, c in cells.items() if c["type"] == _RAM):
        cell = cells[name]
        for group in _read_groups(cell):
            found = _absorbable(cell, group, sinks, cells, port_bits)
            if found is None:
                continue
            ffs, cemux, ce = found
            if cemux == "1":
                enable = "1"
            elif cemux == "CE":
                enable = ce
            else:                                       # active-low enable: one inverter
                if ce not in inverters:
                    inverters[ce] = next_bit
                    cells[f"{name}$outreg_oce_inv"] = {
                        "hide_name": 1, "type": _LUT, "attributes": {},
                        "parameters": {"INIT": _INVERTER_INIT},
                        "port_directions": {"A": "input", "B": "input", "C": "input",
                                            "D": "input", "Z": "output"},
                        "connections": {"A": [ce], "B": ["0"], "C": ["0"], "D": ["0"],
                                        "Z": [next_bit]}}
                    module["netnames"][f"{name}$outreg_oce"] = {
                        "hide_name": 1, "bits": [next_bit], "attributes": {}}
                    next_bit += 1
                enable = inverters[ce]
            regmodes, oces = group[0], group[1]
            for regmode in regmodes:
                cell["parameters"][regmode] = "OUTREG"
            for oce in oces:
                cell["connections"][oce] = [enable]
            for port, ff_name, ff in ffs:
                cell["connections"][port] = list(ff["connections"]["Q"])
                del cells[ff_name]
            absorbed += 1
    return absorbed


def main(argv=None) -> None:
    """Run on each netlist file named (``top.json`` by default)."""
    netlist_pass_main(argv, absorb_output_registers,
                      "block RAM read port(s) now use their output register")


if __name__ == "__main__":      # pragma: no cover
    main()
