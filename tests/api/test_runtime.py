"""The host link: the frame protocol, retries, the handshake, and the whole serial path against
a simulated board (the framed wrapper and top.v in Verilator), with bytes corrupted on the
line in both directions."""

import dataclasses
import json
import re
import struct

import numpy as np
import pytest

import onnx2fpga
from onnx2fpga.boards.protocol import (
    SYNC,
    BoardInfo,
    ErrorCode,
    FrameDecoder,
    FrameType,
    Link,
    LinkError,
    LinkTimeout,
    crc16,
    encode_frame,
)
from onnx2fpga.cli import main
from onnx2fpga.runtime import Board, BoardMismatchError
from tests.helpers.models import float_mlp, save

# ---------------------------------------------------------------------------------------------
# Protocol


def test_crc16_check_value():
    assert crc16(b"123456789") == 0x29B1          # CRC-16/CCITT-FALSE's catalogue value
    assert crc16(b"6789", crc16(b"12345")) == 0x29B1


def test_frame_layout():
    frame = encode_frame(FrameType.INFER, 0x12, b"\x01\x02\x03")
    body = bytes([0x02, 0x12, 3, 0, 1, 2, 3])
    assert frame == SYNC + body + struct.pack("<H", crc16(body))


def test_decoder_finds_frames_in_noise_and_split_reads():
    a, b = encode_frame(FrameType.HELLO_REPLY, 1, bytes(17)), encode_frame(FrameType.ERROR, 2,
                                                                           b"\x04")
    stream = b"\x00\xa5\x13" + a + b"\xa5" + b
    dec = FrameDecoder()
    frames = [f for k in range(len(stream)) for f in dec.feed(stream[k:k + 1])]
    assert [(f.type, f.seq, f.crc_ok) for f in frames] == [(0x81, 1, True), (0xFF, 2, True)]


def test_decoder_flags_bad_crc():
    frame = bytearray(encode_frame(FrameType.INFER_REPLY, 3, b"abcd"))
    frame[7] ^= 1
    (f,) = FrameDecoder().feed(bytes(frame))
    assert (f.seq, f.crc_ok) == (3, False)


class FakeBoard:
    """The board's protocol in Python, with a fault script: a transport for :class:`Link`.

    ``script`` lists what to do with each request in turn: ``"ok"``, ``"silent"`` (no reply),
    ``"bad-crc"`` (reply with one bit flipped), ``"error"`` (an ERROR BAD_CRC reply),
    ``"stale"`` (first a good reply with another seq, then the right one).
    """

    def __init__(self, design_id, in_bytes, out_bytes, script=(), compute=None):
        self.info = BoardInfo(1, design_id, in_bytes, out_bytes, 12000)
        self.script = list(script)
        self.compute = compute or (lambda payload: bytes(out_bytes))
        self.outbox = bytearray()
        self.decoder = FrameDecoder()
        self.requests = []

    def write(self, data):
        for frame in self.decoder.feed(data):
            self.requests.append(frame.type)
            action = self.script.pop(0) if self.script else "ok"
            if frame.type == FrameType.HELLO:
                reply = encode_frame(FrameType.HELLO_REPLY, frame.seq, self.info.pack())
            else:
                reply = encode_frame(FrameType.INFER_REPLY, frame.seq,
                                     self.compute(frame.payload))
            if action == "silent":
                continue
            if action == "bad-crc":
                reply = bytearray(reply)
                reply[-3] ^= 0x40
            elif action == "error":
                reply = encode_frame(FrameType.ERROR, frame.seq, bytes([ErrorCode.BAD_CRC]))
            elif action == "stale":
                self.outbox += encode_frame(reply[2], (frame.seq - 1) & 0xFF, reply[6:-2])
            self.outbox += reply

    def read(self, n, timeout):
        data = bytes(self.outbox[:n])
        del self.outbox[:n]
        return data

    def reset_input(self):
        self.outbox.clear()


@pytest.mark.parametrize("script, retries, errors", [
    ([], 0, {}),
    (["bad-crc"], 1, {}),
    (["error", "error"], 2, {"BAD_CRC": 2}),
    (["silent"], 1, {}),
    (["stale"], 0, {}),
])
def test_link_retries(script, retries, errors):
    board = FakeBoard(bytes(8), 4, 2, ["ok"] + script, compute=lambda p: p[:2])
    link = Link(board, timeout=0.05, retries=3, quiet=0.01)
    assert link.hello().in_bytes == 4
    assert link.infer(b"\x01\x02\x03\x04", 2) == b"\x01\x02"
    assert link.stats["retries"] == retries
    assert link.stats["error_replies"] == errors
    assert link.stats["stale"] == script.count("stale")


