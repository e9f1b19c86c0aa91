"""Board targets: which amaranth-boards platform, device limits, clock, host link and flasher.

A target is looked up by the name the command line uses (``icebreaker``, ``ulx3s-85f``, ...).
Device limits come from the device table in DESIGN.md (vendor data sheets); the build report
pairs them with what nextpnr used. ``clock``/``clock_mhz`` name the board oscillator; it drives
the ``sync`` domain unless a build asks for another frequency, which the board's PLL then makes
(:mod:`.clocking`).

Example::

    >>> from onnx2fpga.boards.targets import get_board
    >>> get_board("icebreaker").clock_mhz
    12.0
"""

from __future__ import annotations

from dataclasses import dataclass, field

from amaranth.build import Attrs
from amaranth_boards.icebreaker import ICEBreakerPlatform
from amaranth_boards.resources import LEDResources, UARTResource
from amaranth_boards.ulx3s import (
    ULX3S_12F_Platform,
    ULX3S_25F_Platform,
    ULX3S_45F_Platform,
    ULX3S_85F_Platform,
)

from ..errors import Onnx2FpgaError

__all__ = ["DeviceLimits", "BoardTarget", "UnknownBoardError", "list_boards", "get_board",
           "DEFAULT_UTILIZATION"]


@dataclass(frozen=True)
class DeviceLimits:
    """What one FPGA device offers.

    Parameters
    ----------
    lut : int
        4-input LUTs.
    ff : int
        Flip-flops (one per LUT on iCE40 and ECP5).
    dsp : int
        Hard multipliers: ``SB_MAC16`` (iCE40) or ``MULT18X18D`` (ECP5).
    bram : int
        Block RAMs: 4 kbit EBR (iCE40, ``ICESTORM_RAM``) or 18 kbit ``DP16KD`` (ECP5).
    spram : int
        256 kbit single-port RAMs (iCE40 UP only, ``SB_SPRAM256KA``).
    bram_kbit : int
        Size of one block RAM in kbit.
    """
    lut: int
    ff: int
    dsp: int
    bram: int
    spram: int
    bram_kbit: int

    def as_dict(self) -> dict:
        return {"lut": self.lut, "ff": self.ff, "dsp": self.dsp, "bram": self.bram,
                "spram": self.spram}


# DESIGN.md, "Target devices and their limits". LFE5U-12F is not in that table: Lattice's ECP5
# data sheet (FPGA-DS-02012, table 1.1) gives "12K" LUTs (rounded; we use 12,000), 28
# multipliers and 32 EBR blocks. The 12F is a 25F die, so nextpnr reports 25F availability.
_UP5K = DeviceLimits(lut=5280, ff=5280, dsp=8, bram=30, spram=4, bram_kbit=4)
_ECP5_12F = DeviceLimits(lut=12000, ff=12000, dsp=28, bram=32, spram=0, bram_kbit=18)
_ECP5_25F = DeviceLimits(lut=24288, ff=24288, dsp=28, bram=56, spram=0, bram_kbit=18)
_ECP5_45F = DeviceLimits(lut=43848, ff=43848, dsp=72, bram=108, spram=0, bram_kbit=18)
_ECP5_85F = DeviceLimits(lut=83640, ff=83640, dsp=156, bram=208, spram=0, bram_kbit=18)
# DESIGN.md's table; flip-flops from Gowin's GW1NR data sheet (DS117): 6,480 for 8,640 LUT4s.
_GW1NR_9 = DeviceLimits(lut=8640, ff=6480, dsp=20, bram=26, spram=0, bram_kbit=18)


#: Default folding utilization per family (None: any other). On the ECP5 85F with a 100 MHz
#: clock, MLPerf Tiny designs folded to 0.75 route (MobileNetV1 at 41,472 cycles: 55,261
#: LUTs placed, 66 %, in 35 minutes), where the fuller designs of 0.8 stalled in routing
#: with overused wires.
DEFAULT_UTILIZATION = {"ecp5": 0.75, None: 0.8}


