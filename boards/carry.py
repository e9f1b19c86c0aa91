"""ECP5 carry chains without a dead carry-out cell (a netlist pass).

yosys 0.70 maps each adder to a chain of ``CCU2C`` cells and connects the carry out
(``COUT``) of the chain's last cell to a net of its own even when nothing reads it.
nextpnr-ecp5 0.11 legalizes every chain whose last ``COUT`` has a net by appending a
pass-out ``CCU2C`` (two ``TRELLIS_COMB`` more), read or not. In the jet tagger's layers 1-3
as adder graphs, 1,832 of the 1,879 chains ended in such an unread carry: 3,664 of the
design's 29,222 ``TRELLIS_COMB`` (12.5 %) were these pass-outs.
:func:`detach_unused_carry_outs` rewrites yosys' JSON netlist between synthesis and place and
route: a ``CCU2C`` carry out that no cell reads and no top-level port exposes is left
unconnected (``"x"``), so nextpnr adds nothing after the chain.

The design's Verilog, and so every simulation of it, is unchanged, and so is the logic: an
unread net carries nothing. (The other cell nextpnr adds to a chain, the feed-in before its
first cell, sets the chain's carry in, which yosys ties to a constant that the fabric cannot
give a chain's first slice; it stays, and :data:`~onnx2fpga.plan.cmvm.CMVM_COST` counts it.)
Run by :func:`~onnx2fpga.boards.build.build_bitstream` for ECP5 boards; the build script it
leaves (``build_top.sh``) runs :func:`main` on the netlist file.
"""

from __future__ import annotations

from .pnr import netlist_pass_main

__all__ = ["detach_unused_carry_outs", "main"]

_CARRY = "CCU2C"


def detach_unused_carry_outs(netlist: dict, top: str = "top") -> int:
    """Rewrite ``netlist`` (yosys' JSON, as loaded) in place; returns how many ``CCU2C``
    carry outs were detached."""
    module = netlist["modules"][top]
    cells = module["cells"]
    read = {bit for port in module.get("ports", {}).values() for bit in port["bits"]}
    for cell in cells.values():
        directions = cell.get("port_directions", {})
        for port, bits in cell["connections"].items():
            if directions.get(port) != "output":
                read.update(bits)
    detached = 0
    for name in sorted(n for n, c in cells.items() if c["type"] == _CARRY):
        bits = cells[name]["connections"].get("COUT", [])
        if len(bits) == 1 and isinstance(bits[0], int) and bits[0] not in read:
            cells[name]["connections"]["COUT"] = ["x"]
            detached += 1
    return detached


def main(argv=None) -> None:
    """Run on each netlist file named (``top.json`` by default)."""
    netlist_pass_main(argv, detach_unused_carry_outs,
                      "unread carry out(s) of CCU2C chains detached")


if __name__ == "__main__":      # pragma: no cover
    main()
