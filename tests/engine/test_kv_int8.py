"""The 8-bit KV cache on the host: its quantizer, the setting, the numpy backend that is the
reference for the CUDA kernels (tests/device/test_kv_int8_cuda.py), its snapshots, and its quality
against the cache in full precision on the tiny references."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends import kv_int8
from engine.backends.base import Batch
from engine.backends.numpy_backend import NumpyBackend
from engine.checkpoint import Checkpoint
from engine.config import EngineSettings
from engine.errors import ConfigError
from engine.models.qwen35 import Qwen35Model
from engine.session import Engine, GenerationParams
from engine.snapshot_store import HostSnapshot, SnapshotMismatch
from engine.testing import kv_quality
from engine.testing.synth import write_checkpoint

INT8 = EngineSettings(backend="numpy", kv_cache="int8")


def test_codes_and_scales_are_the_documented_ones():
    """amax / 127 and rint(x * 127 / amax), half to even, in fp32."""
    x = np.array([[1.0, -0.5, 0.25, 0.0], [0.0, 0.0, 0.0, 0.0], [-2.0, 1.0, 3e-3, -7.9e-3]])
    codes, scales = kv_int8.quantize(x.astype(np.float32))
    assert codes.dtype == np.int8 and scales.dtype == np.float32
    assert codes[0].tolist() == [127, -64, 32, 0]  # -63.5 rounds to the even -64
    assert codes[1].tolist() == [0, 0, 0, 0] and scales[1] == 0  # a zero row stays zero
    assert codes[2].tolist() == [-127, 64, 0, -1]
    assert scales[0] == np.float32(1) / np.float32(127)
    assert scales[2] == np.float32(2) / np.float32(127)


def test_a_row_comes_back_within_half_a_step():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((64, 4, 256)) * rng.uniform(0.01, 30, (64, 4, 1))).astype(np.float32)
    codes, scales = kv_int8.quantize(x)
    back = kv_int8.dequantize(codes, scales)
    assert np.abs(codes).max() == 127 and codes.min() >= -127
    assert np.all(np.abs(back - x) <= scales[..., None] / 2 * (1 + 1e-6))
    top = np.abs(x).argmax(-1)[..., None]  # a row's largest element takes the code 127
    assert np.all(np.abs(np.take_along_axis(codes.astype(int), top, -1)) == 127)


def test_the_setting_from_env_and_its_refusal():
    assert EngineSettings().kv_cache == "bf16"
    assert EngineSettings.from_env({"SNUG_KV_CACHE": " INT8 "}).kv_cache == "int8"
    with pytest.raises(ConfigError, match="kv_cache 'fp8' is unknown.*SNUG_KV_CACHE.*--kv-cache"):
        EngineSettings.from_env({"SNUG_KV_CACHE": "fp8"})
    with pytest.raises(ConfigError, match="choose bf16 or int8"):
        EngineSettings(kv_cache="q4")


def test_the_cli_flag_reaches_the_settings_of_each_command():
    from engine.cli import _settings, build_parser

    parser = build_parser()
    args = parser.parse_args(["generate", "--model", "m", "--prompt", "hi", "--kv-cache", "int8"])
    assert _settings(args).kv_cache == "int8"
    args = parser.parse_args(["generate", "--model", "m", "--prompt", "hi"])
    assert _settings(args).kv_cache == EngineSettings.from_env().kv_cache
    assert parser.parse_args(["serve", "--model", "m", "--kv-cache", "int8"]).kv_cache == "int8"
    with pytest.raises(SystemExit):
        parser.parse_args(["plan", "--shape", "4B", "--kv-cache", "fp8"])


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    """The tiny synth checkpoint (head dim 256, as the real models), MLX 4-bit."""
    return write_checkpoint(tmp_path_factory.mktemp("kv8") / "tiny", "tiny", "mlx4", seed=3)


def _model(path, settings, slots=2, context=400):
    backend = NumpyBackend(settings)
    ck = Checkpoint.open(path)
    weights = backend.load_weights(ck, ck.config)
    backend.alloc_state(ck.config, slots, context)
    return Qwen35Model(ck.config, backend, weights)


def test_the_numpy_state_holds_codes_and_scales(synth):
    full, small = _model(synth, EngineSettings(backend="numpy")), _model(synth, INT8)
    be, c = small.backend, small.config
    assert be.kv_k[0].dtype == np.int8 and be.kv_k_scale[0].shape == (2, 2, 400)
    assert be.precision == "numpy:float32:kv-int8" and full.backend.precision == "numpy:float32"
    kv = sum(a.nbytes for a in (*be.kv_k, *be.kv_v, *be.kv_k_scale, *be.kv_v_scale))
    assert kv == 2 * len(c.full_layers) * 2 * c.num_key_value_heads * 400 * (c.head_dim + 4)
    ids = np.arange(40) * 7 % 1000
    small.forward(Batch.window(0, 0, 40), ids)
    full.forward(Batch.window(0, 0, 40), ids)
    codes, scales = kv_int8.quantize(full.backend.kv_k[0][0, :, :40])
    assert np.array_equal(be.kv_k[0][0, :, :40], codes)  # the same keys, quantized once
    assert np.array_equal(be.kv_k_scale[0][0, :, :40], scales)
    assert not be.kv_k[0][0, :, 40:].any() and not be.kv_k[0][1].any()


def test_step_and_window_give_the_same_logits(synth):
    """Every row attends to the dequantized cache, its own key and value included, so a
    prompt read in windows and one token at a time agree as closely as in fp32."""
    ids = (np.arange(150) * 53 + 7) % 1000
    out = {}
    for window in (1, 64, 150):
        model = _model(synth, INT8, slots=1)
        for start in range(0, len(ids), window):
            rows = ids[start : start + window]
            batch = Batch.window(0, start, len(rows)) if window > 1 else Batch.step([(0, start)])
            logits = model.forward(batch, rows)
        out[window] = logits[-1]
    scale = np.abs(out[1]).max()
    assert np.abs(out[64] - out[1]).max() < 1e-4 * scale
    assert np.abs(out[150] - out[1]).max() < 1e-4 * scale


def test_snapshots_carry_the_scales_and_restore_exactly(synth):
    model = _model(synth, INT8)
    be = model.backend
    ids = (np.arange(60) * 11) % 1000
    model.forward(Batch.window(0, 0, 60), ids)
    snap = be.save_slot(0, 60)
    host = be.snapshot_to_host(snap)
    assert host.arrays["kv_k.0"].dtype == np.int8 and host.arrays["kv_k_scale.0"].shape == (2, 60)
    after = model.forward(Batch.step([(0, 60)]), np.array([5]))
    be.restore_slot(1, host)
    again = model.forward(Batch.step([(1, 60)]), np.array([5]))
    assert np.array_equal(after, again)
    be.restore_slot(1, snap)
    assert np.array_equal(be.kv_v_scale[0][1, :, :60], be.kv_v_scale[0][0, :, :60])
    assert not be.kv_v_scale[0][1, :, 60:].any()
    fp32 = _model(synth, EngineSettings(backend="numpy")).backend
    with pytest.raises(SnapshotMismatch):  # another cache's state is refused, not cast
        fp32.restore_slot(0, host)
    no_scales = {k: v for k, v in host.arrays.items() if "scale" not in k}
    with pytest.raises(SnapshotMismatch, match="missing"):
        be.restore_slot(1, HostSnapshot(60, no_scales))


def test_a_chat_resumed_from_disk_gives_the_tokens_of_a_fresh_one(synth, tmp_path):
    """Through the engine's prompt cache: the first turn's state goes to the disk tier
    (safetensors, keyed by the precision, which names the 8-bit cache), an engine loaded
    again restores it for the next turn, and the reply is a fresh prefill's."""
    from engine.testing.tiny import write_tokenizer

    write_tokenizer(synth)
    params = GenerationParams(max_new_tokens=8, greedy=True)
    settings = EngineSettings(backend="numpy", kv_cache="int8", prompt_cache_dir=str(tmp_path))
    first = [(i * 37 + 11) % 400 for i in range(70)]
    engine = Engine.load(synth, settings, context=256, max_rows=64)
    follow = first + [e.token_id for e in engine.generate(first, params)] + [5, 6, 7]
    engine.unload()
    assert list(tmp_path.glob("*.safetensors"))
    engine = Engine.load(synth, settings, context=256, max_rows=64)  # a restart
    resumed = [e.token_id for e in engine.generate(follow, params)]
    assert engine.prompt_cache.stats.hits["disk"] == 1
    engine.unload()
    fresh = Engine.load(synth, EngineSettings(backend="numpy", kv_cache="int8"), context=256)
    assert resumed == [e.token_id for e in fresh.generate(follow, params)]
    fresh.unload()


def _quality(path, name):
    prompt = kv_quality.prompt_ids(200, 400)
    return {q.cache: q for q in kv_quality.measure(path, name, prompt, 24)}


def _check(q):
    """The 8-bit cache against the fp32 one (docs/kernels.md has the figures): logits within
    a few percent of their range and the same argmax on nearly every row; and its error
    above the bf16 cache's, which it is measured next to (a cache left unquantized would
    show none)."""
    int8, bf16 = q["int8"], q["bf16"]
    assert int8.prefill_rel < 5e-2 and int8.decode_rel < 5e-3, int8
    assert int8.top1 >= 0.98 and int8.greedy_same >= 8, int8
    assert bf16.prefill_rel < int8.prefill_rel and bf16.decode_rel < int8.decode_rel, q


def test_quality_on_the_head_dim_256_model(synth):
    _check(_quality(synth, "synth"))


@pytest.mark.parametrize("preset", ["tied-l4-r1", "untied-l8-r2", "tied-l8-r4-hd64"])
def test_quality_on_the_tiny_references(tiny_checkpoint, preset):
    _check(_quality(tiny_checkpoint(preset, "hf-fp32"), preset))