@dataclass(frozen=True)
class BoardTarget:
    """One board the compiler can build for.

    Parameters
    ----------
    name : str
        Command-line name, lower case (``"ulx3s-85f"``).
    platform_class : type
        The amaranth-boards platform.
    family : str
        ``"ice40"``, ``"ecp5"`` or ``"gowin"``: selects synthesis options, the place-and-route
        flow and the nextpnr cell types.
    description : str
        Board and device in words.
    limits : DeviceLimits
        What the device offers.
    clock : str
        Name of the clock resource driving the ``sync`` domain.
    clock_mhz : float
        Its frequency in MHz.
    uart : tuple of (str, int)
        The ``(name, number)`` of the UART resource the board wrapper requests.
    uart_note : str
        How the host reaches that UART.
    leds : tuple of (str, int)
        LED resources, in order: activity, error. May be empty.
    flash_tool : str
        The program that writes a bitstream to the board.
    flash_args : tuple of str
        Its arguments; ``{bitstream}`` stands for the bitstream path.
    extra_resources : tuple
        Resources added to the platform (a UART on a header, for instance).
    link : str
        The host link a build uses unless told otherwise: ``"uart"`` (:attr:`uart`) or
        ``"usb"`` (the FPGA drives the board's USB port as a CDC-ACM serial device,
        :mod:`.link`).
    usb : tuple of (str, int) or None
        The USB resource (``d_p``, ``d_n``, ``pullup``) for ``link="usb"``; ``None`` if the
        board's USB port does not reach the FPGA (or has no support here yet).
    usb_note : str
        How the host sees the USB link.
    """
    name: str
    platform_class: type
    family: str
    description: str
    limits: DeviceLimits
    clock: str
    clock_mhz: float
    uart: tuple[str, int]
    uart_note: str
    leds: tuple[tuple[str, int], ...]
    flash_tool: str
    flash_args: tuple[str, ...]
    extra_resources: tuple = field(default=(), repr=False)
    link: str = "uart"
    usb: tuple[str, int] | None = None
    usb_note: str = ""

    @property
    def utilization(self) -> float:
        """The share of the device's LUTs, flip-flops and hard multipliers that compile's
        board folding fills unless told (``--utilization``): :data:`DEFAULT_UTILIZATION`."""
        return DEFAULT_UTILIZATION.get(self.family, DEFAULT_UTILIZATION[None])

    @property
    def links(self) -> tuple[str, ...]:
        """The host links this board can use, its default first."""
        available = ("uart",) + (("usb",) if self.usb is not None else ())
        return (self.link,) + tuple(x for x in available if x != self.link)

    @property
    def device(self) -> str:
        """Device and package, as the platform names them (``"iCE40UP5K-SG48"``; Gowin: the
        part number, ``"GW1NR-LV9QN88PC6/I5"``)."""
        if self.family == "gowin":
            return self.platform_class.part
        return f"{self.platform_class.device}-{self.platform_class.package}"

    @property
    def bitstream_suffix(self) -> str:
        """File suffix of the bitstream the build keeps: ``.bin`` (iCE40), ``.bit`` (ECP5) or
        ``.fs`` (Gowin)."""
        return {"ice40": ".bin", "ecp5": ".bit", "gowin": ".fs"}[self.family]

    def platform(self):
        """A fresh platform instance with :attr:`extra_resources` added."""
        platform = self.platform_class()
        if self.extra_resources:
            platform.add_resources(list(self.extra_resources))
        return platform

    def flash_command(self, bitstream) -> list[str]:
        """The command that would write ``bitstream`` to the board (nothing is run)."""
        return [self.flash_tool] + [a.format(bitstream=str(bitstream)) for a in self.flash_args]


def _ice40_targets() -> list[BoardTarget]:
    targets = [BoardTarget(
        name="icebreaker", platform_class=ICEBreakerPlatform, family="ice40",
        description="1BitSquared iCEBreaker, Lattice iCE40 UP5K",
        limits=_UP5K, clock="clk12", clock_mhz=12.0, uart=("uart", 0),
        uart_note="FTDI FT2232H channel B (second USB serial port)",
        leds=(("led", 1), ("led", 0)),
        flash_tool="iceprog", flash_args=("{bitstream}",))]
    try:
        from amaranth_boards.icesugar import ICESugarPlatform
    except ImportError:  # pragma: no cover - older amaranth-boards
        return targets
    targets.append(BoardTarget(
        name="icesugar", platform_class=ICESugarPlatform, family="ice40",
        description="MuseLab iCESugar 1.5, Lattice iCE40 UP5K",
        limits=_UP5K, clock="clk12", clock_mhz=12.0, uart=("uart", 0),
        uart_note="iCELink (on-board CMSIS-DAP) USB serial port",
        leds=(("led", 1), ("led", 0)),
        flash_tool="icesprog", flash_args=("{bitstream}",)))
    return targets


