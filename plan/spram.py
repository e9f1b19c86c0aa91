"""Weights in the iCE40 UP5K's single-port RAMs: where each layer's weights go, how many a
core may read per cycle, the weight image the loader writes into them, and where it sits in
the board's SPI flash.

The device
----------
An iCE40 UP5K has :data:`UP5K_SPRAMS` ``SB_SPRAM256KA``: each :data:`SPRAM_WORDS` words of
:data:`SPRAM_BITS` bits (256 kbit, 128 KB in all), one port (a write or a read per cycle, the
read's data one cycle after the address, like a block RAM's read port), and no initial
contents: they power up undefined, so the weights are written at start-up by a loader
(:class:`onnx2fpga.hw.spram.SpramLoader`) from the SPI flash, where they follow the
bitstream at :data:`FLASH_OFFSET`.

The layout
----------
The cores of a streaming dataflow all run at once, and an SPRAM has one port: two layers
cannot share one without stalling each other. So each layer whose weights live in SPRAM
gets SPRAMs of its own (:func:`spram_layout`): ``cols`` side by side, ``cols = ceil(width /
16)`` for its weight word of ``width`` bits (the word ``n = g * folds + f`` a
:class:`~onnx2fpga.hw.matvec.MatVecCore` reads at step ``(g, f)``, ``simd * pe`` weights),
bits ``[16 j, 16 j + 16)`` of the word in column ``j``; and ``rows = ceil(depth /
16384)`` of those deep, word ``n`` in row ``n // 16384`` at address ``n % 16384`` (the
row's SPRAMs are enabled by the address's high bits, their data picked by the same bits a
cycle later). A layer's SPRAMs give ``16 cols`` weight bits per cycle, so its ``simd *
pe`` is at most :func:`spram_lanes` (``16 cols // weight_bits``): a layer whose folding
asks more per cycle must be folded slower (:func:`spram_fits` is the rule the folding
asks). The SPRAMs are numbered in the order of the layers given, then row by row, then
column by column: SPRAM ``first + r * cols + j`` holds row ``r``, column ``j``.

The image
---------
:func:`weight_image`: :data:`IMAGE_MAGIC` (4 bytes), then for each SPRAM in turn its used
words (:func:`spram_depths`), each 16 bits little-endian (low byte first). The loader
checks the magic first: a flash that holds no image (erased flash reads ``0xFF``) leaves the
accelerator not ready rather than computing with undefined weights.

Where it is used
----------------
Compile's ``weights`` (:data:`WEIGHT_PLACES`) decides which MatVec weight memories go to
SPRAM on a board that has them (:func:`place_weights` over :func:`weight_memories`, in the
fit check of the folding: ``onnx2fpga.steps.device_check``), recorded as
``Dataflow.spram_memories``; the accelerator builds the store and the loader
(:mod:`onnx2fpga.hw.spram`, :mod:`onnx2fpga.hw.flashload`), the compile writes the image
(``weights.bin``, ``manifest["spram"]``) and ``flash`` writes it at :data:`FLASH_OFFSET`.
Not (yet) in SPRAM: the weights of depthwise convolutions (a
:class:`~onnx2fpga.hw.depthwise.DepthwiseCore` keeps its ROM), which are small beside the
pointwise ones; loading over the host link instead of the flash. ``simulate`` and the
simulated board (``run --sim``) run the design with a model of the flash
(:class:`~onnx2fpga.hw.flashload.SpiFlashModel`) holding the image.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

__all__ = [
    "SPRAM_WORDS", "SPRAM_BITS", "UP5K_SPRAMS", "FLASH_OFFSET", "IMAGE_MAGIC", "SpramSlot",
    "spram_count", "spram_rows", "spram_depths", "spram_lanes", "spram_fits", "spram_layout",
    "spram_words", "weight_image", "image_sha256", "WEIGHT_PLACES", "matvec_weight_shape",
    "weight_memories", "place_weights",
]

#: Words of one ``SB_SPRAM256KA``.
SPRAM_WORDS = 16384
#: Bits of one word of an ``SB_SPRAM256KA``.
SPRAM_BITS = 16
#: ``SB_SPRAM256KA`` of an iCE40 UP5K.
UP5K_SPRAMS = 4
#: Byte offset of the weight image in the board's SPI flash: 1 MiB, past the UP5K's
#: bitstream (104,090 bytes) and the 128 KB image, inside the iCEBreaker's 16 MB flash
#: (W25Q128); ``iceprog -o 1M`` writes there.
FLASH_OFFSET = 0x100000
#: The first 4 bytes of a weight image.
IMAGE_MAGIC = b"O2FW"
#: Where weights may go (compile's ``weights``): ``"auto"`` (block RAM, and SPRAM for the
#: largest layers when the block RAMs run out on a device with SPRAMs), ``"rom"`` (block RAM
#: or soft logic only), ``"spram"`` (the largest layers in SPRAM, as many as fit).
WEIGHT_PLACES = ("auto", "rom", "spram")


def _positive(name, value):
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, not {value!r}")
    return value


def spram_count(width: int) -> int:
    """SPRAMs side by side that hold words of ``width`` bits: ``ceil(width / 16)``."""
    return -(-_positive("width", width) // SPRAM_BITS)


def spram_lanes(weight_bits: int, sprams: int) -> int:
    """Weights of ``weight_bits`` bits that ``sprams`` SPRAMs side by side give per cycle:
    ``16 * sprams // weight_bits`` (a weight never straddles two words' worth of cycles)."""
    return SPRAM_BITS * _positive("sprams", sprams) // _positive("weight_bits", weight_bits)


