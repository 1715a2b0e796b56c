"""The bandwidth roofline of a decode step: the bytes one token reads, and the copy
bandwidth measured on this GPU, so a benchmark can say what share of the limit it reaches.

`tools/bench_decode.py` and `tools/bench_small_card.py` (through `Engine.load` and
`Engine.generate`) both report `100 * tok/s * decode_bytes / bandwidth`.
"""

from __future__ import annotations


def copy_bandwidth(nbytes: int = 1 << 31) -> float:
    """Device-to-device copy GB/s (bytes read + written), two `nbytes` buffers, best of 10;
    the buffers go back to CuPy's pool and the pool to the driver after."""
    import cupy

    a, b = cupy.empty(nbytes, cupy.uint8), cupy.empty(nbytes, cupy.uint8)
    a.fill(1)
    best = 1e9
    for _ in range(10):
        e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
        e0.record()
        b[...] = a
        e1.record()
        e1.synchronize()
        best = min(best, cupy.cuda.get_elapsed_time(e0, e1) / 1e3)
    del a, b
    cupy.get_default_memory_pool().free_all_blocks()
    return 2 * nbytes / best / 1e9


def decode_bytes(weights: dict, cfg, context: int) -> int:
    """Bytes one decode token reads: every matrix of the model (the tied table once, as the
    LM head; an untied table only one row; not the MTP head's), the fp32 DeltaNet state read
    and written, the KV cache at `context` (bf16)."""
    from engine.backends.cuda.weights import DWeight, QWeight

    total = 0
    for name, w in weights.items():
        if isinstance(w, QWeight | DWeight) and not name.startswith("mtp."):
            if name == "embed_tokens" and not cfg.tie_word_embeddings:
                total += w.nbytes // w.shape[0]
            else:
                total += w.nbytes
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    state = len(cfg.linear_layers) * cfg.linear_num_value_heads * dk * dv * 4 * 2
    kv = len(cfg.full_layers) * cfg.num_key_value_heads * cfg.head_dim * 2 * 2 * context
    return total + state + kv


def roofline_pct(tok_s: float, nbytes: int, bandwidth_gb_s: float) -> float:
    """The share of the bandwidth limit a decode of `tok_s` reaches, in percent."""
    return 100.0 * tok_s * nbytes / (bandwidth_gb_s * 1e9)