def _ulx3s_target(size: str, platform_class, limits) -> BoardTarget:
    return BoardTarget(
        name=f"ulx3s-{size}f", platform_class=platform_class, family="ecp5",
        description=f"Radiona ULX3S, Lattice ECP5 LFE5U-{size.upper()}F",
        limits=limits, clock="clk25", clock_mhz=25.0, uart=("uart", 0),
        uart_note="FTDI FT231X on the US1 USB port",
        leds=(("led", 0), ("led", 7)),
        flash_tool="openFPGALoader", flash_args=("-b", "ulx3s", "-m", "{bitstream}"))


# The OrangeCrab has no UART wired to a USB bridge: its USB connector goes straight to the
# FPGA, so its default host link is that port as a USB CDC-ACM serial device (LUNA gateware).
# The UART link remains selectable: the Feather convention puts RX on header pin 0 and TX on
# pin 1, where the host needs a 3.3 V USB-UART adapter. Its RGB LED is also offered as plain
# LEDs so the wrapper can find them.
_ORANGECRAB_EXTRA = (
    UARTResource(0, rx="0", tx="1", conn=("io", 0), attrs=Attrs(IO_TYPE="LVCMOS33",
                                                                  PULLMODE="UP")),
    *LEDResources(pins="K4 M3 J3", invert=True, attrs=Attrs(IO_TYPE="LVCMOS33")),
)


def _orangecrab_targets() -> list[BoardTarget]:
    try:
        from amaranth_boards.orangecrab_r0_2 import (
            OrangeCrabR0_2_25FPlatform,
            OrangeCrabR0_2_85FPlatform,
        )
    except ImportError:  # pragma: no cover - older amaranth-boards
        return []
    return [BoardTarget(
        name=f"orangecrab-{size}f", platform_class=cls, family="ecp5",
        description=f"Good Stuff Department OrangeCrab r0.2, Lattice ECP5 LFE5U-{size}F",
        limits=limits, clock="clk", clock_mhz=48.0, uart=("uart", 0),
        uart_note="external 3.3 V USB-UART adapter on Feather header pins 0 (RX) and 1 (TX)",
        leds=(("led", 1), ("led", 0)),
        flash_tool="dfu-util", flash_args=("-a", "0", "-D", "{bitstream}"),
        extra_resources=_ORANGECRAB_EXTRA, link="usb", usb=("usb", 0),
        usb_note="the board's own USB-C port: a CDC-ACM serial device (Linux /dev/ttyACM0, "
                 "macOS /dev/cu.usbmodem*, Windows COMn)")
        for size, cls, limits in (("25", OrangeCrabR0_2_25FPlatform, _ECP5_25F),
                                  ("85", OrangeCrabR0_2_85FPlatform, _ECP5_85F))]


def _gowin_targets() -> list[BoardTarget]:
    try:
        from amaranth_boards.tang_nano_9k import TangNano9kPlatform
    except ImportError:  # pragma: no cover - older amaranth-boards
        return []
    return [BoardTarget(
        name="tangnano9k", platform_class=TangNano9kPlatform, family="gowin",
        description="Sipeed Tang Nano 9K, Gowin GW1NR-9", limits=_GW1NR_9,
        clock="clk27", clock_mhz=27.0, uart=("uart", 0),
        uart_note="BL702 USB bridge (second USB serial port)",
        leds=(("led", 0), ("led", 1)),
        flash_tool="openFPGALoader", flash_args=("-b", "tangnano9k", "{bitstream}"))]


_TARGETS: dict[str, BoardTarget] = {t.name: t for t in [
    *_ice40_targets(),
    _ulx3s_target("12", ULX3S_12F_Platform, _ECP5_12F),
    _ulx3s_target("25", ULX3S_25F_Platform, _ECP5_25F),
    _ulx3s_target("45", ULX3S_45F_Platform, _ECP5_45F),
    _ulx3s_target("85", ULX3S_85F_Platform, _ECP5_85F),
    *_orangecrab_targets(),
    *_gowin_targets(),
]}


class UnknownBoardError(Onnx2FpgaError, ValueError):
    """A board name that is not in the registry."""


def list_boards() -> list[str]:
    """Names of every registered board, sorted."""
    return sorted(_TARGETS)


def get_board(name) -> BoardTarget:
    """The target registered as ``name`` (case-insensitive); a :class:`BoardTarget` is returned
    as it is.

    Raises
    ------
    TypeError
        If ``name`` is not a string.
    UnknownBoardError
        If no board has that name; the message lists the valid names.
    """
    if isinstance(name, BoardTarget):
        return name
    if not isinstance(name, str):
        raise TypeError(f"Board name must be a string, not {name!r}")
    try:
        return _TARGETS[name.lower()]
    except KeyError:
        raise UnknownBoardError(f"Unknown board {name!r}; valid boards are: "
                                f"{', '.join(list_boards())}") from None
