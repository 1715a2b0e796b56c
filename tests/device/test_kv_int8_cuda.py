"""The 8-bit KV cache on the GPU: its kernels (attn_prep_q8, attn_decode_q8, kv_dequant)
against the numpy backend's 8-bit cache, the whole forward in prefill and decode at several
context lengths against numpy and against the bf16 cache, graphs, and snapshot restores."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends import kv_int8
from engine.backends.base import KV_SCALE_PARTS, Batch
from engine.backends.numpy_backend import NumpyBackend
from engine.config import EngineSettings
from engine.session import Engine, GenerationParams
from tests.device.test_forward import BOUND, PROMPT, _greedy, _model
from tests.device.test_kernels import TOL, _config, _rel, _round, _runs, _up

NUMPY_INT8 = EngineSettings(backend="numpy", kv_cache="int8")
KV_PARTS = ("kv_k", "kv_v", *KV_SCALE_PARTS)


def _cuda(dtype: str, kv: str = "int8"):
    from engine.backends.cuda.backend import CudaBackend

    return CudaBackend(settings=EngineSettings(kv_cache=kv), dtype=dtype)


class FromDevice(NumpyBackend):
    """The numpy 8-bit cache that, for each row written, quantizes it itself (kept in
    `own` to compare with the GPU's codes) and then takes the codes and scales the GPU
    wrote for the same row: its attention reads exactly the GPU's cache."""

    def __init__(self, device_state) -> None:
        super().__init__(NUMPY_INT8)
        self.device = device_state
        self.own: list[tuple[str, np.ndarray, np.ndarray]] = []  # (part, numpy's, the GPU's)

    def _write_kv(self, layer, slot, start, k, v):
        import cupy

        super()._write_kv(layer, slot, start, k, v)
        end = start + k.shape[0]
        for part in KV_PARTS:
            mine = getattr(self, part)[layer][slot, :, start:end]
            gpu = cupy.asnumpy(getattr(self.device, part)[layer, slot, :, start:end])
            self.own.append((part, mine.copy(), gpu))
            mine[...] = gpu


def _check_codes(own) -> None:
    """The GPU quantized the rows as the numpy backend does: the same scales to fp32
    rounding, and codes that differ by at most one step, in few elements (one whose
    x * 127 / amax falls within fp32 rounding of a half; about 2e-4 of them)."""
    flips = codes = 0
    for part, mine, gpu in own:
        if part.endswith("scale"):
            assert np.allclose(gpu, mine, rtol=1e-5, atol=0), part
            continue
        diff = np.abs(mine.astype(int) - gpu.astype(int))
        assert diff.max() <= 1, (part, diff.max())
        flips, codes = flips + int((diff > 0).sum()), codes + diff.size
    assert codes and flips <= 2e-3 * codes, (flips, codes)


def _pair(dtype, slots=3, context=600, c=None):
    c = c or _config()
    be = _cuda(dtype)
    be.alloc_state(c, slots, context)
    be.vocab_rows = c.vocab_size
    ref = FromDevice(be.state)
    ref.alloc_state(c, slots, context)
    return c, be, ref


def _attend(be, ref, c, rng, batch, qn, kn):
    import cupy

    Hq, Hkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    R = batch.rows
    qg = _round(be, rng.standard_normal((R, Hq * 2 * hd)).astype(np.float32))
    k = _round(be, rng.standard_normal((R, Hkv * hd)).astype(np.float32) * 3)
    v = _round(be, rng.standard_normal((R, Hkv * hd)).astype(np.float32))
    be.prepare(batch, np.zeros(R, np.int32))
    dev = [_up(be, a) for a in (qg, k, v)]
    y = be.to_host(be.attention(0, *dev, cupy.asarray(qn), cupy.asarray(kn), batch))
    return y, ref.attention(0, qg, k, v, qn, kn, batch)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("run", range(3))
def test_prefill_and_decode_attention_on_the_8_bit_cache(dtype, run):
    """Windows of odd sizes, steps, and a batch of two segments: the codes and scales
    attn_prep_q8 writes are numpy's, and the attention over them (kv_dequant and cuBLAS in
    a window, attn_decode_q8 in a step) is numpy's over the same cache."""
    c, be, ref = _pair(dtype)
    assert be.state.kv_k.dtype == np.int8 and be.state.kv_int8
    rng = np.random.default_rng(run)
    hd = c.head_dim
    qn = (1 + 0.1 * rng.standard_normal(hd)).astype(np.float32)
    kn = (1 + 0.1 * rng.standard_normal(hd)).astype(np.float32)
    for batch in _runs()[run]:
        y, r = _attend(be, ref, c, rng, batch, qn, kn)
        assert _rel(y, r) < TOL[dtype] * 3, [s for s in batch.segments]
    _check_codes(ref.own)


@pytest.mark.parametrize("warps", [4, 8])
@pytest.mark.parametrize("splits", [128, 4])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("hq,hkv", [(4, 2), (16, 4), (16, 2)])
def test_decode_attention_q8_lengths(dtype, hq, hkv, splits, warps, monkeypatch):
    """attn_decode_q8 at lengths that end inside a split, on a split boundary and inside a
    warp's group of keys, for 2, 4 and 8 query heads a KV head, in 4 and 8 warps (as
    test_kernels.test_decode_attention_lengths does for the bf16 cache)."""
    monkeypatch.setattr("engine.memory.scratch.ATTN_SPLITS", splits)
    monkeypatch.setattr(
        "engine.backends.cuda.attention.sm_count", lambda: 0 if warps == 4 else 1 << 20
    )
    c, be, ref = _pair(dtype, c=_config(hq=hq, hkv=hkv))
    rng = np.random.default_rng(hq + hkv)
    hd = c.head_dim
    qn = (1 + 0.1 * rng.standard_normal(hd)).astype(np.float32)
    kn = (1 + 0.1 * rng.standard_normal(hd)).astype(np.float32)
    lengths = (300, 63, 5)
    batches = [Batch.window(s, 0, n) for s, n in enumerate(lengths)]
    batches += [Batch.step([(s, n + t) for s, n in enumerate(lengths)]) for t in range(3)]
    for batch in batches:
        y, r = _attend(be, ref, c, rng, batch, qn, kn)
        assert _rel(y, r) < TOL[dtype] * 3, [s for s in batch.segments]
    _check_codes(ref.own)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("n", [1, 33, 300])
def test_kv_dequant_is_code_times_scale(dtype, n):
    """The prompt's dequantization: code * scale in fp32, rounded once to the activation
    type (bit for bit what numpy's dequantize gives, rounded the same way)."""
    import cupy

    be = _cuda(dtype)
    rng = np.random.default_rng(n)
    hd = 256
    codes = [rng.integers(-127, 128, (n, hd), dtype=np.int8) for _ in range(2)]
    scales = [rng.uniform(1e-4, 0.1, n).astype(np.float32) for _ in range(2)]
    out = [cupy.full((n + 5, hd), 7, be.kernels.act_dtype) for _ in range(2)]
    be.attn.dequant(
        tuple(cupy.asarray(a) for a in codes), tuple(cupy.asarray(s) for s in scales), out, n
    )
    for i in range(2):
        got = be.to_host(out[i])
        want = _round(be, kv_int8.dequantize(codes[i], scales[i]))
        assert np.array_equal(got[:n], want)
        assert np.all(got[n:] == be.to_host(cupy.full((5, hd), 7, be.kernels.act_dtype)))


@pytest.mark.parametrize("length", [20, 300, 700])
@pytest.mark.parametrize("fmt", ["mlx4", "bf16"])
def test_fp32_forward_matches_numpy_int8(tiny_dirs, fmt, length):
    """The whole model with the 8-bit cache in fp32 at three context lengths (a prompt of
    700 rows is two windows of at most 512): the numpy 8-bit engine's greedy tokens over
    16 steps, logits within fp32's reach of it."""
    prompt = [(i * 37 + 11) % 1000 for i in range(length)]
    cuda = _model(tiny_dirs[fmt], _cuda("float32"), context=length + 32)
    ref = _model(tiny_dirs[fmt], NumpyBackend(NUMPY_INT8), context=length + 32)
    got, gl = _windowed_greedy(cuda, prompt, 16)
    want, wl = _windowed_greedy(ref, prompt, 16)
    rel = _rel(gl, wl)
    print(f"\n[{fmt} fp32 int8, {length} tokens] relative logit difference {rel:.2e}")
    assert got == want
    assert rel < 1e-3


def _windowed_greedy(model, prompt, steps, window=512):
    """The prompt read in windows of at most `window` rows, then `steps` greedy steps:
    (tokens, the logits each was picked from)."""
    be = model.backend
    for s in range(0, len(prompt), window):
        ids = np.array(prompt[s : s + window])
        logits = model.forward(Batch.window(0, s, len(ids)), ids)
    last = be.to_host(logits)[-1]
    out, seen = [int(last.argmax())], [last]
    for i in range(steps - 1):
        step = Batch.step([(0, len(prompt) + i)])
        last = be.to_host(model.forward(step, np.array([out[-1]])))[-1]
        out.append(int(last.argmax()))
        seen.append(last)
    return out, np.stack(seen)


@pytest.mark.parametrize("fmt", ["mlx4", "bf16"])
def test_bf16_compute_with_the_8_bit_cache_is_as_close_as_the_bf16_cache(tiny_dirs, fmt):
    """In bf16, the 8-bit cache's logits against the numpy 8-bit engine stay within the bound
    the bf16 cache meets against numpy (test_forward.BOUND), and against the bf16 cache on
    the GPU likewise, in prefill (every row) and in decode (fed the same tokens)."""
    ids = np.array(PROMPT)
    batch = Batch.window(0, 0, len(ids))
    models = {
        "int8": _model(tiny_dirs[fmt], _cuda("bfloat16")),
        "bf16": _model(tiny_dirs[fmt], _cuda("bfloat16", "bf16")),
        "numpy": _model(tiny_dirs[fmt], NumpyBackend(NUMPY_INT8)),
    }
    prefill = {
        k: m.backend.to_host(m.forward(batch, ids, all_logits=True)) for k, m in models.items()
    }
    want, _ = _greedy(models["numpy"], PROMPT, 8, slot=1)
    decode = {k: _greedy(m, PROMPT, 8, slot=1, forced=want)[1] for k, m in models.items()}
    # Against numpy's int8 cache (fp32 compute) the codes themselves may differ: a K or V
    # rounded to bf16 before it is quantized can land one code step away (1/127 of the
    # head's largest value, coarser than bf16's own rounding), and the tiny random models
    # amplify that over the decode (mlx4: 0.204 on the H200, where the bf16 cache's own
    # error against fp32 is 0.063). Against the bf16 cache in the same precision, the bound
    # is the bf16 one.
    bounds = {"numpy": 1.5 * BOUND["bfloat16"], "bf16": BOUND["bfloat16"]}
    for other in ("numpy", "bf16"):
        for name, logits in (("prefill", prefill), ("decode", decode)):
            rel = _rel(logits["int8"], logits[other])
            print(f"\n[{fmt} bf16] int8 cache vs {other}: {name} relative logit error {rel:.3e}")
            assert rel <= bounds[other]


def test_step_vs_window_with_the_8_bit_cache(tiny_dirs):
    """512 rows one step at a time and in windows of 64 and 512 rows, then 7 steps: the same
    greedy tokens (fp32), logits within fp32's reach."""
    prompt = [(i * 53 + 7) % 1000 for i in range(512)]
    toks, seen = {}, {}
    for window in (1, 64, 512):
        model = _model(tiny_dirs["mlx4"], _cuda("float32"), slots=1, context=600)
        be = model.backend
        for start in range(0, len(prompt), window):
            rows = prompt[start : start + window]
            batch = Batch.window(0, start, len(rows)) if window > 1 else Batch.step([(0, start)])
            logits = model.forward(batch, np.array(rows))
        out = [be.to_host(logits)[-1]]
        for i in range(7):
            step = Batch.step([(0, 512 + i)])
            out.append(be.to_host(model.forward(step, np.array([int(out[-1].argmax())])))[-1])
        toks[window], seen[window] = [int(x.argmax()) for x in out], np.stack(out)
    assert toks[1] == toks[64] == toks[512], toks
    for window in (64, 512):
        assert _rel(seen[window], seen[1]) < 1e-3, window


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_graph_replay_with_the_8_bit_cache(tiny_dirs, dtype):
    from engine.backends.cuda.graphs import DecodeGraphs

    eager = _model(tiny_dirs["mlx4"], _cuda(dtype), slots=2)
    graphed = _model(tiny_dirs["mlx4"], _cuda(dtype), slots=2)
    graphs = DecodeGraphs(graphed.backend, graphed)
    graphs.capture(2)
    for m in (eager, graphed):
        for slot in range(2):
            m.forward(Batch.window(slot, 0, len(PROMPT)), np.array(PROMPT) + slot)
    toks, worst = [5, 9], 0.0
    for i in range(10):
        batch = Batch.step([(0, 20 + i), (1, 20 + i)])
        want = eager.backend.to_host(eager.forward(batch, np.array(toks)))
        logits, tokens = graphs.replay(batch, np.array(toks))
        worst = max(worst, float(np.abs(graphed.backend.to_host(logits) - want).max()))
        assert list(graphed.backend.to_host(tokens)) == list(want.argmax(1))
        toks = list(want.argmax(1))
    print(f"\n[graph {dtype} int8] largest logit difference graph vs eager: {worst:.3e}")
    assert worst < (1e-4 if dtype == "float32" else 0.1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from engine.testing.synth import write_checkpoint
    from engine.testing.tiny import write_tokenizer

    path = write_checkpoint(tmp_path_factory.mktemp("kv8") / "tiny", "tiny", "mlx4", seed=5)
    write_tokenizer(path)
    return path


def _tokens(engine, ids, n=24):
    params = GenerationParams(max_new_tokens=n, greedy=True)
    return [e.token_id for e in engine.generate(ids, params)]


def _prompt(n, seed=0):
    return np.random.default_rng(seed).integers(0, 400, size=n).tolist()


def test_the_engine_plans_and_holds_the_8_bit_cache(model_dir):
    """Engine.load with the setting: the decision names it, the stream block is the planned
    size (to its 256-byte carves), and the fp32 engine gives the numpy 8-bit engine's tokens."""
    settings = EngineSettings(backend="cuda", compute_dtype="float32", kv_cache="int8")
    engine = Engine.load(model_dir, settings, context=1024, max_rows=256)
    assert engine.decision.kv_cache == "int8"
    assert engine.backend.precision == "cuda:float32:kv-int8"
    held = engine.backend.pool.held_by_tag()["stream"]
    planned = engine.decision.breakdown.stream_state_total
    assert planned <= held <= planned + 16 * 256, (held, planned)
    ids = _prompt(200, seed=1)
    got = _tokens(engine, ids)
    engine.unload()
    numpy = Engine.load(model_dir, NUMPY_INT8, context=1024)
    assert got == _tokens(numpy, ids)
    numpy.unload()


@pytest.mark.parametrize("where", ["card", "host"])
def test_a_restored_snapshot_is_the_saved_state_and_resumes_as_fresh(model_dir, where, monkeypatch):
    """The prompt cache with the 8-bit cache, its saved states on the card or in pinned
    host memory: a follow-up turn restores the state bit for bit (codes and scales) and
    gives the tokens of a fresh prefill. It runs in fp32: the restored state holds the
    reply's rows as its decode steps wrote them, a fresh prefill computes them in one
    window, and in bf16 the two differ by enough rounding to turn a close greedy pick
    (which one depends on the variants the step tuning chose at load)."""
    import dataclasses

    import engine.session as session

    if where == "host":
        admit = session.admit_load

        def on_host(*args, **kw):
            return dataclasses.replace(admit(*args, **kw), prompt_cache_on_host=True)

        monkeypatch.setattr(session, "admit_load", on_host)
    settings = EngineSettings(backend="cuda", compute_dtype="float32", kv_cache="int8")
    engine = Engine.load(model_dir, settings, context=1024, max_rows=256)
    first = _prompt(150, seed=3)
    follow = first + _tokens(engine, first) + _prompt(40, seed=4)
    entry = engine.prompt_cache.lookup(follow)
    assert entry is not None and ("pinned" in entry.snapshot) == (where == "host")
    be = engine.backend
    be.restore_slot(0, entry.snapshot)
    again = be.snapshot_to_host(be.state._save_to_host(0, entry.snapshot["length"]))
    saved = be.snapshot_to_host(entry.snapshot)
    assert set(again.arrays) == set(saved.arrays)
    assert saved.arrays["kv_k.0"].dtype == np.int8 and "kv_v_scale.0" in saved.arrays
    for name, array in saved.arrays.items():
        assert np.array_equal(again.arrays[name], array), name
    resumed = _tokens(engine, follow)
    engine.prompt_cache.clear()
    assert _tokens(engine, follow) == resumed
    engine.unload()
