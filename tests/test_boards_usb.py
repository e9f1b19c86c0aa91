"""The USB CDC-ACM link (boards/link.py) in Amaranth's simulator: the framed bridge in ``sync``,
the two asynchronous FIFOs, and on the ``usb`` side either a testbench standing in for the
ACM endpoints or LUNA's real USB device driven at its UTMI interface by a small host model
(enumeration, bulk OUT with a request frame, bulk IN for the reply)."""

import gc

import pytest
from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator

from onnx2fpga.boards.framed import FramedBridge
from onnx2fpga.boards.link import UsbAcmLink, check_link
from onnx2fpga.boards.loopback import ByteIncrement
from onnx2fpga.boards.protocol import (
    BoardInfo,
    ErrorCode,
    FrameDecoder,
    FrameType,
    encode_frame,
)
from onnx2fpga.boards.wrapper import UartBridge

DESIGN_ID = bytes.fromhex("0123456789abcdef")
PAYLOAD = bytes([0, 255, 7, 8, 0x55, 0xA5])   # 3 beats of 16 bits; 0xA5 is a sync byte


def _expected(data):
    return bytes((b + 1) % 256 for b in data)


def _top(bridge):
    top = Module()
    top.domains.sync = ClockDomain("sync")
    top.domains.usb = ClockDomain("usb")
    top.submodules.bridge = bridge
    return top


def _run_stand_in(bridge, chunks, *, expect_bytes, usb_period, read_after=0, read_every=1,
                  budget=40_000):
    """Play the ACM endpoints in the ``usb`` domain: push ``chunks`` (bytes, or ``("idle",
    n)`` usb cycles) into ``usb_rx`` honouring ``ready``; take bytes from ``usb_tx`` (only
    after ``read_after`` usb cycles, then one every ``read_every`` cycles).

    Returns ``(received, last_flags, pushed_at_stall)``: the bytes, ``usb_tx_last`` with each
    byte, and how many bytes had been accepted when the reader started.
    """
    received, lasts, stall = [], [], []
    sent_all = [False]

    async def host_out(ctx):
        for chunk in chunks:
            if isinstance(chunk, tuple):
                if chunk[1]:
                    await ctx.tick("usb").repeat(chunk[1])
                continue
            for byte in chunk:
                ctx.set(bridge.usb_rx.payload, byte)
                ctx.set(bridge.usb_rx.valid, 1)
                await ctx.tick("usb").until(bridge.usb_rx.ready)
            ctx.set(bridge.usb_rx.valid, 0)
        sent_all[0] = True

    async def host_in(ctx):
        cycles = 0
        if read_after:
            await ctx.tick("usb").repeat(read_after)
            cycles += read_after
            stall.append(sent_all[0])
        while len(received) < expect_bytes and cycles < budget:
            ready = cycles % read_every == 0
            ctx.set(bridge.usb_tx.ready, ready)
            _, _, valid, data, last = await ctx.tick("usb").sample(
                bridge.usb_tx.valid, bridge.usb_tx.payload, bridge.usb_tx_last)
            cycles += 1
            if valid and ready:
                received.append(data)
                lasts.append(last)
        ctx.set(bridge.usb_tx.ready, 0)

    sim = Simulator(_top(bridge))
    sim.add_clock(1e-6, domain="sync")
    sim.add_clock(usb_period, domain="usb")
    sim.add_testbench(host_out)
    sim.add_testbench(host_in)
    sim.run()
    return bytes(received), lasts, stall


def _usb_bridge(width=16, beats=3, **kwargs):
    return FramedBridge(ByteIncrement(width), width, width, beats, beats, clk_freq=1_000_000,
                        design_id=DESIGN_ID, link="usb", **kwargs)


def _frames(data):
    return FrameDecoder().feed(data)


def _reply_ends(received, frames):
    """Indices of the last byte of each reply in ``received``."""
    ends, pos = [], 0
    for frame in frames:
        pos += 8 + len(frame.payload)
        ends.append(pos - 1)
    assert pos == len(received)
    return ends


# The usb clock slower (12 MHz against 48 MHz on the board) and faster than sync, with a
# period that is no multiple of sync's.
@pytest.mark.parametrize("usb_period", [3.7e-6, 0.29e-6])
@pytest.mark.parametrize("gap", [0, 300])
def test_usb_link_hello_and_infer(usb_period, gap):
    requests = [encode_frame(FrameType.HELLO, 7), ("idle", gap),
                encode_frame(FrameType.INFER, 1, PAYLOAD), ("idle", gap),
                encode_frame(FrameType.INFER, 2, bytes(range(6)))]
    expect = 8 + 17 + 2 * (8 + 6)
    received, lasts, _ = _run_stand_in(_usb_bridge(), requests, expect_bytes=expect,
                                       usb_period=usb_period)
    frames = _frames(received)
    assert [(f.type, f.seq, f.crc_ok) for f in frames] == [
        (FrameType.HELLO_REPLY, 7, True), (FrameType.INFER_REPLY, 1, True),
        (FrameType.INFER_REPLY, 2, True)]
    assert BoardInfo.unpack(frames[0].payload) == BoardInfo(1, DESIGN_ID, 6, 6, 1000)
    assert frames[1].payload == _expected(PAYLOAD)
    assert frames[2].payload == _expected(bytes(range(6)))
    # A byte after which nothing more is waiting is flagged, so that LUNA's IN endpoint sends
    # a short packet at once: the end of every reply when the requests come apart, the end of
    # the last one when they come back to back (the next reply's bytes follow directly). A
    # byte that crossed the FIFO before the next one was written is flagged too (a reply may
    # go out as two packets; the byte stream is the same).
    ends = _reply_ends(received, frames)
    flagged = {i for i, last in enumerate(lasts) if last}
    assert set(ends if gap else ends[-1:]) <= flagged
    assert len(flagged) < len(received) // 4


