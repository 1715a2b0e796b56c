"""Host reference backend: every op in float32 numpy, written for clarity over speed.

Quantized weights stay packed; `linear` dequantizes blocks of output rows as it goes, so the
whole model is never dequantized at once. This backend is also the reference that the CUDA
backend's tests compare against.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from engine.backends import gdn, kv_int8
from engine.backends.base import KV_SCALE_PARTS, STATE_PARTS, Backend, Batch
from engine.backends.verify_rows import VerifyRows
from engine.config import EngineSettings
from engine.model_config import ModelConfig
from engine.snapshot_store import HostSnapshot, SnapshotMismatch

# Output rows of a quantized weight dequantized at once by `linear` (bounds host memory).
DEQUANT_BLOCK_ROWS = 4096
# Dequantized float32 copies of quantized matrices are kept for speed up to this share of
# the machine's memory (at most MAX_CACHE_BYTES); the rest is dequantized block by block on
# every use. Decode on the host is bound by this: ~2 s/token for 0.8B 4-bit without it.
CACHE_SHARE_OF_RAM = 0.35
MAX_CACHE_BYTES = 16 << 30


def default_cache_bytes() -> int:
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0
    return int(min(ram * CACHE_SHARE_OF_RAM, MAX_CACHE_BYTES))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def softplus(x: np.ndarray) -> np.ndarray:
    # log(1 + e^x) without overflow; matches torch's softplus (threshold 20) to fp32 precision.
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def rms(x: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def rope_half_split(x: np.ndarray, positions: np.ndarray, rotary_dim: int, theta: float):
    """Rotate the first `rotary_dim` dims of `x [R, heads, hd]` in (j, j + rotary_dim/2) pairs."""
    half = rotary_dim // 2
    inv_freq = 1.0 / (theta ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim))
    angles = positions.astype(np.float64)[:, None] * inv_freq[None, :]  # [R, half]
    cos = np.cos(angles).astype(np.float32)[:, None, :]
    sin = np.sin(angles).astype(np.float32)[:, None, :]
    out = x.copy()
    lo, hi = x[..., :half], x[..., half:rotary_dim]
    out[..., :half] = lo * cos - hi * sin
    out[..., half:rotary_dim] = hi * cos + lo * sin
    return out


def _is_quantized(w: Any) -> bool:
    return hasattr(w, "packed")


class _Ran:
    """A step `NumpyBackend.launch_step` has run already: its picks."""

    def __init__(self, picks: list[int]) -> None:
        self.picks = picks

    def tokens(self) -> list[int]:
        return self.picks


class NumpyBackend(Backend):
    """float32 host ops; state is plain numpy arrays indexed by slot."""

    name = "numpy"

    def __init__(
        self, settings: EngineSettings | None = None, cache_bytes: int | None = None
    ) -> None:
        super().__init__(settings)
        self.cache_bytes = default_cache_bytes() if cache_bytes is None else cache_bytes
        self._dequantized: dict[int, np.ndarray] = {}  # id(quantized weight) -> float32
        self._cached_bytes = 0
        self.config: ModelConfig | None = None
        self.kv_k: list[np.ndarray] = []
        self.kv_v: list[np.ndarray] = []
        self.conv: list[np.ndarray] = []
        self.recurrent: list[np.ndarray] = []
        # The 8-bit KV cache (settings.kv_cache "int8"): kv_k / kv_v hold int8 codes and
        # these their fp32 scales, one per token and KV head (engine/backends/kv_int8.py).
        self.kv_int8 = self.settings.kv_cache == kv_int8.KV_INT8
        self.kv_k_scale: list[np.ndarray] = []
        self.kv_v_scale: list[np.ndarray] = []
        self.context = 0
        self.verify_rows: VerifyRows | None = None  # a drafting verify's kept rows
        # Steps launched ahead (`launch_step`), off unless asked: the host tests turn it on
        # to run the reply loops that a GPU runs pipelined. Each step runs at once; the
        # contract (the next step fed by the last one's picks) is the CUDA backend's.
        self.launch_ahead = False
        self._model: Any = None
        self._launched: tuple[list[tuple[int, int]], np.ndarray] | None = None
        self._launching = False

    # ----- steps launched ahead -------------------------------------------------------------
    def warm_up(self, model: Any, eager: bool) -> None:
        self._model = model  # what `launch_step` runs

    @property
    def launches_steps(self) -> bool:
        return self.launch_ahead

    def launch_step(self, batch: Batch | None, ids: Any, rows: list) -> _Ran:
        """The step at once, its greedy picks kept (batch None: each stream's next position,
        fed by the last step's picks). Draws are the host sampler's here: none is taken."""
        if not self.launch_ahead or any(r is not None for r in rows):
            raise NotImplementedError("the numpy backend launches greedy steps, when asked")
        if batch is None:
            if self._launched is None:
                raise RuntimeError("no launched step to follow: another forward ran since")
            last, ids = self._launched
            batch = Batch.step([(slot, pos + 1) for slot, pos in last])
        self._launching = True
        try:
            logits = self._model.forward(batch, np.asarray(ids, np.int64))
        finally:
            self._launching = False
        picks = self.argmax_rows(logits)
        self._launched = ([(seg.slot, seg.start) for seg in batch.segments], picks)
        return _Ran([int(t) for t in picks])

    # ----- weights ------------------------------------------------------------------------
    def load_weights(self, checkpoint: Any, config: ModelConfig) -> dict[str, Any]:
        self.config = config
        weights = {}
        for name in checkpoint.tensors:
            if name.startswith("mtp.") and not self.draft_tokens:
                continue
            weights[name] = checkpoint.read(name)
        self._cache_dequantized(weights, config)
        return weights

    def _cache_dequantized(self, weights: dict[str, Any], config: ModelConfig) -> None:
        """Keep float32 copies of quantized projections while the budget lasts, largest
        reads per token first (the embedding table counts only when it is also the head)."""
        names = [n for n, w in weights.items() if _is_quantized(w)]
        if not config.tie_word_embeddings:
            names = [n for n in names if n != "embed_tokens"]
        for name in names:
            w = weights[name]
            nbytes = 4 * w.shape[0] * w.shape[1]
            if self._cached_bytes + nbytes <= self.cache_bytes:
                self._dequantized[id(w)] = w.dequantize()
                self._cached_bytes += nbytes

    def _state_arrays(self) -> tuple[np.ndarray, ...]:
        return (*self.kv_k, *self.kv_v, *self.conv, *self.recurrent, *self._scales())

    def _scales(self) -> tuple[np.ndarray, ...]:
        return (*self.kv_k_scale, *self.kv_v_scale)

    @property
    def parts(self) -> tuple[str, ...]:
        """A snapshot's parts: the scales follow the four of STATE_PARTS in int8."""
        return STATE_PARTS + (KV_SCALE_PARTS if self.kv_int8 else ())

    def held_bytes(self) -> int:
        return sum(a.nbytes for a in self._state_arrays()) + self._cached_bytes

    def release(self) -> None:
        """Drop the dequantized copies and the stream state."""
        self._dequantized.clear()
        self._cached_bytes = 0
        self.kv_k, self.kv_v, self.conv, self.recurrent = [], [], [], []
        self.kv_k_scale, self.kv_v_scale = [], []

    # ----- state --------------------------------------------------------------------------
    def alloc_state(self, config: ModelConfig, slots: int, context: int) -> None:
        c = config
        self.config, self.context = c, context
        kv_shape = (slots, c.num_key_value_heads, context, c.head_dim)
        kv_dtype = np.int8 if self.kv_int8 else np.float32
        self.kv_k = [np.zeros(kv_shape, kv_dtype) for _ in c.full_layers]
        self.kv_v = [np.zeros(kv_shape, kv_dtype) for _ in c.full_layers]
        scales = kv_shape[:3] if self.kv_int8 else None
        self.kv_k_scale = [np.zeros(scales, np.float32) for _ in c.full_layers if scales]
        self.kv_v_scale = [np.zeros(scales, np.float32) for _ in c.full_layers if scales]
        conv_shape = (slots, c.linear_conv_kernel_dim - 1, c.conv_dim)
        self.conv = [np.zeros(conv_shape, np.float32) for _ in c.linear_layers]
        rec_shape = (
            slots,
            c.linear_num_value_heads,
            c.linear_key_head_dim,
            c.linear_value_head_dim,
        )
        self.recurrent = [np.zeros(rec_shape, np.float32) for _ in c.linear_layers]
        self.verify_rows = VerifyRows(c, slots, self.draft_tokens) if self.draft_tokens else None
        if self.draft_tokens:  # the MTP head's KV layer, after the model's own
            for layers in (self.kv_k, self.kv_v, self.kv_k_scale, self.kv_v_scale):
                if layers:
                    layers.append(np.zeros_like(layers[-1]))

    def rewind(self, slot: int, rows: int) -> None:
        if self.verify_rows is None:
            super().rewind(slot, rows)
        self.verify_rows.rewind(self.conv, self.recurrent, slot, rows)

    def reset_slot(self, slot: int) -> None:
        for arr in self._state_arrays():
            arr[slot] = 0

    def save_slot(self, slot: int, length: int) -> Any:
        out = {
            "length": length,
            "kv_k": [a[slot, :, :length].copy() for a in self.kv_k],
            "kv_v": [a[slot, :, :length].copy() for a in self.kv_v],
            "conv": [a[slot].copy() for a in self.conv],
            "recurrent": [a[slot].copy() for a in self.recurrent],
        }
        if self.kv_int8:
            out["kv_k_scale"] = [a[slot, :, :length].copy() for a in self.kv_k_scale]
            out["kv_v_scale"] = [a[slot, :, :length].copy() for a in self.kv_v_scale]
        return out

    def restore_slot(self, slot: int, snapshot: Any) -> None:
        self.reset_slot(slot)
        if isinstance(snapshot, HostSnapshot):
            snapshot = self._from_host(snapshot)
        n = snapshot["length"]
        for dst, src in zip(self.kv_k, snapshot["kv_k"], strict=True):
            dst[slot, :, :n] = src
        for dst, src in zip(self.kv_v, snapshot["kv_v"], strict=True):
            dst[slot, :, :n] = src
        for dst, src in zip(self.conv, snapshot["conv"], strict=True):
            dst[slot] = src
        for dst, src in zip(self.recurrent, snapshot["recurrent"], strict=True):
            dst[slot] = src
        for part in KV_SCALE_PARTS if self.kv_int8 else ():
            for dst, src in zip(getattr(self, part), snapshot[part], strict=True):
                dst[slot, :, :n] = src

    def _from_host(self, host: HostSnapshot) -> dict:
        """`save_slot`'s dict from a HostSnapshot whose arrays are exactly this state's
        (SnapshotMismatch otherwise: nothing is broadcast or cast)."""
        n = host.length
        if not 0 < n <= self.context:
            raise SnapshotMismatch(f"snapshot of {n} tokens for a context of {self.context}")
        f32, kv = np.dtype(np.float32), np.dtype(np.int8 if self.kv_int8 else np.float32)
        layers = {
            "kv_k": [((a.shape[1], n, a.shape[3]), kv) for a in self.kv_k],
            "kv_v": [((a.shape[1], n, a.shape[3]), kv) for a in self.kv_v],
            "conv": [(a.shape[1:], f32) for a in self.conv],
            "recurrent": [(a.shape[1:], f32) for a in self.recurrent],
            "kv_k_scale": [((a.shape[1], n), f32) for a in self.kv_k_scale],
            "kv_v_scale": [((a.shape[1], n), f32) for a in self.kv_v_scale],
        }
        host.check(
            {f"{part}.{i}": spec for part in self.parts for i, spec in enumerate(layers[part])}
        )
        out: dict = {"length": n}
        for part in self.parts:
            out[part] = [host.arrays[f"{part}.{i}"] for i in range(len(layers[part]))]
        return out

    # ----- host transfer ------------------------------------------------------------------
    def to_host(self, x: Any) -> np.ndarray:
        return np.asarray(x)

    def prepare(self, batch: Batch, ids: np.ndarray) -> Any:
        batch.check_context(self.context)
        if not self._launching:  # as on a GPU, any other forward rewrites the batch layout
            self._launched = None  # that a step launched next (batch None) would follow
        return np.asarray(ids, dtype=np.int64)

    # ----- ops ----------------------------------------------------------------------------
    def embedding(self, table: Any, ids: Any) -> Any:
        if _is_quantized(table):
            return table.dequantize(np.asarray(ids, np.int64))
        return table[ids].astype(np.float32)

    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any:
        return rms(x, eps) * weight

    def add_rms_norm(self, x: Any, delta: Any, weight: Any, eps: float) -> tuple[Any, Any]:
        h = x + delta
        return rms(h, eps) * weight, h

    def linear(self, x: Any, weight: Any) -> Any:
        if not _is_quantized(weight):
            return x @ weight.T
        dense = self._dequantized.get(id(weight))
        if dense is not None:
            return x @ dense.T
        out_features = weight.shape[0]
        out = np.empty((x.shape[0], out_features), np.float32)
        for start in range(0, out_features, DEQUANT_BLOCK_ROWS):
            block = slice(start, min(start + DEQUANT_BLOCK_ROWS, out_features))
            out[:, block] = x @ weight.dequantize(block).T
        return out

    def mlp(self, x: Any, gate: Any, up: Any, down: Any) -> Any:
        return self.linear(silu(self.linear(x, gate)) * self.linear(x, up), down)

    def take_rows(self, x: Any, rows: np.ndarray) -> Any:
        return x[rows]

    def attention(
        self,
        layer: int,
        qg: Any,
        k: Any,
        v: Any,
        q_norm: Any,
        k_norm: Any,
        batch: Batch,
        ahead: tuple = (),
    ) -> Any:
        c = self.config
        R, Hq, Hkv, hd = qg.shape[0], c.num_attention_heads, c.num_key_value_heads, c.head_dim
        qg = qg.reshape(R, Hq, 2 * hd)  # per head: query | gate
        q, gate = qg[..., :hd], qg[..., hd:].reshape(R, Hq * hd)
        q = rms(q, c.rms_norm_eps) * q_norm  # [R, Hq, hd]
        k = rms(k.reshape(R, Hkv, hd), c.rms_norm_eps) * k_norm  # [R, Hkv, hd]
        v = v.reshape(R, Hkv, hd)
        pos = batch.positions()
        q = rope_half_split(q, pos, c.rotary_dim, c.rope_theta)
        k = rope_half_split(k, pos, c.rotary_dim, c.rope_theta)
        group, scale = Hq // Hkv, hd**-0.5
        out = np.empty((R, Hq, hd), np.float32)
        row = 0
        for seg in batch.segments:
            rows = slice(row, row + seg.rows)
            end = seg.start + seg.rows
            self._write_kv(layer, seg.slot, seg.start, k[rows], v[rows])
            cache_k, cache_v = self._read_kv(layer, seg.slot, end)  # [Hkv, T, hd] each
            keys = np.repeat(cache_k, group, axis=0)  # [Hq, T, hd]
            values = np.repeat(cache_v, group, axis=0)
            qh = q[rows].transpose(1, 0, 2)  # [Hq, rows, hd]
            scores = (qh @ keys.transpose(0, 2, 1)) * scale  # [Hq, rows, T]
            visible = np.arange(end)[None, :] <= (seg.start + np.arange(seg.rows))[:, None]
            scores = np.where(visible[None], scores, -np.inf)
            scores -= scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            out[rows] = (probs @ values).transpose(1, 0, 2)
            row += seg.rows
        return out.reshape(R, Hq * hd) * sigmoid(gate)

    def _write_kv(self, layer: int, slot: int, start: int, k: Any, v: Any) -> None:
        """Keys and values `[T, Hkv, hd]` of positions start.. into the slot's cache (as int8
        codes and scales in the 8-bit cache)."""
        span = slice(start, start + k.shape[0])
        pairs = ((self.kv_k, self.kv_k_scale, k), (self.kv_v, self.kv_v_scale, v))
        for cache, scales, x in pairs:
            rows = x.transpose(1, 0, 2)  # [Hkv, T, hd]
            if self.kv_int8:
                cache[layer][slot, :, span], scales[layer][slot, :, span] = kv_int8.quantize(rows)
            else:
                cache[layer][slot, :, span] = rows

    def _read_kv(self, layer: int, slot: int, end: int) -> tuple[Any, Any]:
        """The slot's first `end` keys and values, `[Hkv, end, hd]` fp32 each (the 8-bit
        cache's dequantized: what every later row of attention reads)."""
        k, v = self.kv_k[layer][slot, :, :end], self.kv_v[layer][slot, :, :end]
        if not self.kv_int8:
            return k, v
        ks, vs = self.kv_k_scale[layer][slot, :, :end], self.kv_v_scale[layer][slot, :, :end]
        return kv_int8.dequantize(k, ks), kv_int8.dequantize(v, vs)

    def gated_delta(
        self, layer: int, mixed: Any, z: Any, b: Any, a: Any, weights: dict, batch: Batch
    ) -> Any:
        c = self.config
        Hk, Hv = c.linear_num_key_heads, c.linear_num_value_heads
        dk, dv, K, KD = (
            c.linear_key_head_dim,
            c.linear_value_head_dim,
            c.linear_conv_kernel_dim,
            c.key_dim,
        )
        conv_w = weights["conv1d"]  # [C, K]; tap K-1 multiplies the current token
        beta = sigmoid(b)  # [R, Hv]
        g = -np.exp(weights["A_log"].astype(np.float32)) * softplus(a + weights["dt_bias"])
        out = np.empty((mixed.shape[0], Hv, dv), np.float32)
        row = 0
        for seg in batch.segments:
            rows = slice(row, row + seg.rows)
            history = np.concatenate([self.conv[layer][seg.slot], mixed[rows]])  # [K-1+T, C]
            self.conv[layer][seg.slot] = history[-(K - 1) :]
            conv = sum(history[j : j + seg.rows] * conv_w[:, j] for j in range(K))  # [T, C]
            conv = silu(conv)
            q = conv[:, :KD].reshape(seg.rows, Hk, dk)
            k = conv[:, KD : 2 * KD].reshape(seg.rows, Hk, dk)
            v = conv[:, 2 * KD :].reshape(seg.rows, Hv, dv)
            q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) * dk**-0.5
            k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
            q = np.repeat(q, Hv // Hk, axis=1)  # value head h reads key head h // (Hv/Hk)
            k = np.repeat(k, Hv // Hk, axis=1)
            state = self.recurrent[layer][seg.slot]  # [Hv, dk, dv] fp32, updated in place
            # A window runs the chunked form (big products); a step the recurrence.
            rule = gdn.chunked if seg.rows >= gdn.CHUNK else gdn.recurrent
            if seg.keep and self.verify_rows is not None:  # a verify: each row's state kept
                args = (q, k, v, g[rows], beta[rows], state)
                out[rows] = self.verify_rows.scan(layer, seg.slot, history, *args)
            else:
                out[rows] = rule(q, k, v, g[rows], beta[rows], state)
            row += seg.rows
        zz = z.reshape(-1, Hv, dv)
        y = rms(out, c.rms_norm_eps) * weights["norm"] * silu(zz)
        return y.reshape(-1, Hv * dv)
