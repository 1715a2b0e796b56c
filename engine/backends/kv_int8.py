"""The 8-bit KV cache (setting `kv_cache = "int8"`): the one definition both backends follow.

Each key and each value row of one KV head at one token (`head_dim` numbers) is stored as
int8 codes with one fp32 scale, computed when the token's K/V are written:

    amax  = max |x|                      over the row (x in fp32: the key after its norm
                                         and RoPE, the value as projected)
    inv   = 127 / amax                   (0 where amax is 0)
    code  = clamp(rint(x * inv), -127, 127)     rint: round half to even
    scale = amax / 127

and read back as `code * scale` in fp32. Every step is one IEEE fp32 operation (a division,
a product, a rounding), so the numpy backend here and the CUDA kernels (`attn_prep_q8`,
`attn_decode_q8`, `kv_dequant` in attention.cu) compute the same codes and scales bit for
bit from the same input. A row's error is at most scale / 2 per element, 0.4% of its
largest element; a token's scale follows its own magnitude, so an outlier token costs
nothing to the others. Per token and head, the cache takes `head_dim + 4` bytes for each of
K and V instead of `2 * head_dim` (bf16).
"""

from __future__ import annotations

import numpy as np

KV_INT8 = "int8"  # EngineSettings.kv_cache; engine/memory/plan.py counts its bytes
QMAX = np.float32(127.0)


def quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows `x [..., hd]` (fp32) as (codes int8 [..., hd], scales fp32 [...])."""
    x = np.asarray(x, np.float32)
    amax = np.abs(x).max(axis=-1)
    inv = np.zeros_like(amax)
    np.divide(QMAX, amax, out=inv, where=amax > 0)
    codes = np.clip(np.rint(x * inv[..., None]), -QMAX, QMAX).astype(np.int8)
    return codes, amax / QMAX


def dequantize(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """`code * scale` in fp32: `[..., hd]` from codes `[..., hd]` and scales `[...]`."""
    return codes.astype(np.float32) * scales.astype(np.float32)[..., None]
