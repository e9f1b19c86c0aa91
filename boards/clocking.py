"""Clock generation: the ``sync`` domain from the board oscillator, through the PLL when the
design asks for another frequency.

:func:`plan_pll` chooses the divider settings of one family's PLL for a wanted output
frequency; :class:`ClockedTop` wraps a design so that its ``sync`` domain runs from that PLL,
held in reset until the PLL reports lock. The relations between settings and frequencies are
those of the vendors' documentation:

- iCE40 ``SB_PLL40_PAD`` (Lattice TN1251, "iCE40 sysCLOCK PLL Design and Usage Guide"),
  simple feedback: ``f_out = f_ref * (DIVF + 1) / ((DIVR + 1) * 2**DIVQ)``, with the phase
  detector input ``f_ref / (DIVR + 1)`` in 10..133 MHz, the VCO ``f_out * 2**DIVQ`` in
  533..1066 MHz and ``f_out`` in 16..275 MHz; ``FILTER_RANGE`` follows the phase detector
  frequency.
- ECP5 ``EHXPLLL`` (Lattice TN1263, "ECP5 and ECP5-5G sysClock PLL/DLL Design and Usage
  Guide"), feedback from CLKOP: ``f_out = f_ref * CLKFB_DIV / CLKI_DIV``, the phase detector
  ``f_ref / CLKI_DIV`` in 3.125..400 MHz, the VCO ``f_out * CLKOP_DIV`` in 400..800 MHz.
- Gowin GW1NR-9 ``rPLL`` (Gowin UG286, "Clock User Guide"): ``f_out = f_ref * (FBDIV_SEL +
  1) / (IDIV_SEL + 1)``, the VCO ``f_out * ODIV_SEL`` in 400..1200 MHz with ``ODIV_SEL`` one
  of 2, 4, 8, 16, ..., 128; the phase detector at least 3 MHz.

The wanted frequency is a timing target, so the PLL never runs faster: the highest frequency
the PLL can make that is not above it is taken, if it lies within :data:`TOLERANCE` (5 %) of
it; among the settings that make it, the one with the smallest input divider (the highest
phase-detector frequency, the least jitter), with the VCO nearest the middle of its range. A
wanted frequency no setting reaches so is refused with the nearest ones named. (The iCE40 PLL
steps in ``f_ref / 2**DIVQ``: from 12 MHz, 0.75 MHz between 33 and 66 MHz, so 40 MHz is
39.75 MHz.)

Example::

    >>> plan_pll("ice40", 12.0, 48.0).params["DIVF"]
    63
    >>> plan_pll("ice40", 12.0, 40.0).out_mhz
    39.75
"""

from __future__ import annotations

from dataclasses import dataclass, field

from amaranth.hdl import (
    ClockDomain,
    ClockSignal,
    Const,
    Elaboratable,
    Instance,
    Module,
    ResetSignal,
    Signal,
)
from amaranth.lib import io

from ..errors import Onnx2FpgaError

__all__ = ["ClockError", "PllPlan", "plan_pll", "plan_usb_pll", "ClockedTop", "UsbClockedTop",
           "TOLERANCE"]

#: Largest relative amount by which the generated frequency may fall short of the wanted one.
TOLERANCE = 0.05


class ClockError(Onnx2FpgaError, ValueError):
    """No PLL setting generates the wanted frequency from the board's oscillator."""


@dataclass(frozen=True)
class PllPlan:
    """The PLL settings for one frequency.

    Attributes
    ----------
    family : str
        ``"ice40"``, ``"ecp5"`` or ``"gowin"``.
    primitive : str
        The vendor cell (``SB_PLL40_PAD``, ``EHXPLLL``, ``rPLL``).
    ref_mhz, want_mhz, out_mhz : float
        Oscillator, wanted and generated frequency.
    vco_mhz, pfd_mhz : float
        VCO and phase-detector frequency of this setting.
    params : dict
        The divider settings, by the primitive's parameter names.
    """
    family: str
    primitive: str
    ref_mhz: float
    want_mhz: float
    out_mhz: float
    vco_mhz: float
    pfd_mhz: float
    params: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"primitive": self.primitive, "ref_mhz": self.ref_mhz,
                "want_mhz": self.want_mhz, "out_mhz": round(self.out_mhz, 6),
                "vco_mhz": round(self.vco_mhz, 6), "pfd_mhz": round(self.pfd_mhz, 6),
                "params": dict(self.params)}


