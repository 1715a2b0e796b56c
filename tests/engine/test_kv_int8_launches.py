"""The 8-bit KV cache's launches without a GPU: which kernel each path asks for, and that
every launch passes exactly the parameters attention.cu declares, in order (the scales
right after the codes). tests/device/test_kv_int8_cuda.py runs them."""

from __future__ import annotations

import re

import numpy as np

from engine.backends.cuda.attention import Attention, decode_kernel
from engine.backends.cuda.modules import source
from engine.backends.cuda.tuning import Tuning
from tests.engine.cuda_fakes import DeviceArray, RecordingKernels


def _params(kernel: str, file: str = "attention.cu") -> list[str]:
    """The parameter names of `kernel`'s definition in kernels/`file`."""
    text = source(file)
    head = re.search(rf"\b{kernel}\(([^)]*)\)\s*{{", text)
    assert head, kernel
    return [p.split()[-1].lstrip("*") for p in head.group(1).split(",")]


def test_decode_reads_the_scales_after_the_codes(monkeypatch):
    monkeypatch.setattr("engine.backends.cuda.attention.sm_count", lambda: 0)  # 4 warps
    k = RecordingKernels()
    at = Attention(k, None, None, Tuning())
    q, kc, vc, ks, vs = (DeviceArray((1, 8)) for _ in range(5))
    heads = (16, 4, 256)
    at.decode(q, kc, vc, *(None,) * 4, heads, 8192, 32, 128, scales=(ks, vs))
    sym, grid, block, _, args = k.launches[-1]
    assert sym == decode_kernel(4, 256, 128, 4, 1, 0, q8=True)[0] == "attn_decode_q8<8,4,4,4>"
    assert (grid, block) == ((128, 4, 1), (128,))
    names = _params("attn_decode_q8")
    assert len(args) == len(names) and names[1:5] == ["kc", "vc", "ks", "vs"]
    assert args[3] is ks and args[4] is vs
    at.decode(q, kc, vc, *(None,) * 4, heads, 8192, 32, 128)  # the bf16 cache: as before
    sym, _, _, _, args = k.launches[-1]
    assert sym == "attn_decode<8,4,4,4>" and len(args) == len(_params("attn_decode"))


def test_prep_writes_codes_and_scales():
    k = RecordingKernels()
    at = Attention(k, None, None, Tuning())
    a = DeviceArray((3, 8))
    meta = (a,) * 4
    prep = (a, a, a, a, a, meta, a, "kc", "vc", (16, 4, 256), 64, 1024, 1e7, 1e-6)
    at.prep(*prep, True, (), ("ks", "vs"))
    sym, grid, block, smem, args = k.launches[-1]
    assert (sym, grid, block, smem) == ("attn_prep_q8", (3, 20), (256,), 1024)
    names = _params("attn_prep_q8")
    assert len(args) == len(names) and names[10:14] == ["kc", "vc", "ks", "vs"]
    assert args[10:14] == ("kc", "vc", "ks", "vs")
    assert [int(x) for x in args[14:19]] == [16, 4, 256, 64, 1024]
    assert names[21] == "rowwise" and int(args[21]) == 1  # queries [R, Hq, hd]
    at.prep(*prep, False)
    sym, _, _, _, args = k.launches[-1]
    names = _params("attn_prep")
    assert sym == "attn_prep" and len(args) == len(names)
    assert names[19] == "rowwise" and int(args[19]) == 0


def test_dequant_covers_every_code_once():
    k = RecordingKernels()
    at = Attention(k, None, None, Tuning())
    out = (DeviceArray((300, 256)), DeviceArray((300, 256)))
    at.dequant(("kc", "vc"), ("ks", "vs"), out, 257)
    sym, grid, block, _, args = k.launches[-1]
    assert sym == "kv_dequant" and block == (256,) and grid[1] == 2
    assert grid[0] * block[0] * 4 >= 257 * 256 > (grid[0] - 1) * block[0] * 4
    assert len(args) == len(_params("kv_dequant"))
    assert args[:6] == ("kc", "ks", "vc", "vs", *out) and [int(x) for x in args[6:]] == [257, 256]


def test_the_catalog_holds_the_8_bit_decode_where_the_setting_asks():
    from engine.backends.cuda.card import ARCH_CARDS
    from engine.backends.cuda.catalog import modules, requests
    from engine.memory.shapes import shape_config, shape_tensor_specs

    config = shape_config("4B", "mlx4")
    specs = shape_tensor_specs(config, "mlx4")

    def attention(kv):
        mods = modules(config, specs, "bfloat16", ARCH_CARDS[86], kv_cache=kv)
        return {n for f, n in requests(mods) if f == "attention.cu"}

    int8, bf16 = attention("int8"), attention("bf16")
    assert {"attn_decode_q8<8,4,4,4>", "attn_decode_q8<8,4,4,8>"} <= int8
    assert not any(n.startswith("attn_decode<") for n in int8)
    assert not any(n.startswith("attn_decode_q8") for n in bf16)
    assert {"attn_prep_q8", "kv_dequant", "attn_prep"} <= bf16 & int8  # extern "C": compiled
    assert np.all([n in bf16 for n in ("attn_decode<8,4,4,4>", "attn_decode<8,4,4,8>")])
