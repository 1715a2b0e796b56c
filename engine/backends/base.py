"""The op interface the Qwen3.5 forward is written against, once, for every backend.

A backend owns three things: the weights (uploaded once), the per-stream state (KV cache of
the full-attention layers, conv and recurrent state of the DeltaNet layers, one *slot* per
stream) and the ops. Arrays passed between ops are the backend's own (numpy or CuPy), 2-D
`[R, N]` row-major, R = rows of the forward pass.

A forward pass is described by a `Batch`: segments, one per stream, each a run of consecutive
positions of that stream. A window (prefill) is one segment of many rows; a step (decode) is
one row for each of several streams. The mixer ops (`attention`, `gated_delta`) read and
update the state slots named by the segments, so step and window share every line of model
code.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from engine import speculative
from engine.config import EngineSettings
from engine.errors import RequestRefused
from engine.model_config import ModelConfig
from engine.snapshot_store import HostSnapshot

if TYPE_CHECKING:
    from engine.memory import Decision, DevicePool


@dataclass(frozen=True)
class Segment:
    """`rows` consecutive tokens of the stream in state slot `slot`, from position `start`.
    `keep`: a drafting verify (engine/drafting.py); the DeltaNet layers keep the state after
    each of its rows, so that `Backend.rewind` can return to any of them exactly."""

    slot: int
    start: int
    rows: int
    keep: bool = False


@dataclass(frozen=True)
class Batch:
    """The row layout of one forward pass: segments laid end to end."""

    segments: tuple[Segment, ...]

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.segments)

    @property
    def is_step(self) -> bool:
        """Every segment is a single row (the decode path)."""
        return all(s.rows == 1 for s in self.segments)

    def per_row(self, most: int) -> bool:
        """A step, or a batch of at most `most` rows (a drafting verify, the MTP head's
        windows, a prompt's short tail, where the backend's step buffers hold that many):
        each row's attention can run on its own over the cache, up to its own position
        (every row's keys are in the cache before any row reads them), as a decode step's
        rows do, with the positions read on the device."""
        return self.is_step or self.rows <= most

    def positions(self) -> np.ndarray:
        """Absolute position of every row, `[R]` int32."""
        parts = [np.arange(s.start, s.start + s.rows, dtype=np.int32) for s in self.segments]
        return np.concatenate(parts) if parts else np.zeros(0, np.int32)

    def check_context(self, context: int) -> None:
        """Refuse (RequestRefused) a batch that would take a stream past `context` tokens."""
        for seg in self.segments:
            if seg.start + seg.rows > context:
                raise RequestRefused(
                    f"stream {seg.slot} would reach {seg.start + seg.rows} tokens but the "
                    f"admitted context is {context}; raise the context (the load panel's "
                    "Context, or --context) or start a new chat"
                )

    def last_rows(self) -> np.ndarray:
        """Index of each segment's last row, `[S]` int32 (the rows that produce logits)."""
        ends = np.cumsum([s.rows for s in self.segments]) - 1
        return ends.astype(np.int32)

    @staticmethod
    def window(slot: int, start: int, rows: int) -> Batch:
        return Batch((Segment(slot, start, rows),))

    @staticmethod
    def verify(slot: int, start: int, rows: int) -> Batch:
        """A window whose rows' DeltaNet states are kept (`Segment.keep`)."""
        return Batch((Segment(slot, start, rows, keep=True),))

    @staticmethod
    def step(slots_and_positions: list[tuple[int, int]]) -> Batch:
        return Batch(tuple(Segment(slot, pos, 1) for slot, pos in slots_and_positions))


STATE_PARTS = ("kv_k", "kv_v", "conv", "recurrent")  # a snapshot's parts, in this order
# The 8-bit KV cache's scales (engine/backends/kv_int8.py), after those in its snapshots.
KV_SCALE_PARTS = ("kv_k_scale", "kv_v_scale")


class PendingStep(Protocol):
    """A decode step launched without waiting (`Backend.launch_step`)."""

    def tokens(self) -> list[int]:
        """Wait for the step; each row's picked token."""
        ...


class Backend(ABC):
    """Ops for the Qwen3.5 forward. `Any` below stands for the backend's array type.

    The contract with the session, in the order a load uses it:

    1. `pool`: a backend whose memory is admitted (a GPU) has a `DevicePool`; the session
       then plans the load against it (`engine.memory.admission.decide`) before anything is
       allocated. None: state lives in host memory and nothing is planned.
    2. `configure(decision, vocab_rows)`: what admission decided (rows per forward, where
       the embedding table lives, prefill attention's query rows) and how many rows of the
       LM head are real tokens (`vocab_rows`: the rest is padding that sampling skips).
    3. `load_weights`, `alloc_state`, then `warm_up`.
    4. Per request: `prepare` + the ops (through `engine.models.qwen35`), `decode_step`, and
       where `launches_steps`, `launch_step`; where `samples_on_device`, `sample_rows`.
    5. `release` at unload.

    Every capability past the abstract ops has a default that is right for a host backend.
    """

    name: str = "abstract"
    pool: DevicePool | None = None
    vocab_rows: int = 0

    def __init__(self, settings: EngineSettings | None = None) -> None:
        self.settings = settings or EngineSettings()

    # ----- what admission decided -----------------------------------------------------------
    @property
    def act_itemsize(self) -> int:
        """Bytes per activation element (the planner sizes state and scratch with it)."""
        return 4

    def configure(self, decision: Decision | None, vocab_rows: int) -> None:
        """Take what admission decided (None where nothing is planned) before the weights
        are loaded. `vocab_rows`: rows of the LM head that are real tokens."""
        self.vocab_rows = vocab_rows

    def held_bytes(self) -> int:
        """Bytes this backend holds where the plan counts them (0: nothing planned)."""
        return 0

    # ----- weights ------------------------------------------------------------------------
    @abstractmethod
    def load_weights(self, checkpoint: Any, config: ModelConfig) -> dict[str, Any]:
        """Upload every tensor the forward needs; return internal name -> backend weight."""

    # ----- state --------------------------------------------------------------------------
    @abstractmethod
    def alloc_state(self, config: ModelConfig, slots: int, context: int) -> None:
        """Allocate state for `slots` streams of up to `context` tokens each (zeroed)."""

    @abstractmethod
    def reset_slot(self, slot: int) -> None:
        """Zero one stream's state so it can start a new sequence."""

    @abstractmethod
    def save_slot(self, slot: int, length: int) -> Any:
        """Snapshot one stream's state (first `length` tokens of KV) for the prompt cache."""

    @abstractmethod
    def restore_slot(self, slot: int, snapshot: Any) -> None:
        """Put a snapshot back into a slot: one taken by `save_slot`, or a HostSnapshot
        (`snapshot_to_host`'s, maybe read back from disk). A HostSnapshot whose arrays are
        not exactly this state's (names, shapes, dtypes) raises SnapshotMismatch, with the
        slot left reset."""

    @property
    def precision(self) -> str:
        """What a saved state's bytes depend on besides the model: the backend and its
        activation type ("numpy:float32", "cuda:bfloat16"), and the KV cache where it is
        not the default (":kv-int8"). The disk tier keys files by it."""
        return f"{self.name}:float32{self.kv_tag}"

    @property
    def kv_tag(self) -> str:
        """The KV cache in `precision`: "" for the default, ":kv-int8" for the 8-bit one;
        ":mtp" after it where a saved state holds the MTP head's KV layer (drafting)."""
        kv = self.settings.kv_cache
        return ("" if kv == "bf16" else f":kv-{kv}") + (":mtp" if self.draft_tokens else "")

    def snapshot_to_host(self, snapshot: Any, wait: bool = True) -> HostSnapshot:
        """A `save_slot` snapshot as host numpy arrays, for the host and disk tiers: views
        where it is in host memory already, one copy where it is on a device. With
        `wait=False` a backend may only queue that copy (inside a reply: no wait on the
        step in flight); the host reads the arrays after `settle_host_copies`. Engine
        thread only. The default reads the numpy backend's dict of per-layer lists."""
        parts = [p for p in (*STATE_PARTS, *KV_SCALE_PARTS) if p in snapshot]
        arrays = {f"{part}.{i}": a for part in parts for i, a in enumerate(snapshot[part])}
        return HostSnapshot(int(snapshot["length"]), arrays)

    def fused_prefill_attention(self, config: Any) -> bool:
        """Whether prefill attention runs fused for `config` here, writing no scores (the
        plan then gives the workspace none: engine.memory.workspace.score_rows_for)."""
        return False

    def settle_host_copies(self) -> None:  # noqa: B027 - host copies are done at once
        """Wait for the copies `snapshot_to_host(wait=False)` queued."""

    def ready_host_copy(  # noqa: B027 - nothing to pin
        self, restores: bool = False, moves: Sequence[Any] = ()
    ) -> None:
        """Prepare, off a reply's path, what a device snapshot's move to host memory inside
        a reply needs: `moves` are the snapshots the prompt cache would move next (the CUDA
        backend pins a buffer of each one's size, and one for a whole-context state); with
        `restores` (there is a disk tier), also what `host_buffer` hands a restore."""

    def host_buffer(self, nbytes: int) -> np.ndarray | None:
        """A writable uint8 host buffer of at least `nbytes` that a restore from disk reads
        a saved state into (`SnapshotStore.load`), from which `restore_slot` copies fastest
        (the CUDA backend's spare pinned buffer, readied by `ready_host_copy`), or None: the
        store allocates one. Lent: the caller hands it back (`return_host_buffer`) once
        `restore_slot` has copied the state out of it, and keeps no view of it."""
        return None

    def return_host_buffer(self, buffer: np.ndarray) -> None:  # noqa: B027 - none is lent
        """Take back a buffer `host_buffer` lent."""

    def save_slot_to_host(self, slot: int, length: int) -> HostSnapshot:
        """`snapshot_to_host(save_slot(slot, length))`, where the device tier has no room
        for the snapshot (a backend may copy straight to host memory)."""
        snapshot = self.save_slot(slot, length)
        host = self.snapshot_to_host(snapshot)
        self.free_snapshot(snapshot)
        return host

    @property
    def cheap_snapshots(self) -> bool:
        """Whether `save_slot` is cheap enough to run inside a request (a copy where the
        state lives); False where it costs a copy over PCIe into host memory, so the
        session saves only at a request's end, off the reply's path."""
        return True

    def snapshot_bytes(self, length: int) -> int | None:
        """Bytes `save_slot(slot, length)` will take, or None when unknown until taken."""
        return None

    def snapshot_nbytes(self, snapshot: Any) -> int:
        """Bytes a snapshot holds (the prompt cache's budget counts them)."""
        return _nested_nbytes(snapshot)

    def free_snapshot(self, snapshot: Any) -> None:  # noqa: B027 - host memory frees itself
        """Give a snapshot's memory back (the prompt cache evicted it)."""

    # ----- host transfer ------------------------------------------------------------------
    @abstractmethod
    def to_host(self, x: Any) -> np.ndarray:
        """Copy to a float32 (or int) numpy array."""

    @abstractmethod
    def prepare(self, batch: Batch, ids: np.ndarray) -> Any:
        """Upload the token ids and the batch layout; return the ids as a backend array."""

    # ----- ops ----------------------------------------------------------------------------
    @abstractmethod
    def embedding(self, table: Any, ids: Any) -> Any:
        """Rows of the embedding table: `[R, H]`."""

    @abstractmethod
    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any:
        """`x / sqrt(mean(x^2) + eps) * weight` over the last axis (weight already 1 + w)."""

    @abstractmethod
    def add_rms_norm(self, x: Any, delta: Any, weight: Any, eps: float) -> tuple[Any, Any]:
        """`h = x + delta`; return `(rms_norm(h), h)`."""

    @abstractmethod
    def linear(self, x: Any, weight: Any) -> Any:
        """`x @ W.T` for a dense or quantized `[out, in]` weight: `[R, out]`."""

    @abstractmethod
    def mlp(self, x: Any, gate: Any, up: Any, down: Any) -> Any:
        """SwiGLU: `down(silu(gate(x)) * up(x))`."""

    @abstractmethod
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
        """Gated full attention from the projections.

        qg `[R, Hq*2*hd]` (per head: query then gate), k and v `[R, Hkv*hd]`. Applies q/k norm,
        partial RoPE at each row's position, appends k and v to the slots' KV cache of
        full-attention layer number `layer` (0-based among full layers), attends causally
        with GQA, multiplies by sigmoid(gate). Returns `[R, Hq*hd]`. `ahead`: the weights
        read next (o_proj, the MLP's gate and up), which a backend may start bringing toward
        its cache meanwhile.
        """

    @abstractmethod
    def gated_delta(
        self, layer: int, mixed: Any, z: Any, b: Any, a: Any, weights: dict, batch: Batch
    ) -> Any:
        """Gated DeltaNet mixer from the projections.

        mixed `[R, C]`, z `[R, VD]`, b and a `[R, Hv]`; `weights` holds conv1d `[C, K]`,
        A_log, dt_bias, norm. Runs the causal conv with the slot's conv state, SiLU, l2-norm
        of q and k, the gated delta recurrence on the fp32 state of DeltaNet layer number
        `layer` (0-based among linear layers) and the gated RMSNorm. Returns `[R, VD]`.
        """

    @abstractmethod
    def take_rows(self, x: Any, rows: np.ndarray) -> Any:
        """`x[rows]` (rows given on the host)."""

    def linear_many(self, x: Any, weights: list[Any]) -> list[Any]:
        """`[linear(x, w) for w in weights]`; a backend may run them as one product."""
        return [self.linear(x, w) for w in weights]

    # ----- composite steps (a backend may fuse each into fewer kernels) -------------------
    def norm_linear_many(
        self, x: Any, delta: Any, weight: Any, eps: float, weights: list[Any]
    ) -> tuple[list[Any], Any]:
        """`h = x + delta` (`x` itself when delta is None), `u = rms_norm(h) * weight`;
        return `(linear_many(u, weights), h)`."""
        if delta is None:
            u, h = self.rms_norm(x, weight, eps), x
        else:
            u, h = self.add_rms_norm(x, delta, weight, eps)
        return self.linear_many(u, weights), h

    def norm_mlp(
        self, x: Any, delta: Any, weight: Any, eps: float, gate: Any, up: Any, down: Any
    ) -> tuple[Any, Any]:
        """`h = x + delta`; return `(mlp(rms_norm(h) * weight), h)`."""
        u, h = self.add_rms_norm(x, delta, weight, eps)
        return self.mlp(u, gate, up, down), h

    def gated_delta_out(
        self,
        layer: int,
        mixed: Any,
        z: Any,
        b: Any,
        a: Any,
        weights: dict,
        out_proj: Any,
        batch: Batch,
        ahead: tuple = (),
    ) -> Any:
        """`linear(gated_delta(...), out_proj)`: the DeltaNet mixer and its output projection.
        `ahead`: the weights read after out_proj (the MLP's gate and up), which a backend may
        start bringing toward its cache while the mixer leaves memory idle."""
        return self.linear(self.gated_delta(layer, mixed, z, b, a, weights, batch), out_proj)

    # ----- lifetime and decode -------------------------------------------------------------
    def finish_compiling(self, report: Callable[[int, int], None]) -> None:  # noqa: B027
        """Wait for the kernels compiling since `load_weights` (`report(done, total)` as
        they land); nothing to wait for here."""

    def warm_up(self, model: Any, eager: bool) -> None:  # noqa: B027 - nothing to warm
        """Compile what a request will use; with `eager`, allocate the scratch whole and
        capture the decode graphs now (invariant 4)."""

    def decode_step(self, model: Any, batch: Batch, ids: np.ndarray) -> tuple[Any, Any]:
        """One decode row per stream: (logits `[B, V]`, greedy tokens `[B]` on the backend,
        or None when the backend does not pick them)."""
        return model.forward(batch, ids), None

    def head_forward(
        self,
        head: Any,
        batch: Batch,
        ids: np.ndarray,
        hidden: Any,
        logits_rows: Any,
        fill: Any = None,
    ) -> Any:
        """The MTP head's forward (`engine.models.mtp.MtpHead.forward`, same arguments).
        `fill`: token ids on the backend (`id_buffer`) that replace the last ids."""
        return head.forward(batch, self.filled(ids, fill), hidden, logits_rows)

    def verify_forward(self, model: Any, batch: Batch, ids: np.ndarray) -> tuple[Any, Any]:
        """A drafting verify (`Batch.verify`): (every row's logits `[R, V]`, every row's
        final hidden state `[R, H]`, also left in `model.hidden`)."""
        logits = model.forward(batch, ids, all_logits=True, hidden=True)
        return logits, model.hidden

    def verify_follow(self, model: Any, head: Any, batch: Batch, ids: np.ndarray, fill: Any) -> Any:
        """A greedy drafting round's verify and the MTP head after it, without waiting:
        the verify of `batch` (`ids`, the last of them replaced by `fill` as in
        `head_forward`), each row's pick, then the head over the same positions with those
        picks as its next tokens, and its pick at the last row that greedy acceptance keeps
        (`speculative.accept_greedy`: the next round's first draft). Returns int32 `[3, R]`
        on the backend: the verify's ids, its picks, and that pick first in the last row
        (zeros after it). The head's final hidden states are left in `head.hidden`."""
        ids = self.filled(ids, fill)
        logits, hidden = self.verify_forward(model, batch, ids)
        picks = np.asarray(self.argmax_rows(logits), np.int32)
        (seg,) = batch.segments
        kept = speculative.kept_greedy(ids[1:], picks)
        window = Batch.window(seg.slot, seg.start, seg.rows)
        drafted = head.forward(window, picks, hidden, np.array([kept]))
        follow = np.zeros(seg.rows, np.int32)
        follow[0] = self.argmax_rows(drafted)[0]
        return np.stack([ids, picks, follow])

    def id_buffer(self, n: int) -> Any:
        """`n` token ids on the backend (int32), for picks that feed later forwards."""
        return np.zeros(n, np.int32)

    def pick_into(self, logits: Any, out: Any) -> None:
        """Each row's argmax over the real vocabulary into `out` (`id_buffer`), no wait."""
        out[...] = self.argmax_rows(logits)

    def filled(self, ids: np.ndarray, fill: Any) -> np.ndarray:
        """`ids` with its last len(fill) entries taken from `fill` (on the backend), on the
        host (this waits for `fill`)."""
        ids = np.array(ids, np.int32)
        if fill is not None and len(fill):
            ids[len(ids) - len(fill) :] = np.asarray(self.to_host(fill), np.int32)
        return ids

    @property
    def launches_steps(self) -> bool:
        """Whether `launch_step` can run a reply's steps without the host waiting for each
        token (the next step fed by the last one's picks on the backend)."""
        return False

    def launch_step(self, batch: Batch | None, ids: Any, rows: list) -> PendingStep:
        """Launch a decode step and return at once (batch None: the step after the last
        one launched, fed by its picks). Only where `launches_steps`."""
        raise NotImplementedError(f"the {self.name} backend does not launch steps ahead")

    @property
    def samples_on_device(self) -> bool:
        """Whether `sample_rows` draws tokens where the logits are (4 bytes a row back)."""
        return False

    def sample_rows(self, logits: Any, greedy: Any, rows: list) -> Any:
        """Each decode row's next token: rows[i] None takes greedy[i], else the
        `engine.sampling.Draw` draws from logits[i]. Only where `samples_on_device`."""
        raise NotImplementedError(f"the {self.name} backend does not sample on its own")

    # ----- drafting with the MTP head (engine/drafting.py) ---------------------------------
    # Set by the session before `load_weights`: the most tokens a step drafts (0: none).
    # Then `load_weights` loads the `mtp.*` tensors too, and `alloc_state` gives each slot
    # one more KV layer (index len(config.full_layers): the MTP head's own attention, saved
    # with the slot) and room for the DeltaNet states of a verify's rows (`Segment.keep`).
    draft_tokens: int = 0

    def concat_cols(self, a: Any, b: Any) -> Any:
        """`[a | b]`: `[R, Na + Nb]` from `[R, Na]` and `[R, Nb]`."""
        return np.concatenate([a, b], axis=1)

    def concat_rows(self, a: Any, b: Any) -> Any:
        """`a` above `b`: `[Ra + Rb, N]`."""
        return np.concatenate([a, b], axis=0)

    def hold_rows(self, x: Any, rows: np.ndarray) -> Any:
        """A copy of `x[rows]` that outlives the forward it came from."""
        return np.array(x[rows])

    def argmax_rows(self, logits: Any) -> np.ndarray:
        """Each row's argmax over the real vocabulary (`vocab_rows`), on the host `[R]`."""
        host = np.asarray(self.to_host(logits))
        return np.argmax(host[:, : self.vocab_rows or host.shape[1]], axis=1)

    def rewind(self, slot: int, rows: int) -> None:
        """After a forward whose segment for `slot` kept its rows (`Segment.keep`): make the
        slot's DeltaNet state (conv and recurrent) the one after its first `rows` rows. KV
        entries past them stay: attention never reads past a row's own position, and the
        next forward overwrites them."""
        raise NotImplementedError(f"the {self.name} backend does not keep verify rows")

    def release(self) -> None:  # noqa: B027 - host memory frees itself
        """Free weights, state and buffers (unload); the backend is not used afterwards."""

    # ----- scratch regions (optional) -----------------------------------------------------
    def begin_layer(self, index: int) -> None:  # noqa: B027 - optional hook
        """Layer `index` starts; it reads only the previous layer's (x, delta). A backend that
        carves buffers from a fixed scratch reuses the region of layer index - 2 here."""

    def begin_head(self) -> None:  # noqa: B027 - optional hook
        """The layers are done; what follows is the final row gather and the LM head."""


def _nested_nbytes(obj: Any) -> int:
    """Bytes held by the arrays in a (nested) snapshot of dicts, lists and arrays."""
    if isinstance(obj, dict):
        return sum(_nested_nbytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(_nested_nbytes(v) for v in obj)
    return int(getattr(obj, "nbytes", 0))