def test_usb_link_bad_crc_gets_error_frame():
    frame = bytearray(encode_frame(FrameType.INFER, 9, PAYLOAD))
    frame[8] ^= 0x10
    received, _, _ = _run_stand_in(_usb_bridge(), [bytes(frame), encode_frame(
        FrameType.INFER, 10, PAYLOAD)], expect_bytes=9 + 14, usb_period=3.7e-6)
    assert [(f.type, f.seq, f.payload) for f in _frames(received)] == [
        (FrameType.ERROR, 9, bytes([ErrorCode.BAD_CRC])),
        (FrameType.INFER_REPLY, 10, _expected(PAYLOAD))]


def test_usb_link_half_frame_times_out():
    bridge = _usb_bridge(timeout_cycles=2000)      # 2 ms at 1 MHz: the least allowed
    frame = encode_frame(FrameType.INFER, 4, PAYLOAD)
    received, _, _ = _run_stand_in(bridge, [frame[:7], ("idle", 800), encode_frame(
        FrameType.INFER, 5, PAYLOAD)], expect_bytes=9 + 14, usb_period=3.7e-6)
    assert [(f.type, f.seq, f.payload) for f in _frames(received)] == [
        (FrameType.ERROR, 4, bytes([ErrorCode.TIMEOUT])),
        (FrameType.INFER_REPLY, 5, _expected(PAYLOAD))]


def test_usb_link_loses_nothing_when_the_host_does_not_read():
    # 40 INFER frames (560 bytes) while the host reads nothing: the replies fill the transmit
    # FIFO, the bridge stops, the receive FIFO fills and the OUT side is held off (not ready)
    # instead of dropping bytes. Then the host reads slowly; every reply arrives, in order.
    payloads = [bytes((i * 7 + j) % 256 for j in range(6)) for i in range(40)]
    requests = [encode_frame(FrameType.INFER, i, p) for i, p in enumerate(payloads)]
    bridge = _usb_bridge(usb_fifo_depth=16)
    received, _, stall = _run_stand_in(bridge, requests, expect_bytes=40 * 14,
                                       usb_period=0.29e-6, read_after=3000, read_every=3,
                                       budget=60_000)
    assert stall == [False]           # the host's bytes were still being held off
    frames = _frames(received)
    assert [(f.type, f.seq, f.payload, f.crc_ok) for f in frames] == [
        (FrameType.INFER_REPLY, i, _expected(p), True) for i, p in enumerate(payloads)]


def test_raw_bridge_over_usb():
    bridge = UartBridge(ByteIncrement(8), 8, 8, 2, 2, clk_freq=1_000_000, link="usb")
    data = bytes([1, 2, 255, 0x7F])
    received, lasts, _ = _run_stand_in(bridge, [data], expect_bytes=4, usb_period=3.7e-6)
    assert received == _expected(data) and lasts[-1] == 1
    assert bridge.divisor is None


@pytest.mark.filterwarnings("ignore:.*created but never used")
def test_usb_link_checks_arguments():
    with pytest.raises(ValueError, match=r"^Link must be one of 'uart', 'usb', not 'spi'$"):
        check_link("spi")
    with pytest.raises(ValueError, match=r"^Link must be one of 'uart', 'usb', not 'USB'$"):
        FramedBridge(ByteIncrement(8), 8, 8, 1, 1, clk_freq=48e6, design_id=bytes(8),
                     link="USB")
    with pytest.raises(ValueError, match=r"^Timeout must be an integer of at least 96000 "
                                         r"cycles \(two USB frames\), not 1000$"):
        FramedBridge(ByteIncrement(8), 8, 8, 1, 1, clk_freq=48e6, design_id=bytes(8),
                     link="usb", timeout_cycles=1000)
    with pytest.raises(ValueError, match=r"^USB FIFO depth must be a power of 2 of at least "
                                         r"2, not 48$"):
        UsbAcmLink(48)
    # No UART on USB: a baud rate the 48 MHz clock cannot make is not an error there.
    assert _usb_bridge(baud=7).divisor is None
    gc.collect()
