"""MLX affine quantization: packing layout, dequantization and a reference quantizer.

Layout (spec 5.3): row r of a logical [out, in] matrix is cut into groups of `group_size`
consecutive columns. Each value is an unsigned `bits`-bit code q; 32/bits codes share one
uint32 word, lowest bits first, so column j sits in word j*bits//32 at bit (j*bits) % 32.
Dequantized: W[r, j] = scales[r, j // g] * q + biases[r, j // g] (no zero point).

    packed  uint32  [out, in*bits/32]
    scales  f32     [out, in/g]        (bf16 in the file)
    biases  f32     [out, in/g]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.model_config import QuantSpec

# Rows dequantized per step when a whole matrix is asked for: bounds the uint32 code temp.
_ROW_BLOCK = 1024


@dataclass(frozen=True, eq=False)
class QuantizedTensor:
    """One quantized matrix as stored, with its logical [out, in] shape."""

    packed: np.ndarray
    scales: np.ndarray
    biases: np.ndarray
    bits: int
    group_size: int
    shape: tuple[int, int]

    def __post_init__(self) -> None:
        out, cols = self.shape
        assert self.packed.shape == (out, cols * self.bits // 32), (self.packed.shape, self.shape)
        assert self.scales.shape == (out, cols // self.group_size), self.scales.shape
        assert self.biases.shape == self.scales.shape, self.biases.shape

    @property
    def spec(self) -> QuantSpec:
        return QuantSpec(self.bits, self.group_size)

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales.nbytes + self.biases.nbytes

    def dequantize(self, rows: slice | np.ndarray | None = None) -> np.ndarray:
        """float32 [n_rows, in] for the selected rows (all rows when None).

        Works one block of rows at a time, so asking for an embedding row or a slice of a
        large matrix never expands the rest.
        """
        if rows is None:
            rows = slice(0, self.shape[0])
        packed, scales, biases = self.packed[rows], self.scales[rows], self.biases[rows]
        if packed.ndim == 1:  # a single integer row index
            return self._dequantize_block(packed[None], scales[None], biases[None])[0]
        out = np.empty((packed.shape[0], self.shape[1]), dtype=np.float32)
        for r in range(0, packed.shape[0], _ROW_BLOCK):
            s = slice(r, r + _ROW_BLOCK)
            out[s] = self._dequantize_block(packed[s], scales[s], biases[s])
        return out

    def _dequantize_block(
        self, packed: np.ndarray, scales: np.ndarray, biases: np.ndarray
    ) -> np.ndarray:
        q = unpack_codes(packed, self.bits)  # [R, in]
        R, cols = q.shape
        g = self.group_size
        w = q.reshape(R, cols // g, g).astype(np.float32)  # [R, groups, g]
        w *= scales[:, :, None].astype(np.float32)
        w += biases[:, :, None].astype(np.float32)
        return w.reshape(R, cols)


def unpack_codes(packed: np.ndarray, bits: int) -> np.ndarray:
    """uint32 [R, W] -> uint32 codes [R, W*32/bits], lowest bits first within each word."""
    per_word = 32 // bits
    shifts = np.arange(per_word, dtype=np.uint32) * np.uint32(bits)  # [per_word]
    mask = np.uint32((1 << bits) - 1)
    codes = (packed[..., None] >> shifts) & mask  # [R, W, per_word]
    return codes.reshape(*packed.shape[:-1], packed.shape[-1] * per_word)


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Inverse of `unpack_codes`: codes [R, in] (values < 2**bits) -> uint32 [R, in*bits/32]."""
    per_word = 32 // bits
    R, cols = codes.shape
    assert cols % per_word == 0, (cols, per_word)
    c = codes.astype(np.uint32).reshape(R, cols // per_word, per_word)
    shifts = np.arange(per_word, dtype=np.uint32) * np.uint32(bits)
    return np.bitwise_or.reduce(c << shifts, axis=-1).astype(np.uint32)


def quantize(w: np.ndarray, bits: int, group_size: int) -> QuantizedTensor:
    """Affine min/max quantization of a float [out, in] matrix into the MLX layout.

    Used to build test checkpoints; the scale and bias per group map the group's range onto
    codes 0..2**bits-1. A constant group gets scale 0 and its value as bias.
    """
    QuantSpec(bits, group_size)  # validates bits and group size
    w = np.asarray(w, dtype=np.float32)
    out, cols = w.shape
    if cols % group_size:
        raise ValueError(f"in_features {cols} is not a multiple of group_size {group_size}")
    groups = w.reshape(out, cols // group_size, group_size)  # [out, G, g]
    lo, hi = groups.min(axis=-1), groups.max(axis=-1)  # [out, G]
    levels = (1 << bits) - 1
    scales = (hi - lo) / levels
    safe = np.where(scales == 0, 1.0, scales)
    q = np.rint((groups - lo[..., None]) / safe[..., None])
    q = np.clip(q, 0, levels).astype(np.uint32).reshape(out, cols)
    return QuantizedTensor(
        packed=pack_codes(q, bits),
        scales=scales.astype(np.float32),
        biases=lo.astype(np.float32),
        bits=bits,
        group_size=group_size,
        shape=(out, cols),
    )