def _ice40_filter_range(pfd: float) -> int:
    # TN1251 loop-filter settings by phase-detector frequency (as icepll chooses them).
    for limit, value in ((17, 1), (26, 2), (44, 3), (66, 4), (101, 5)):
        if pfd < limit:
            return value
    return 6


def _ice40_candidates(ref, want):
    for divr in range(16):
        pfd = ref / (divr + 1)
        if not 10 <= pfd <= 133:
            continue
        for divq in range(1, 7):
            for divf in range(128):
                vco = pfd * (divf + 1)
                if not 533 <= vco <= 1066:
                    continue
                out = vco / 2 ** divq
                if 16 <= out <= 275:
                    yield divr, out, vco, pfd, {
                        "FEEDBACK_PATH": "SIMPLE", "DIVR": divr, "DIVF": divf, "DIVQ": divq,
                        "FILTER_RANGE": _ice40_filter_range(pfd)}


def _ecp5_candidates(ref, want):
    for clki in range(1, 129):
        pfd = ref / clki
        if not 3.125 <= pfd <= 400:
            continue
        for clkfb in range(1, 81):
            out = pfd * clkfb
            # The output divider that puts the VCO nearest the middle of its range.
            fits = [c for c in range(1, 129) if 400 <= out * c <= 800]
            if fits:
                clkop = min(fits, key=lambda c: abs(out * c - 600))
                yield clki, out, out * clkop, pfd, {
                    "CLKI_DIV": clki, "CLKFB_DIV": clkfb, "CLKOP_DIV": clkop,
                    "CLKOP_CPHASE": clkop - 1, "CLKOP_FPHASE": 0}


_GOWIN_ODIV = (2, 4, 8, 16, 32, 48, 64, 80, 96, 112, 128)


def _gowin_candidates(ref, want):
    for idiv in range(64):
        pfd = ref / (idiv + 1)
        if pfd < 3:
            break
        for fbdiv in range(64):
            out = pfd * (fbdiv + 1)
            if not 3.125 <= out <= 600:
                continue
            fits = [d for d in _GOWIN_ODIV if 400 <= out * d <= 1200]
            if fits:
                odiv = min(fits, key=lambda d: abs(out * d - 800))
                yield idiv, out, out * odiv, pfd, {
                    "IDIV_SEL": idiv, "FBDIV_SEL": fbdiv, "ODIV_SEL": odiv}


_FAMILIES = {
    "ice40": ("SB_PLL40_PAD", _ice40_candidates),
    "ecp5": ("EHXPLLL", _ecp5_candidates),
    "gowin": ("rPLL", _gowin_candidates),
}


def plan_pll(family: str, ref_mhz: float, want_mhz: float) -> PllPlan:
    """The settings of ``family``'s PLL that turn ``ref_mhz`` into (nearly) ``want_mhz``.

    Raises
    ------
    ClockError
        If no setting makes a frequency from ``want_mhz`` down to :data:`TOLERANCE` below
        it; the message names the nearest frequencies the PLL can make.
    """
    if family not in _FAMILIES:
        raise ClockError(f"No PLL support for family {family!r}; supported: "
                         f"{', '.join(sorted(_FAMILIES))}")
    want = float(want_mhz)
    if not want > 0:
        raise ClockError(f"Clock frequency must be a positive number of MHz, not {want_mhz!r}")
    primitive, candidates = _FAMILIES[family]
    best = None
    below = above = None
    for key, out, vco, pfd, params in candidates(float(ref_mhz), want):
        if out <= want * (1 + 1e-12):
            rank = (-round(out, 9), key)            # the fastest not above, then the divider
            if best is None or rank < best[0]:
                best = (rank, out, vco, pfd, params)
            if below is None or out > below:
                below = out
        elif above is None or out < above:
            above = out
    if best is None or best[1] < want * (1 - TOLERANCE):
        near = " or ".join(f"{f:.3f} MHz" for f in (below, above) if f is not None)
        raise ClockError(f"The {family} PLL cannot make {want:g} MHz from the {ref_mhz:g} MHz "
                         f"oscillator (nor up to {TOLERANCE:.0%} less); nearest: "
                         f"{near or 'none'}")
    _, out, vco, pfd, params = best
    return PllPlan(family, primitive, float(ref_mhz), want, out, vco, pfd, params)


