"""tools/bench_cluster_chain.py's host side: the reader of gemv4's 8-row block layout that
checks its device chain, the stage offsets and the warps a tile (the device runs need a
GPU of compute capability 9.0)."""

from __future__ import annotations

import numpy as np

from tools.bench_cluster_chain import STAGES, dequant, stage_table, warps_a_tile


def _blocked(a: np.ndarray, unit: int) -> np.ndarray:
    """Rows of `a` (rows a multiple of 8, `unit` elements a group) in 8-row blocks, as
    quant.cu's to_blocks writes them: per block and group, the 8 rows' runs back to back."""
    rows, n = a.shape
    g = n // unit
    return a.reshape(rows // 8, 8, g, unit).transpose(0, 2, 1, 3).reshape(-1)


def test_dequant_reads_the_8_row_blocks_as_the_row_ordered_matrix():
    rng = np.random.default_rng(3)
    rows, cols = 24, 128
    q = rng.integers(0, 16, size=(rows, cols))
    scales = rng.uniform(0.5, 2.0, size=(rows, cols // 64))
    biases = rng.uniform(-1.0, 1.0, size=(rows, cols // 64))
    # MLX packing: 8 codes a 32-bit word, the first column in the lowest nibble.
    words = np.zeros((rows, cols // 8), np.uint64)
    for j in range(8):
        words |= q[:, j::8].astype(np.uint64) << np.uint64(4 * j)
    codes = _blocked(words.astype(np.uint32), 8)
    sb = np.concatenate([_blocked(scales, 1), _blocked(biases, 1)])
    want = np.repeat(scales, 64, axis=1) * q + np.repeat(biases, 64, axis=1)
    got = dequant(codes, sb, scales.size, 0, 0, rows, cols)
    assert got.shape == (rows, cols)
    assert np.allclose(got, want)
    # A matrix whose rows are not a multiple of 8 keeps only its own rows.
    assert dequant(codes, sb, scales.size, 0, 0, 20, cols).shape == (20, cols)


def test_each_matrix_starts_where_the_previous_ends():
    desc, mats, words, entries = stage_table()
    assert len(desc) == len(STAGES) and len(mats) == 5  # gate and up are two matrices
    end_w = end_s = 0
    for w, s, out, cols in mats:
        assert (w, s) == (end_w, end_s)
        end_w += (out + 7) // 8 * (cols // 64) * 64
        end_s += (out + 7) // 8 * (cols // 64) * 8
    assert (words, entries) == (end_w, end_s)


def test_warps_share_a_tile_only_where_the_tiles_are_fewer_than_the_warps():
    assert warps_a_tile(8224, 0, 16, 16) == 1  # 514 tiles for 256 warps
    assert warps_a_tile(1024, 0, 16, 16) == 4  # 64 tiles
    assert warps_a_tile(1024, 0, 2, 16) == 1
    assert warps_a_tile(16, 0, 16, 16) == 8  # at most 8
