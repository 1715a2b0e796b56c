import numpy as np

from engine.backends.base import Batch
from engine.backends.numpy_backend import NumpyBackend, rope_half_split
from engine.checkpoint import Checkpoint
from engine.models.qwen35 import Qwen35Model


def run(model_dir, cache_bytes, ids):
    ckpt = Checkpoint.open(model_dir)
    backend = NumpyBackend(cache_bytes=cache_bytes)
    model = Qwen35Model(ckpt.config, backend, backend.load_weights(ckpt, ckpt.config))
    backend.alloc_state(ckpt.config, 1, 256)
    return model.forward(Batch.window(0, 0, len(ids)), np.asarray(ids), all_logits=True), backend


def test_blockwise_dequant_equals_cached_copies(tiny_checkpoint):
    """With no cache budget every quantized matmul dequantizes block by block on the fly."""
    model_dir = tiny_checkpoint("untied-l8-r2", "mlx4-g64")
    ids = list(range(3, 40))
    cached, cached_backend = run(model_dir, None, ids)
    streamed, streamed_backend = run(model_dir, 0, ids)
    assert cached_backend.held_bytes() > streamed_backend.held_bytes()
    np.testing.assert_allclose(streamed, cached, rtol=0, atol=1e-5 * np.abs(cached).max())


def test_rope_rotates_half_split_pairs_only_in_rotary_dims():
    x = np.random.default_rng(0).normal(size=(3, 2, 16)).astype(np.float32)
    out = rope_half_split(x, np.array([0, 1, 5]), rotary_dim=8, theta=1e7)
    np.testing.assert_array_equal(out[0], x[0])  # position 0: no rotation
    np.testing.assert_array_equal(out[:, :, 8:], x[:, :, 8:])  # dims past rotary_dim pass
    # pair (0, 4) at position 1 rotates by inv_freq_0 = 1 radian
    c, s = np.cos(1.0), np.sin(1.0)
    np.testing.assert_allclose(out[1, :, 0], x[1, :, 0] * c - x[1, :, 4] * s, rtol=1e-6)
    np.testing.assert_allclose(out[1, :, 4], x[1, :, 4] * c + x[1, :, 0] * s, rtol=1e-6)


def test_prompt_cache_evicts_oldest_and_frees_it():
    from engine.prompt_cache import PromptCache

    freed = []
    cache = PromptCache(100, on_evict=freed.append)
    assert cache.store([1, 2], "a", 60) and cache.store([1, 2, 3], "b", 30)
    assert cache.lookup([1, 2, 3, 4]).snapshot == "b"  # longest proper prefix
    assert cache.make_room(50) and freed == ["a"]  # oldest went first
    assert not cache.make_room(101) and cache.lookup([1, 2, 3]) is None  # no proper prefix
    cache.clear()
    assert freed == ["a", "b"] and len(cache) == 0


def test_prompt_cache_names_what_the_next_saves_would_evict_without_evicting():
    """`victims(nbytes, saves)`: what `saves` stores of `nbytes` each would evict, in the
    order make_room would (the buffers for those moves are readied from it)."""
    from engine.prompt_cache import PromptCache

    freed: list[str] = []
    cache = PromptCache(100, on_evict=freed.append)
    assert cache.newest() is None and cache.victims(30, 2) == []
    for key, name, n in (([1], "a", 40), ([2], "b", 20), ([3], "c", 30)):
        cache.store(key, name, n)
    cache.touch((1,))  # order now b, c, a
    assert cache.newest().snapshot == "a"
    assert [e.snapshot for e in cache.victims(10, 1)] == []  # 90 + 10 fits
    assert [e.snapshot for e in cache.victims(30, 1)] == ["b"]
    assert [e.snapshot for e in cache.victims(30, 2)] == ["b", "c"]
    assert [e.snapshot for e in cache.victims(60, 2)] == ["b", "c", "a"]
    assert cache.victims(101, 2) == [] and freed == [] and len(cache) == 3  # none evicted
    cache.make_room(30)
    cache.store([4], "d", 30)
    cache.make_room(30)
    assert freed == ["b", "c"]  # as named