def plan_usb_pll(family: str, ref_mhz: float) -> PllPlan:
    """The PLL settings for USB full speed: 48 MHz on the primary output (``usb_io``) and
    12 MHz on a secondary one (``usb``, ``CLKOS`` of the ECP5 ``EHXPLLL``), both from one VCO,
    so that their edges are aligned as LUNA's gateware PHY requires.

    Raises
    ------
    ClockError
        If ``family`` is not ``"ecp5"`` (the only family with a USB link so far), or the
        oscillator cannot make exactly 48 MHz (USB full speed allows 0.25 %).
    """
    if family != "ecp5":
        raise ClockError(f"USB clocks are only made on ecp5 so far, not {family!r}")
    plan = plan_pll(family, ref_mhz, 48.0)
    if abs(plan.out_mhz - 48.0) > 48.0 * 0.0025:
        raise ClockError(f"The {family} PLL cannot make 48 MHz for USB from the {ref_mhz:g} MHz "
                         f"oscillator (nearest: {plan.out_mhz:.3f} MHz)")
    # CPHASE counts VCO cycles: the same delay on both outputs puts every rising edge of the
    # 12 MHz clock on one of the 48 MHz clock.
    params = {**plan.params, "CLKOS_DIV": 4 * plan.params["CLKOP_DIV"],
              "CLKOS_CPHASE": plan.params["CLKOP_CPHASE"], "CLKOS_FPHASE": 0}
    return PllPlan(plan.family, plan.primitive, plan.ref_mhz, 48.0, plan.out_mhz, plan.vco_mhz,
                   plan.pfd_mhz, params)


def _pll_instance(plan: PllPlan, clk_in, clk_out, locked, clk_os=None):
    """The PLL cell. ``clk_in`` is the oscillator's pin (iCE40) or its buffered signal;
    ``clk_os`` the ECP5 secondary output, when the plan has ``CLKOS_DIV``."""
    p = plan.params
    if plan.family == "ice40":
        # The oscillator pin of iCE40 boards is the PLL's own input pad, which an input
        # buffer would occupy: the PLL takes the pin itself.
        return Instance(
            "SB_PLL40_PAD",
            p_FEEDBACK_PATH=p["FEEDBACK_PATH"], p_DIVR=Const(p["DIVR"], 4),
            p_DIVF=Const(p["DIVF"], 7), p_DIVQ=Const(p["DIVQ"], 3),
            p_FILTER_RANGE=Const(p["FILTER_RANGE"], 3),
            i_PACKAGEPIN=clk_in, i_RESETB=Const(1), i_BYPASS=Const(0),
            o_PLLOUTGLOBAL=clk_out, o_LOCK=locked)
    if plan.family == "ecp5":
        secondary = {}
        if "CLKOS_DIV" in p:
            secondary = dict(
                a_FREQUENCY_PIN_CLKOS=f"{plan.vco_mhz / p['CLKOS_DIV']:.6f}",
                p_CLKOS_ENABLE="ENABLED", p_CLKOS_DIV=p["CLKOS_DIV"],
                p_CLKOS_CPHASE=p["CLKOS_CPHASE"], p_CLKOS_FPHASE=p["CLKOS_FPHASE"],
                i_ENCLKOS=Const(0), o_CLKOS=clk_os)
        return Instance(
            "EHXPLLL", **secondary,
            a_FREQUENCY_PIN_CLKI=f"{plan.ref_mhz:g}", a_FREQUENCY_PIN_CLKOP=f"{plan.out_mhz:.6f}",
            a_ICP_CURRENT="12", a_LPF_RESISTOR="8", a_MFG_ENABLE_FILTEROPAMP="1",
            a_MFG_GMCREF_SEL="2",
            p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
            p_DPHASE_SOURCE="DISABLED", p_OUTDIVIDER_MUXA="DIVA", p_OUTDIVIDER_MUXB="DIVB",
            p_OUTDIVIDER_MUXC="DIVC", p_OUTDIVIDER_MUXD="DIVD",
            p_CLKOP_ENABLE="ENABLED", p_CLKOP_DIV=p["CLKOP_DIV"],
            p_CLKOP_CPHASE=p["CLKOP_CPHASE"], p_CLKOP_FPHASE=p["CLKOP_FPHASE"],
            p_FEEDBK_PATH="CLKOP", p_CLKFB_DIV=p["CLKFB_DIV"], p_CLKI_DIV=p["CLKI_DIV"],
            i_CLKI=clk_in, i_CLKFB=clk_out, i_RST=Const(0), i_STDBY=Const(0),
            i_PHASESEL0=Const(0), i_PHASESEL1=Const(0), i_PHASEDIR=Const(1),
            i_PHASESTEP=Const(1), i_PHASELOADREG=Const(1), i_PLLWAKESYNC=Const(0),
            i_ENCLKOP=Const(0),
            o_CLKOP=clk_out, o_LOCK=locked)
    return Instance(
        "rPLL",
        p_FCLKIN=f"{plan.ref_mhz:g}", p_DEVICE="GW1NR-9C",
        p_DYN_IDIV_SEL="false", p_IDIV_SEL=p["IDIV_SEL"],
        p_DYN_FBDIV_SEL="false", p_FBDIV_SEL=p["FBDIV_SEL"],
        p_DYN_ODIV_SEL="false", p_ODIV_SEL=p["ODIV_SEL"],
        p_PSDA_SEL="0000", p_DYN_DA_EN="false", p_DUTYDA_SEL="1000",
        p_CLKOUT_FT_DIR=Const(1, 1), p_CLKOUTP_FT_DIR=Const(1, 1),
        p_CLKOUT_DLY_STEP=0, p_CLKOUTP_DLY_STEP=0, p_CLKFB_SEL="internal",
        p_CLKOUT_BYPASS="false", p_CLKOUTP_BYPASS="false", p_CLKOUTD_BYPASS="false",
        p_DYN_SDIV_SEL=2, p_CLKOUTD_SRC="CLKOUT", p_CLKOUTD3_SRC="CLKOUT",
        i_CLKIN=clk_in, i_CLKFB=Const(0), i_RESET=Const(0), i_RESET_P=Const(0),
        i_FBDSEL=Const(0, 6), i_IDSEL=Const(0, 6), i_ODSEL=Const(0, 6),
        i_PSDA=Const(0, 4), i_DUTYDA=Const(0, 4), i_FDLY=Const(0, 4),
        o_CLKOUT=clk_out, o_LOCK=locked)


