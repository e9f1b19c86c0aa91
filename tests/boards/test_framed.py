"""The framed board wrapper, simulated at the pin level (Amaranth's simulator, real 8N1 bits):
replies, ERROR frames for bad CRC / length / type, the byte timeout, reset mid-frame."""

import gc

import pytest
from amaranth.hdl import Cat, ClockDomain, ClockSignal, Fragment, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from onnx2fpga.boards.framed import FSM_ENCODINGS, FramedBridge
from onnx2fpga.boards.loopback import ByteIncrement
from onnx2fpga.boards.protocol import (
    SYNC,
    BoardInfo,
    ErrorCode,
    FrameDecoder,
    FrameType,
    encode_frame,
)
from onnx2fpga.hw.testing import watch_collisions

DIVISOR = 4
TIMEOUT = 40 * DIVISOR           # 4 byte times
DESIGN_ID = bytes.fromhex("0123456789abcdef")


def _bridge(width=16, beats=3, accelerator=None, encoding="one-hot", **options):
    acc = accelerator if accelerator is not None else ByteIncrement(width)
    return FramedBridge(acc, width, width, beats, beats, clk_freq=4_000, baud=1_000,
                        design_id=DESIGN_ID, timeout_cycles=TIMEOUT, fsm_encoding=encoding,
                        **options)


@pytest.fixture(params=FSM_ENCODINGS)
def encoding(request):
    """The protocol tests run with both state machine encodings (one-hot: iCE40 builds,
    binary: ECP5 builds)."""
    return request.param