def test_link_gives_up():
    board = FakeBoard(bytes(8), 4, 2, ["silent"] * 3)
    with pytest.raises(LinkTimeout, match=r"^HELLO failed after 3 attempt\(s\); the last one "
                                          r"got no reply within 0.05 s$"):
        Link(board, timeout=0.05, retries=2, quiet=0.01).hello()
    board = FakeBoard(bytes(8), 4, 2, ["ok", "error", "bad-crc"])
    link = Link(board, timeout=0.05, retries=1, quiet=0.01)
    link.hello()
    with pytest.raises(LinkError, match=r"^INFER failed after 2 attempt\(s\); the last one got "
                                        r"a reply with a bad CRC$"):
        link.infer(bytes(4), 2)


# ---------------------------------------------------------------------------------------------
# A small design, its golden outputs, and the simulated board


@pytest.fixture(scope="module")
def design(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runtime")
    model = save(float_mlp((16, 8, 4)), tmp / "mlp.onnx")
    cal = np.random.default_rng(1).standard_normal((64, 1, 16)).astype(np.float32)
    return onnx2fpga.compile(model, tmp / "design", calibration=cal)


def _x(n, seed):
    return np.random.default_rng(seed).standard_normal((n, 1, 16)).astype(np.float32)


def test_handshake_refuses_another_design(design):
    fake = FakeBoard(bytes.fromhex("00112233deadbeef"), 16, 4)
    want = design.manifest["top"]["verilog_sha256"][:16]
    with pytest.raises(BoardMismatchError, match=(
            rf"^The board runs design 00112233deadbeef \(16 bytes in, 4 out\), not {want} from "
            rf"{design.directory} \(16 in, 4 out\); flash it with 'onnx2fpga flash "
            rf"{design.directory} --board NAME'$")):
        Board(design, fake, timeout=0.05, quiet=0.01)


class _LaterHello:
    """A HELLO reply as a later protocol version might send it: version 3, 30 bytes."""

    def pack(self):
        return bytes([3]) + bytes(29)


@pytest.mark.parametrize("version", [2, 3, 0])
def test_connect_refuses_another_protocol_version(design, monkeypatch, tmp_path, capsys,
                                                  version):
    # Before: the version in the HELLO reply was never looked at (2 and 0 were accepted, a
    # longer reply of a later version timed out as noise).
    import onnx2fpga.runtime

    df = design.design.dataflow
    fake = FakeBoard(bytes.fromhex(design.manifest["top"]["verilog_sha256"][:16]),
                     df.input.tdata_width // 8 * df.input.beats,
                     df.output.tdata_width // 8 * df.output.beats)
    if version == 3:
        fake.info = _LaterHello()
    else:
        fake.info = dataclasses.replace(fake.info, version=version)
    monkeypatch.setattr(onnx2fpga.runtime, "SerialTransport", lambda port, baud: fake)
    message = (f"The board speaks host link protocol version {version}, this onnx2fpga speaks "
               f"version 1; flash it with this onnx2fpga ('onnx2fpga flash {design.directory} "
               f"--board NAME') or talk to it with the onnx2fpga that built it")
    with pytest.raises(BoardMismatchError, match=f"^{re.escape(message)}$"):
        onnx2fpga.connect(design.directory, port="fake", timeout=0.05, retries=0)
    np.save(tmp_path / "x.npy", _x(1, 0))
    code = main(["run", design.directory, "--port", "fake", "--inputs", str(tmp_path / "x.npy"),
                 "--outputs", str(tmp_path / "y.npy"), "--timeout", "0.05", "--retries", "0"])
    assert code == 2
    assert capsys.readouterr().err == f"error: {message}\n"
    assert not (tmp_path / "y.npy").exists()


def test_board_runs_head_and_tail_around_the_link(design):
    # A fake board computing with the golden model: infer() must equal simulate().
    from onnx2fpga.sim import golden
    from onnx2fpga.sim.rtl import pack_beats, unpack_beats

    df = design.design.dataflow

    def compute(payload):
        n = df.input.tdata_width // 8
        words = [int.from_bytes(payload[k:k + n], "little") for k in range(0, len(payload), n)]
        y = golden.run_dataflow(df, unpack_beats(words, df.input))
        m = df.output.tdata_width // 8
        return b"".join(w.to_bytes(m, "little") for w in pack_beats(y, df.output))

    fake = FakeBoard(bytes.fromhex(design.manifest["top"]["verilog_sha256"][:16]),
                     df.input.tdata_width // 8 * df.input.beats,
                     df.output.tdata_width // 8 * df.output.beats, compute=compute)
    board = Board(design, fake, timeout=0.05, quiet=0.01)
    x = _x(5, 2)
    np.testing.assert_array_equal(board.infer(x), design.simulate(x, engine="golden"))
    one = board.infer(x[0])                               # one sample, the model's own shape
    assert one.shape == (1, 4) and one.dtype == np.float32


@pytest.mark.rtl
def test_sim_board_equals_golden_with_corruption(design):
    x = _x(10, 3)
    golden = design.simulate(x, engine="golden")
    # Frames are 8 + 16 bytes to the board and 8 + 4 back; HELLO is 8 out, 8 + 17 back.
    faults = {"to_board": {8 + 5: 0x01, 8 + 24 * 2 + 12: 0x80, 8 + 24 * 4 + 1: 0xFF},
              "to_host": {25 + 12 * 1 + 9: 0x04, 25 + 12 * 5: 0x10}}
    with onnx2fpga.connect(design.directory, sim=True, timeout=3.0,
                           sim_options={"faults": faults}) as board:
        assert board.info.design_id.hex() == design.manifest["top"]["verilog_sha256"][:16]
        y = board.infer(x)
        stats = dict(board.link.stats)
    np.testing.assert_array_equal(y, golden)
    assert stats["retries"] >= 3      # flips in one exchange may share a retry
    assert stats["crc_errors"] >= 1 and sum(stats["error_replies"].values()) >= 1
    line = board.transport.stats
    assert line["flipped"] == {"to_board": 3, "to_host": 2}
    assert line["tlast_error"] == 0 and line["overrun"] == 0
    assert line["frames_bad"] >= 2


@pytest.mark.rtl
def test_sim_board_half_frame_times_out(design):
    from onnx2fpga.boards.simboard import SimBoard

    with SimBoard(design.directory) as sim:
        link = Link(sim, timeout=3.0, retries=0, quiet=0.2)
        sim.write(encode_frame(FrameType.HELLO, 200)[:5])          # the host dies mid-frame
        frames, decoder = [], FrameDecoder()
        for _ in range(100):
            frames += decoder.feed(sim.read(64, 0.1))
            if frames:
                break
        assert [(f.type, f.seq, f.payload) for f in frames] == [
            (FrameType.ERROR, 200, bytes([ErrorCode.TIMEOUT]))]
        assert link.hello().design_id.hex() == design.manifest["top"]["verilog_sha256"][:16]


@pytest.mark.rtl
def test_cli_run_sim_with_random_flips(design, tmp_path, capsys):
    x = _x(12, 4)
    np.save(tmp_path / "x.npy", x)
    code = main(["run", design.directory, "--sim", "--inputs", str(tmp_path / "x.npy"),
                 "--outputs", str(tmp_path / "y.npy"), "--flip-probability", "0.01",
                 "--seed", "7", "--timeout", "3", "--retries", "8", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    result = json.loads(out)
    assert result["inferences"] == 12 and result["output_shape"] == [12, 1, 4]
    assert result["retries"] >= 1
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"),
                                  design.simulate(x, engine="golden"))


def test_cli_run_needs_port_or_sim(design, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["run", design.directory, "--inputs", "x.npy", "--outputs", "y.npy"])
    assert "one of the arguments --port --sim is required" in capsys.readouterr().err


def test_cli_run_bad_port(design, tmp_path, capsys):
    np.save(tmp_path / "x.npy", _x(1, 0))
    pytest.importorskip("serial")
    code = main(["run", design.directory, "--port", str(tmp_path / "no-such-tty"), "--inputs",
                 str(tmp_path / "x.npy"), "--outputs", str(tmp_path / "y.npy")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"error: Cannot open serial port '{tmp_path / 'no-such-tty'}': ")
    assert not (tmp_path / "y.npy").exists()