class ClockedTop(Elaboratable):
    """``design`` with its ``sync`` domain driven by the PLL of ``plan`` from the board clock.

    The domain is held in reset until the PLL has locked and then for ``hold_us``
    microseconds more (iCE40 block RAMs read as zero for about 3 us after configuration; the
    reset also covers the PLL's settling), released synchronously.

    Parameters
    ----------
    design : Elaboratable
        Uses the ``sync`` domain, which it must not define.
    clock : tuple of (str, int)
        The oscillator's resource, as the platform names it (``("clk12", 0)``).
    plan : PllPlan
    hold_us : float
    """

    def __init__(self, design, clock, plan: PllPlan, *, hold_us: float = 15.0):
        self.design = design
        self.clock = clock
        self.plan = plan
        self.hold_cycles = max(1, int(hold_us * plan.out_mhz))

    def elaborate(self, platform):
        m = Module()
        m.submodules.design = self.design
        clk_io = platform.request(*self.clock, dir="-")
        if self.plan.family == "ice40":
            clk_in = clk_io.io
        else:
            m.submodules.clk_buffer = clk_buffer = io.Buffer("i", clk_io)
            clk_in = clk_buffer.i
        clk_out = Signal()
        locked = Signal()
        m.submodules.pll = _pll_instance(self.plan, clk_in, clk_out, locked)

        m.domains.sync = ClockDomain("sync")
        m.d.comb += ClockSignal("sync").eq(clk_out)
        platform.add_clock_constraint(clk_out, self.plan.out_mhz * 1e6)

        rst = _held_reset(m, "por", clk_out, locked, self.hold_cycles)
        m.d.comb += ResetSignal("sync").eq(_reset_network(m, rst, self.plan.family))
        return m


def _reset_network(m, rst, family):
    """``rst`` as the design's flip-flops receive it: on the ECP5 through a ``DCCA`` onto a
    global (fabric) clock line, from which every slice's LSR is reached with a small, even
    delay. nextpnr-ecp5 promotes only clock nets to globals by itself, so the reset, reaching
    the flip-flops that have one (6,744 of MLPerf Tiny's ResNet-8's 34,063), was routed
    through general routing, where router2 put it on a 14.5 ns detour (the DS-CNN at 64.6
    MHz). With it on a global line, the four MLPerf Tiny designs routed with router1 and met
    100 MHz (ad8452e; the autoencoder at 111.5 MHz, 100.4 before). nextpnr-ice40 promotes
    reset nets to global buffers itself; other families take ``rst`` as it is."""
    if family != "ecp5":
        return rst
    out = Signal(name="rst_global")
    m.submodules.rst_global = Instance("DCCA", i_CLKI=rst, i_CE=Const(1), o_CLKO=out)
    return out