def _run(bridge, script, *, expect_frames, budget=60_000):
    """Play ``script`` on ``rx``: items are bytes (sent back to back), ``("idle", n)`` cycles
    with the line high, or ``("reset",)`` (one cycle of synchronous reset). Decode ``tx``
    until ``expect_frames`` frames came back or the cycle budget is spent.

    Returns ``(frames, beats, flags)``: the reply frames, the accelerator's input beats
    ``(data, last)`` and the wrapper's status signals at the end.
    """
    d = bridge.divisor
    acc = bridge.accelerator
    top = Module()
    top.domains.sync = domain = ClockDomain("sync")
    # The testbenches count cycles on a reset-less copy of the clock, so that a reset of
    # the bridge does not interrupt them.
    top.domains.tb = ClockDomain("tb", reset_less=True)
    top.d.comb += ClockSignal("tb").eq(ClockSignal("sync"))
    top.submodules.bridge = bridge
    frames, beats, flags = [], [], {}
    decoder = FrameDecoder()
    done = [False]

    async def drive(ctx):
        for item in script:
            if isinstance(item, tuple) and item[0] == "idle":
                await ctx.tick("tb").repeat(item[1])
            elif isinstance(item, tuple) and item[0] == "reset":
                ctx.set(bridge.rx, 1)
                await ctx.tick("tb").repeat(d)
                ctx.set(domain.rst, 1)
                await ctx.tick("tb").repeat(2)
                ctx.set(domain.rst, 0)
            else:
                for byte in item:
                    for bit in [0] + [(byte >> i) & 1 for i in range(8)] + [1]:
                        ctx.set(bridge.rx, bit)
                        await ctx.tick("tb").repeat(d)
        done[0] = True

    async def receive(ctx):
        cycles = 0
        while len(frames) < expect_frames and cycles < budget:
            if ctx.get(bridge.tx):
                await ctx.tick("tb")
                cycles += 1
                continue
            await ctx.tick("tb").repeat(d // 2)
            byte = 0
            for i in range(8):
                await ctx.tick("tb").repeat(d)
                byte |= ctx.get(bridge.tx) << i
            await ctx.tick("tb").repeat(d)
            assert ctx.get(bridge.tx) == 1, "missing stop bit"
            cycles += 10 * d
            frames.extend(decoder.feed(bytes([byte])))
        while not done[0]:
            await ctx.tick("tb")
        await ctx.tick("tb").repeat(2 * TIMEOUT)
        for name in ("overrun", "framing_error", "tlast_error", "error_led", "frames_ok",
                     "frames_bad"):
            flags[name] = ctx.get(getattr(bridge, name))

    async def monitor(ctx):
        while True:
            _, _, valid, ready, data, last = await ctx.tick("tb").sample(
                acc.s_axis_tvalid, acc.s_axis_tready, acc.s_axis_tdata, acc.s_axis_tlast)
            if valid and ready:
                beats.append((data, last))

    fragment = Fragment.get(top, None)
    sim = Simulator(fragment)
    sim.add_clock(1e-6, domain="sync")
    watch_collisions(sim, fragment)     # the input buffer promises no read-write collision
    sim.add_testbench(drive)
    sim.add_testbench(receive)
    sim.add_testbench(monitor, background=True)
    sim.run()
    return frames, beats, flags


def _expected(data):
    return bytes((b + 1) % 256 for b in data)


def _beats(data, width=16):
    n = width // 8
    return [int.from_bytes(bytes(data[i:i + n]), "little") for i in range(0, len(data), n)]


PAYLOAD = bytes([0, 255, 7, 8, 0x55, 0xA5])   # 3 beats of 16 bits; 0xA5 is a sync byte


def test_hello_reply(encoding):
    bridge = _bridge(encoding=encoding)
    frames, beats, flags = _run(bridge, [encode_frame(FrameType.HELLO, 7)], expect_frames=1)
    assert len(frames) == 1 and frames[0].crc_ok
    assert (frames[0].type, frames[0].seq) == (FrameType.HELLO_REPLY, 7)
    assert BoardInfo.unpack(frames[0].payload) == BoardInfo(1, DESIGN_ID, 6, 6, 4)
    assert beats == []
    assert flags["frames_ok"] == 1 and flags["frames_bad"] == 0 and flags["error_led"] == 0


def test_infer_reply_back_to_back(encoding):
    second = bytes(range(6))
    bridge = _bridge(encoding=encoding)
    frames, beats, flags = _run(bridge, [encode_frame(FrameType.INFER, 1, PAYLOAD),
                                         encode_frame(FrameType.INFER, 2, second)],
                                expect_frames=2)
    assert [(f.type, f.seq, f.payload, f.crc_ok) for f in frames] == [
        (FrameType.INFER_REPLY, 1, _expected(PAYLOAD), True),
        (FrameType.INFER_REPLY, 2, _expected(second), True)]
    assert [d for d, _ in beats] == _beats(PAYLOAD) + _beats(second)
    assert [last for _, last in beats] == [0, 0, 1, 0, 0, 1]
    assert flags == {"overrun": 0, "framing_error": 0, "tlast_error": 0, "error_led": 0,
                     "frames_ok": 2, "frames_bad": 0}


def test_input_buffer_keeps_the_payload_bits_only():
    # 10 significant bits of a 16-bit beat: the accelerator gets them, the padding as zeros
    # (the host packs zeros there too), and the reply is computed from what it got.
    acc = ByteIncrement(16)
    bridge = FramedBridge(acc, 16, 16, 3, 3, clk_freq=4_000, baud=1_000, design_id=DESIGN_ID,
                          timeout_cycles=TIMEOUT, in_payload_width=10)
    frames, beats, _ = _run(bridge, [encode_frame(FrameType.INFER, 3, PAYLOAD)],
                            expect_frames=1)
    fed = [d & 0x3FF for d in _beats(PAYLOAD)]
    assert [d for d, _ in beats] == fed
    sent = b"".join(v.to_bytes(2, "little") for v in fed)
    assert frames[0].payload == _expected(sent) and frames[0].crc_ok
    with pytest.raises(ValueError, match=r"^Input payload width must be an integer in "
                                         r"\[1, 16\], not 17$"):
        FramedBridge(ByteIncrement(16), 16, 16, 1, 1, clk_freq=12e6, design_id=bytes(8),
                     in_payload_width=17)


class _Stutter(wiring.Component):
    """ByteIncrement whose input is ready only when a 5-bit LFSR's low bit is set: the wrapper's
    feeder sees its ready drop in irregular runs, also mid-beat-sequence."""

    def __init__(self, width):
        self._inner = ByteIncrement(width)
        super().__init__(dict(self._inner.signature.members))

    def elaborate(self, platform):
        m = Module()
        m.submodules.inner = inner = self._inner
        lfsr = Signal(5, init=0b10101)
        m.d.sync += lfsr.eq(Cat(lfsr[1:], lfsr[0] ^ lfsr[2]))
        for name in ("s_axis_tdata", "s_axis_tlast", "m_axis_tready"):
            m.d.comb += getattr(inner, name).eq(getattr(self, name))
        for name in ("m_axis_tdata", "m_axis_tvalid", "m_axis_tlast"):
            m.d.comb += getattr(self, name).eq(getattr(inner, name))
        m.d.comb += [inner.s_axis_tvalid.eq(self.s_axis_tvalid & lfsr[0]),
                     self.s_axis_tready.eq(inner.s_axis_tready & lfsr[0])]
        return m


@pytest.mark.parametrize("beats, bank_beats", [(8, 2048), (8, 2), (7, 2), (7, 4)])
def test_feeder_keeps_order_under_irregular_input_stalls(beats, bank_beats):
    # The feeder's skid register holds a beat whenever the accelerator drops ready, and its
    # read pipeline (three stages when the buffer is banked, the last bank partly used)
    # holds its words; nothing is lost, repeated or reordered, and tlast marks the last beat.
    data = bytes(range(37, 37 + 2 * beats))                         # 16-bit beats
    bridge = _bridge(beats=beats, accelerator=_Stutter(16), bank_beats=bank_beats)
    frames, beats_fed, flags = _run(bridge, [encode_frame(FrameType.INFER, 6, data),
                                             ("idle", 1500),
                                             encode_frame(FrameType.INFER, 7, data[::-1])],
                                    expect_frames=2, budget=120_000)
    assert [(f.seq, f.payload, f.crc_ok) for f in frames] == [
        (6, _expected(data), True), (7, _expected(data[::-1]), True)]
    assert [d for d, _ in beats_fed] == _beats(data) + _beats(data[::-1])
    assert [last for _, last in beats_fed] == ([0] * (beats - 1) + [1]) * 2
    assert flags["tlast_error"] == 0 and flags["frames_ok"] == 2
    with pytest.raises(ValueError, match=r"^Bank beats must be a power of 2, not 3$"):
        _bridge(bank_beats=3)


def test_bad_crc_is_answered_and_never_computed(encoding):
    frame = bytearray(encode_frame(FrameType.INFER, 9, PAYLOAD))
    frame[8] ^= 0x10                                         # a payload bit
    bridge = _bridge(encoding=encoding)
    frames, beats, flags = _run(bridge, [bytes(frame), ("idle", 20),
                                         encode_frame(FrameType.INFER, 10, PAYLOAD)],
                                expect_frames=2)
    assert [(f.type, f.seq, f.payload) for f in frames] == [
        (FrameType.ERROR, 9, bytes([ErrorCode.BAD_CRC])),
        (FrameType.INFER_REPLY, 10, _expected(PAYLOAD))]
    # Only the good frame reached the accelerator.
    assert [d for d, _ in beats] == _beats(PAYLOAD)
    assert flags["frames_bad"] == 1 and flags["frames_ok"] == 1 and flags["error_led"] == 0


@pytest.mark.parametrize("frame, code", [
    (encode_frame(FrameType.INFER, 3, PAYLOAD + b"\x00"), ErrorCode.BAD_LENGTH),
    (encode_frame(FrameType.INFER, 3, PAYLOAD[:4]), ErrorCode.BAD_LENGTH),
    (encode_frame(FrameType.HELLO, 3, b"\x01"), ErrorCode.BAD_LENGTH),
    (encode_frame(0x42, 3, PAYLOAD), ErrorCode.UNKNOWN_TYPE),
])
def test_bad_length_or_type_is_skipped_then_answered(frame, code, encoding):
    bridge = _bridge(encoding=encoding)
    frames, beats, flags = _run(bridge, [frame], expect_frames=1)
    assert [(f.type, f.seq, f.payload, f.crc_ok) for f in frames] == [
        (FrameType.ERROR, 3, bytes([code]), True)]
    assert beats == []
    assert flags["error_led"] == 1 and flags["frames_bad"] == 1


def test_half_frame_times_out_then_link_recovers(encoding):
    frame = encode_frame(FrameType.INFER, 4, PAYLOAD)
    bridge = _bridge(encoding=encoding)
    frames, beats, flags = _run(bridge, [frame[:7], ("idle", TIMEOUT + 50),
                                         encode_frame(FrameType.INFER, 5, PAYLOAD)],
                                expect_frames=2)
    assert [(f.type, f.seq, f.payload) for f in frames] == [
        (FrameType.ERROR, 4, bytes([ErrorCode.TIMEOUT])),
        (FrameType.INFER_REPLY, 5, _expected(PAYLOAD))]
    assert [d for d, _ in beats] == _beats(PAYLOAD)


def test_reset_mid_frame_recovers(encoding):
    frame = encode_frame(FrameType.INFER, 4, PAYLOAD)
    bridge = _bridge(encoding=encoding)
    frames, beats, flags = _run(bridge, [frame[:9], ("reset",),
                                         encode_frame(FrameType.INFER, 5, PAYLOAD)],
                                expect_frames=1)
    # The half frame is gone without an answer; the next frame is computed normally.
    assert [(f.type, f.seq, f.payload) for f in frames] == [
        (FrameType.INFER_REPLY, 5, _expected(PAYLOAD))]
    assert [d for d, _ in beats] == _beats(PAYLOAD)
    assert flags["frames_ok"] == 1 and flags["frames_bad"] == 0


def test_noise_before_a_frame_is_skipped(encoding):
    noise = bytes([0x00, SYNC[0], 0x13, SYNC[0], SYNC[0]])
    bridge = _bridge(encoding=encoding)
    frames, _, _ = _run(bridge, [noise + encode_frame(FrameType.HELLO, 1)], expect_frames=1)
    assert [(f.type, f.seq) for f in frames] == [(FrameType.HELLO_REPLY, 1)]


class _Stuck(wiring.Component):
    def __init__(self, width):
        super().__init__({
            "s_axis_tdata": In(width), "s_axis_tvalid": In(1), "s_axis_tready": Out(1),
            "s_axis_tlast": In(1), "m_axis_tdata": Out(width), "m_axis_tvalid": Out(1),
            "m_axis_tready": In(1), "m_axis_tlast": Out(1)})

    def elaborate(self, platform):
        return Module()


@pytest.mark.filterwarnings("ignore:.*created but never used")
def test_checks_arguments():
    with pytest.raises(ValueError, match=r"^Design id must be 8 bytes, not b'\\x01'$"):
        FramedBridge(_Stuck(8), 8, 8, 1, 1, clk_freq=12e6, design_id=b"\x01")
    with pytest.raises(ValueError, match=r"^Timeout must be an integer of at least 2080 cycles "
                                         r"\(two bytes\), not 100$"):
        FramedBridge(_Stuck(8), 8, 8, 1, 1, clk_freq=12e6, design_id=bytes(8),
                     timeout_cycles=100)
    with pytest.raises(ValueError, match=r"^Accelerator port 's_axis_tdata' must be 16 bits "
                                         r"wide, not 8$"):
        FramedBridge(_Stuck(8), 16, 8, 1, 1, clk_freq=12e6, design_id=bytes(8))
    gc.collect()


def test_fsm_encoding_is_checked():
    with pytest.raises(ValueError, match=r"^FSM encoding must be one of \('one-hot', "
                                         r"'binary'\), not 'gray'$"):
        FramedBridge(ByteIncrement(8), 8, 8, 1, 1, clk_freq=12e6, design_id=bytes(8),
                     fsm_encoding="gray")


def _crc16_bitwise(data, crc=0xFFFF):
    """CRC-16/CCITT-FALSE bit by bit, as the protocol documents it (polynomial 0x1021, MSB
    first, initial value 0xFFFF, no reflection, no final XOR)."""
    for byte in data:
        for i in range(7, -1, -1):
            feedback = ((byte >> i) & 1) ^ (crc >> 15)
            crc = ((crc << 1) & 0xFFFF) ^ (0x1021 if feedback else 0)
    return crc


def test_host_crc_equals_bitwise_reference_and_gateware():
    """The host's CRC (binascii.crc_hqx) against a bitwise implementation on random frames,
    and the gateware's per-byte CRC logic (simulated) against the same reference."""
    import random

    from onnx2fpga.boards.framed import crc16_byte
    from onnx2fpga.boards.protocol import crc16

    assert _crc16_bitwise(b"123456789") == 0x29B1     # the catalogue's check value
    rng = random.Random(7)
    for _ in range(200):
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300)))
        frame = encode_frame(rng.randrange(256), rng.randrange(256), body)
        assert crc16(frame[2:-2]) == _crc16_bitwise(frame[2:-2])
        assert frame[-2:] == _crc16_bitwise(frame[2:-2]).to_bytes(2, "little")
        split = rng.randrange(len(body) + 1)
        assert crc16(body[split:], crc16(body[:split])) == _crc16_bitwise(body)

    m = Module()
    crc, byte = Signal(16), Signal(8)
    out = Signal(16)
    m.d.comb += out.eq(crc16_byte(crc, byte))
    cases = [(rng.randrange(1 << 16), rng.randrange(256)) for _ in range(300)]
    got = []

    async def bench(ctx):
        for c, b in cases:
            ctx.set(crc, c)
            ctx.set(byte, b)
            got.append(ctx.get(out))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert got == [_crc16_bitwise(bytes([b]), c) for c, b in cases]