def spram_rows(depth: int) -> int:
    """SPRAMs stacked to hold ``depth`` words: ``ceil(depth / 16384)``."""
    return -(-_positive("depth", depth) // SPRAM_WORDS)


def spram_fits(simd: int, pe: int, weight_bits: int, depth: int, sprams: int) -> bool:
    """Whether a core reading ``simd * pe`` weights of ``weight_bits`` bits per cycle from a
    weight memory of ``depth`` words can take them from ``sprams`` SPRAMs of its own: its
    :func:`spram_rows` each as wide as :func:`spram_lanes` weights. The folding rule of a
    layer whose weights live in SPRAM."""
    rows = spram_rows(depth)
    cols = _positive("sprams", sprams) // rows
    return cols >= 1 and simd * pe <= spram_lanes(weight_bits, cols)


@dataclass(frozen=True)
class SpramSlot:
    """Where one layer's weights live: SPRAMs ``first .. first + count - 1`` (``rows`` of
    ``cols``, see the module docstring), ``depth`` words of ``width`` bits."""
    name: str
    first: int
    count: int
    width: int
    depth: int

    @property
    def cols(self) -> int:
        """SPRAMs side by side: ``ceil(width / 16)``."""
        return spram_count(self.width)

    @property
    def rows(self) -> int:
        """SPRAMs deep: ``ceil(depth / 16384)``."""
        return spram_rows(self.depth)


def spram_layout(layers, available: int = UP5K_SPRAMS) -> list[SpramSlot]:
    """The SPRAMs of each layer, in the order given.

    Parameters
    ----------
    layers : iterable of (str, int, int)
        ``(name, width, depth)``: a layer's weight word width in bits and its words.
    available : int
        SPRAMs of the device (:data:`UP5K_SPRAMS`).

    Raises
    ------
    ValueError
        One line: more SPRAMs needed than the device has (the count per layer named).
    """
    slots, first = [], 0
    for name, width, depth in layers:
        n = spram_count(width) * spram_rows(depth)
        slots.append(SpramSlot(name, first, n, width, depth))
        first += n
    if first > available:
        need = ", ".join(f"{s.name} {s.count}" for s in slots)
        raise ValueError(f"Weights need {first} SPRAMs ({need}), more than the {available} "
                         f"of the device: fold the layers with fewer lanes or keep some "
                         f"in block RAM")
    return slots


def spram_depths(slots) -> list[int]:
    """The used words of each SPRAM of ``slots`` (:func:`spram_layout`), in SPRAM order: the
    depth of its layer (what the image holds of it)."""
    return [min(SPRAM_WORDS, s.depth - r * SPRAM_WORDS)
            for s in slots for r in range(s.rows) for _ in range(s.cols)]


def spram_words(slot: SpramSlot, words) -> list[list[int]]:
    """The 16-bit words of each SPRAM of ``slot`` from the layer's ``words`` (ints of
    ``slot.width`` bits, ``slot.depth`` of them), in SPRAM order: ``out[r * cols + j][a]``
    is bits ``[16 j, 16 j + 16)`` of word ``r * 16384 + a``."""
    words = [int(w) for w in words]
    if len(words) != slot.depth:
        raise ValueError(f"Layer {slot.name!r} has {len(words)} weight words, not "
                         f"{slot.depth}")
    limit = 1 << slot.width
    for w in words:
        if not 0 <= w < limit:
            raise ValueError(f"Weight word {w} of layer {slot.name!r} does not fit "
                             f"{slot.width} unsigned bits")
    mask = (1 << SPRAM_BITS) - 1
    return [[(w >> (SPRAM_BITS * j)) & mask
             for w in words[r * SPRAM_WORDS:(r + 1) * SPRAM_WORDS]]
            for r in range(slot.rows) for j in range(slot.cols)]


def weight_image(slots, words_per_layer) -> bytes:
    """The weight image of ``slots`` (:func:`spram_layout`) holding ``words_per_layer`` (one
    list of words per slot, as :func:`spram_words` takes): :data:`IMAGE_MAGIC`, then each
    SPRAM's words in SPRAM order, 16 bits little-endian."""
    slots = list(slots)
    words_per_layer = list(words_per_layer)
    if len(slots) != len(words_per_layer):
        raise ValueError(f"{len(words_per_layer)} weight lists for {len(slots)} layers")
    out = bytearray(IMAGE_MAGIC)
    for slot, words in zip(slots, words_per_layer):
        for column in spram_words(slot, words):
            for w in column:
                out += w.to_bytes(2, "little")
    return bytes(out)


def image_sha256(image: bytes) -> str:
    """The SHA-256 of a weight image, in hex (the manifest records it)."""
    return hashlib.sha256(image).hexdigest()


def matvec_weight_shape(layer, arithmetic: str) -> tuple[int, int]:
    """``(width, depth)`` of the weight memory of a MatVec of ``layer`` (a
    :class:`~onnx2fpga.ir.DenseLayer` folded by ``simd`` and ``pe``): ``simd * pe`` weights a
    word (one bit each unless ``arithmetic`` is ``"multiply"``), ``groups * folds`` words."""
    bits = layer.weight_type.bits if arithmetic == "multiply" else 1
    return (layer.simd * layer.pe * bits,
            (layer.out_features // layer.pe) * (layer.in_features // layer.simd))


def weight_memories(stages) -> list[tuple[str, int, int]]:
    """``[("stage/w_mem", width, depth), ...]`` of the MatVec stages among ``stages`` (a
    :class:`~onnx2fpga.plan.graph.Plan`'s), in stage order: the weight memories SPRAM may
    hold (:attr:`Dataflow.spram_memories <onnx2fpga.ir.Dataflow>` names)."""
    return [(f"{s.name}/w_mem", *matvec_weight_shape(s.params["layer"],
                                                      s.params.get("arithmetic", "multiply")))
            for s in stages if s.kind == "matvec"]


def place_weights(memories, available: int = UP5K_SPRAMS, *, wanted=None) -> list[str]:
    """The weight memories to put in SPRAM: the largest (in bits) first, each that still
    fits beside those chosen before it (:func:`spram_layout`; a memory too wide or too deep
    is skipped), until ``wanted`` of them (``None``: as many as fit).

    Parameters
    ----------
    memories : list of (str, int, int)
        :func:`weight_memories`.
    """
    chosen, rest = [], sorted(memories, key=lambda m: (-m[1] * m[2], m[0]))
    for mem in rest:
        if wanted is not None and len(chosen) >= wanted:
            break
        try:
            spram_layout(chosen + [mem], available)
        except ValueError:
            continue
        chosen.append(mem)
    return sorted(name for name, _, _ in chosen)
