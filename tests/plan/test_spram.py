"""Planning weights in SPRAM: each layer's SPRAMs, the weights a core may read per cycle, the
image's bytes, and the one-line refusals."""

import pytest

from onnx2fpga.plan.spram import (
    IMAGE_MAGIC,
    SPRAM_WORDS,
    SpramSlot,
    spram_depths,
    spram_fits,
    spram_lanes,
    spram_layout,
    weight_image,
)


def test_layout_numbers_sprams_in_layer_order():
    slots = spram_layout([("a", 8, 100), ("b", 33, 7)])
    assert slots == [SpramSlot("a", 0, 1, 8, 100), SpramSlot("b", 1, 3, 33, 7)]
    assert spram_depths(slots) == [100, 7, 7, 7]


def test_layout_refuses_more_sprams_than_the_device_has():
    with pytest.raises(ValueError) as e:
        spram_layout([("a", 32, 100), ("b", 33, 7)])
    assert str(e.value) == ("Weights need 5 SPRAMs (a 2, b 3), more than the 4 of the device: "
                            "fold the layers with fewer lanes or keep some in block RAM")


def test_a_layer_deeper_than_an_spram_takes_rows_of_them():
    """20 bits x 40,000 words: 2 columns x 3 rows, numbered row by row; the last row holds
    the rest (7,232 words)."""
    slots = spram_layout([("a", 8, 5), ("b", 20, 40_000)], 7)
    assert slots[1] == SpramSlot("b", 1, 6, 20, 40_000)
    assert (slots[1].rows, slots[1].cols) == (3, 2)
    assert spram_depths(slots) == [5, *[SPRAM_WORDS] * 4, 7_232, 7_232]
    with pytest.raises(ValueError, match=r"^Weights need 7 SPRAMs \(a 1, b 6\), more than "
                                         r"the 4 of the device"):
        spram_layout([("a", 8, 5), ("b", 20, 40_000)])


def test_lanes_per_cycle():
    # 8-bit weights: 2 per SPRAM per cycle; 3-bit weights: 5 (a 16-bit word holds 5 whole).
    assert spram_lanes(8, 1) == 2 and spram_lanes(8, 4) == 8 and spram_lanes(3, 1) == 5
    assert spram_fits(2, 1, 8, 4096, 1) and not spram_fits(2, 2, 8, 4096, 1)
    assert spram_fits(2, 2, 8, 4096, 2) and not spram_fits(1, 1, 8, SPRAM_WORDS + 1, 1)
    # Two rows deep: two SPRAMs give one column, 2 weights a cycle; four give 4.
    assert spram_fits(2, 1, 8, SPRAM_WORDS + 1, 2) and not spram_fits(2, 2, 8, 20_000, 2)
    assert spram_fits(2, 2, 8, 20_000, 4)


def test_image_bytes():
    """The magic, then SPRAM 0's words, then SPRAM 1's, ..., each 16 bits low byte first;
    a 20-bit word splits over two SPRAMs, its low 16 bits in the first."""
    slots = spram_layout([("a", 20, 2), ("b", 4, 1)])
    image = weight_image(slots, [[0xABCDE, 0x12345], [0x9]])
    assert image == IMAGE_MAGIC + bytes([0xDE, 0xBC, 0x45, 0x23,      # SPRAM 0
                                         0x0A, 0x00, 0x01, 0x00,      # SPRAM 1
                                         0x09, 0x00])                 # SPRAM 2


def test_image_of_a_deep_layer_row_by_row():
    slots = spram_layout([("a", 20, SPRAM_WORDS + 2)])
    words = list(range(SPRAM_WORDS)) + [0xABCDE, 0x12345]
    image = weight_image(slots, [words])
    assert len(image) == 4 + 2 * 2 * (SPRAM_WORDS + 2)
    # SPRAM 0: row 0's low halves (word n: n); SPRAM 1: their high halves (0); SPRAM 2:
    # row 1's low halves; SPRAM 3: its high halves.
    assert image[4:8] == bytes([0, 0, 1, 0])
    rest = image[4 + 4 * SPRAM_WORDS:]
    assert rest == bytes([0xDE, 0xBC, 0x45, 0x23, 0x0A, 0x00, 0x01, 0x00])


def test_image_refuses_words_that_do_not_fit():
    slots = spram_layout([("a", 4, 2)])
    with pytest.raises(ValueError, match=r"^Weight word 16 of layer 'a' does not fit 4 "
                                         r"unsigned bits$"):
        weight_image(slots, [[1, 16]])
    with pytest.raises(ValueError, match=r"^Layer 'a' has 1 weight words, not 2$"):
        weight_image(slots, [[1]])


def test_placement_takes_the_largest_memories_that_fit():
    from onnx2fpga.plan.spram import place_weights
    mems = [("s/a", 16, 4096), ("s/b", 40, 10), ("s/c", 8, 9000), ("s/d", 64, 100),
            ("s/e", 4, 20)]
    # By size: c (72,000 bits, 1 SPRAM), a (65,536, 1), then d (6,400) would take 4 and b
    # (400) 3: skipped; e (80, 1) fits the fourth.
    assert place_weights(mems) == ["s/a", "s/c", "s/e"]
    assert place_weights(mems, wanted=1) == ["s/c"]
    assert place_weights(mems, 2) == ["s/a", "s/c"]
    assert place_weights(mems, 1) == ["s/c"]
    # Deeper than all four SPRAMs: never placed; two rows deep: placed.
    assert place_weights([("s/x", 8, 4 * SPRAM_WORDS + 1)]) == []
    assert place_weights([("s/x", 8, SPRAM_WORDS + 1)]) == ["s/x"]


def test_matvec_weight_shape():
    import numpy as np

    from onnx2fpga.ir.layers import DenseLayer
    from onnx2fpga.ir.types import IntType
    from onnx2fpga.plan.spram import matvec_weight_shape
    i8 = IntType(8, True)
    layer = DenseLayer("fc", i8, 0, np.ones((6, 16), dtype=np.int64), i8, np.zeros(6),
                       [], simd=4, pe=3)
    assert matvec_weight_shape(layer, "multiply") == (96, 8)      # 2 groups x 4 folds
    assert matvec_weight_shape(layer, "sign") == (12, 8)