def _held_reset(m, name, clk, locked, hold_cycles):
    """A reset that is released ``hold_cycles`` cycles of ``clk`` after ``locked`` rose,
    counted in a reset-less domain ``name`` on ``clk`` (two flip-flops bring ``locked`` into
    it); any loss of lock starts again. The reset is a flip-flop of its own: the counter's
    comparison in front of a net reaching every reset flip-flop was kwsmlp_w3a3's critical
    path on the ECP5 85F (13.4 ns). It follows a second one, `busy`, that the counter's
    comparison loads: with the reset register loading the comparison itself, its logic,
    shared with the counter's enable, was placed beside the reset register in the middle of
    the die, and the path counter -> comparison -> counter enable crossed it twice (12.3 ns,
    a DS-CNN build's critical path at 81.6 MHz)."""
    m.domains += ClockDomain(name, reset_less=True)
    m.d.comb += ClockSignal(name).eq(clk)
    lock_sync = Signal(2, name=f"{name}_lock_sync")
    count = Signal(range(hold_cycles + 1), init=hold_cycles, name=f"{name}_count")
    busy = Signal(init=1, name=f"{name}_busy")
    rst = Signal(init=1, name=f"{name}_rst")
    m.d[name] += lock_sync.eq(lock_sync << 1 | locked)
    with m.If(~lock_sync[1]):
        m.d[name] += count.eq(hold_cycles)
    with m.Elif(count != 0):
        m.d[name] += count.eq(count - 1)
    m.d[name] += [busy.eq(count != 0), rst.eq(busy)]
    return rst


class UsbClockedTop(Elaboratable):
    """``design`` with the clock domains a USB link needs besides ``sync``: ``usb_io`` (48 MHz)
    and ``usb`` (12 MHz) from one ECP5 PLL (:func:`plan_usb_pll`), both held in reset until it
    has locked and ``hold_us`` more; ``sync`` from the oscillator itself or, with
    ``sync_plan``, from a second PLL, as :class:`ClockedTop` does.

    Parameters
    ----------
    design : Elaboratable
        Uses ``sync``, ``usb`` and ``usb_io``, and defines none of them.
    clock : tuple of (str, int)
        The oscillator's resource.
    ref_mhz : float
        Its frequency.
    family : str
        ``"ecp5"``.
    sync_plan : PllPlan, optional
    hold_us : float
    """

    def __init__(self, design, clock, ref_mhz, family, *, sync_plan=None, hold_us=15.0):
        self.design = design
        self.clock = clock
        self.family = family
        self.usb_plan = plan_usb_pll(family, ref_mhz)
        self.sync_plan = sync_plan
        self.ref_mhz = ref_mhz
        self.hold_us = hold_us

    def elaborate(self, platform):
        m = Module()
        m.submodules.design = self.design
        clk_io = platform.request(*self.clock, dir="-")
        m.submodules.clk_buffer = clk_buffer = io.Buffer("i", clk_io)
        clk_in = clk_buffer.i

        usb_io_clk, usb_clk, usb_locked = Signal(), Signal(), Signal()
        m.submodules.usb_pll = _pll_instance(self.usb_plan, clk_in, usb_io_clk, usb_locked,
                                             clk_os=usb_clk)
        m.domains.usb_io = ClockDomain("usb_io")
        m.domains.usb = ClockDomain("usb")
        m.d.comb += [ClockSignal("usb_io").eq(usb_io_clk), ClockSignal("usb").eq(usb_clk)]
        platform.add_clock_constraint(usb_io_clk, self.usb_plan.out_mhz * 1e6)
        platform.add_clock_constraint(usb_clk, self.usb_plan.out_mhz / 4 * 1e6)
        # One reset for both USB domains, released in the slower one (the clocks are related).
        usb_rst = _held_reset(m, "usb_por", usb_clk, usb_locked,
                              max(1, int(self.hold_us * self.usb_plan.out_mhz / 4)))
        m.d.comb += [ResetSignal("usb").eq(usb_rst), ResetSignal("usb_io").eq(usb_rst)]

        m.domains.sync = ClockDomain("sync")
        if self.sync_plan is None:
            sync_clk, sync_locked = clk_in, Const(1)
            sync_mhz = self.ref_mhz
        else:
            sync_clk, sync_locked = Signal(), Signal()
            m.submodules.pll = _pll_instance(self.sync_plan, clk_in, sync_clk, sync_locked)
            platform.add_clock_constraint(sync_clk, self.sync_plan.out_mhz * 1e6)
            sync_mhz = self.sync_plan.out_mhz
        rst = _held_reset(m, "por", sync_clk, sync_locked, max(1, int(self.hold_us * sync_mhz)))
        m.d.comb += [
            ClockSignal("sync").eq(sync_clk),
            ResetSignal("sync").eq(_reset_network(m, rst, self.family)),
        ]
        return m
