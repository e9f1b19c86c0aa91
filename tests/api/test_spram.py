"""Weights in the iCEBreaker's SPRAMs, through the API: chosen automatically when the block
RAMs cannot hold them (with a log line) or asked for (``weights="spram"``), written as the
flash image ``weights.bin`` (its offset and hash in the manifest), and simulated in
Verilator with a model of the flash: the weights load at start-up, then the results equal
the golden model's, bit for bit, at the manifest's cycles per inference."""

import hashlib
import json

import numpy as np
import pytest

import onnx2fpga
from onnx2fpga.errors import DesignDirError, OptionError, SizeError
from onnx2fpga.plan.spram import FLASH_OFFSET, IMAGE_MAGIC
from tests.helpers.cli import run_cli
from tests.helpers.models import ort_qdq_cnn, qdq_matmul, save


def _check_image(d):
    spram = d.manifest["spram"]
    with open(f"{d.directory}/weights.bin", "rb") as f:
        image = f.read()
    assert spram["file"] == "weights.bin" and spram["flash_offset"] == FLASH_OFFSET
    assert spram["bytes"] == len(image) and image[:4] == IMAGE_MAGIC
    assert spram["sha256"] == hashlib.sha256(image).hexdigest()
    return image


def test_weights_beyond_block_ram_go_to_spram(tmp_path, capfd):
    """256 x 96 int8 weights (192 kbit) fit neither the UP5K's 30 block RAMs (120 kbit) nor
    those and its LUTs as ROM (151 kbit, refused with --weights rom): they go to SPRAM, at
    8 weights a cycle (4 SPRAMs of 16 bits side by side), and run bit-exactly."""
    model = save(qdq_matmul(256, 96), tmp_path / "mm.onnx")
    with pytest.raises(SizeError, match=r"^The weights take 192 kbit .* holds at most 151 "
                                        r"kbit of them"):
        onnx2fpga.compile(model, tmp_path / "rom", board="icebreaker", weights="rom")
    d = onnx2fpga.compile(model, tmp_path / "d", board="icebreaker", verbose=True)
    err = capfd.readouterr().err
    assert "weights in SPRAM: matvec_0/w_mem (loaded at start-up from the board's flash at " \
           "0x100000, weights.bin)" in err
    assert d.manifest["folding"]["spram_memories"] == ["matvec_0/w_mem"]
    assert d.manifest["cycles_per_inference"] == 256 * 96 // 8
    assert d.manifest["resources"]["ice40"]["board"]["spram"] == 4
    image = _check_image(d)
    assert len(image) == 4 + 256 * 96
    x = np.random.default_rng(0).standard_normal((3, 256)).astype(np.float32)
    np.testing.assert_array_equal(d.simulate(x, seed=1), d.simulate(x, engine="golden"))
    assert d.last_run["cycles_per_inference"] == d.manifest["cycles_per_inference"]
    # A weight image that is not the manifest's is refused before any simulation.
    with open(f"{d.directory}/weights.bin", "r+b") as f:
        f.seek(10)
        f.write(b"\x00\x01")
    with pytest.raises(DesignDirError, match=r"weights\.bin: the weight image is not the one "
                                             r"the manifest records; compile the model again$"):
        onnx2fpga.load(d.directory).simulate(x)


def test_a_cnn_with_weights_in_spram_asked_for(tmp_path):
    path, cal = ort_qdq_cnn(tmp_path, kind="basic")
    d = onnx2fpga.compile(path, tmp_path / "d", board="icebreaker", weights="spram",
                          requant="exact")
    with open(f"{d.directory}/manifest.json") as f:
        manifest = json.load(f)
    assert manifest["spram"]["memories"] == d.manifest["folding"]["spram_memories"] != []
    _check_image(d)
    x = cal[:4]
    np.testing.assert_array_equal(d.simulate(x, seed=2), d.simulate(x, engine="golden"))


@pytest.mark.parametrize("board, weights, message", [
    (None, "spram", "weights='spram' needs a board whose device has SPRAMs (an iCE40 "
                    "UltraPlus: --board icebreaker or icesugar)"),
    ("ulx3s-85f", "spram", "weights='spram' needs a board whose device has SPRAMs (an iCE40 "
                           "UltraPlus: icebreaker, icesugar), not ulx3s-85f "
                           "(LFE5U-85F-BG381)"),
    ("icebreaker", "flash", "weights must be one of auto, rom, spram, not 'flash'"),
])
def test_weights_option_errors(tmp_path, board, weights, message):
    model = save(qdq_matmul(4, 4), tmp_path / "mm.onnx")
    with pytest.raises(OptionError) as e:
        onnx2fpga.compile(model, tmp_path / "d", board=board, weights=weights)
    assert str(e.value) == message
    assert not (tmp_path / "d").exists()


def test_cli_weights_option(tmp_path, capfd):
    model = save(qdq_matmul(4, 4), tmp_path / "mm.onnx")
    code, out, err = run_cli(capfd, "compile", str(model), "-o", str(tmp_path / "d"),
                             "--weights", "spram")
    assert (code, out) == (2, "")
    assert err.strip().splitlines()[-1] == (
        "error: weights='spram' needs a board whose device has SPRAMs (an iCE40 UltraPlus: "
        "--board icebreaker or icesugar)")


@pytest.mark.rtl
def test_the_simulated_board_loads_the_weights_from_its_flash(tmp_path):
    """run --sim: the board wrapper and NAME.v in Verilator, with a model of the board's
    flash holding weights.bin; the results equal the golden model's."""
    path, cal = ort_qdq_cnn(tmp_path, kind="basic")
    d = onnx2fpga.compile(path, tmp_path / "d", board="icebreaker", weights="spram",
                          requant="exact")
    x = cal[:3]
    with onnx2fpga.connect(d.directory, sim=True, timeout=10.0) as board:
        y = board.infer(x)
    np.testing.assert_array_equal(y, d.simulate(x, engine="golden"))
