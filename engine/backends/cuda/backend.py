"""`CudaBackend`: the Qwen3.5 ops on an NVIDIA GPU through CuPy and `kernels/*.cu`.

Activations are bf16 (default), fp16 or fp32 (`dtype`; fp32 is the exactness mode) with
fp32 accumulation everywhere; the DeltaNet recurrent state is fp32; KV cache and conv state
are in the activation type. All work runs on one non-default stream, so a decode step can
be captured into a CUDA graph (graphs.py); code that switches streams for a while does it
with `launch.on_stream`, which makes the previous stream current again afterwards.
Importing this module starts nothing.

The backend composes one object per concern and implements the `Backend` contract with them:

    kernels      launch.Kernels        compiles and launches every kernel of the dtype
    frame        frame.Frame           a forward's row layout (meta), scratch and workspace
    state        state.StreamState     KV cache, conv and recurrent state, snapshots
    norms        norms.Norms           norms, embedding rows, conversions
    projections  projections.Projections  x @ W.T: decode GEMVs, their tuner, cuBLAS
    attn         attention.Attention   full attention, decode and prefill
    deltanet     deltanet.DeltaNet     the Gated DeltaNet mixer
    sampling     sampling.Sampling     greedy picks and draws on the device
    graphs       graphs.DecodeGraphs   the captured decode steps (made at warm-up)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.backends.base import Backend, Batch
from engine.backends.cuda import catalog, nvrtc, prebuild, support
from engine.backends.cuda.attention import Attention, prefill_kernel
from engine.backends.cuda.deltanet import DeltaNet
from engine.backends.cuda.frame import Frame
from engine.backends.cuda.host_table import host_table
from engine.backends.cuda.launch import Kernels, card, simulate
from engine.backends.cuda.modules import use_cache_dir
from engine.backends.cuda.norms import Norms
from engine.backends.cuda.prebuild import Prebuild
from engine.backends.cuda.projections import Projections
from engine.backends.cuda.sampling import Sampling
from engine.backends.cuda.state import StreamState
from engine.backends.cuda.tuning import Tuning
from engine.backends.cuda.verify_rows import DeviceVerifyRows
from engine.backends.cuda.weights import upload
from engine.config import EngineSettings, parse_device_props
from engine.errors import DeviceOutOfMemory
from engine.memory.plan import verify_step_rows
from engine.memory.pool import is_out_of_memory
from engine.memory.workspace import ATTN_QUERY_ROWS
from engine.model_config import ModelConfig
from engine.snapshot_store import HostSnapshot

if TYPE_CHECKING:
    from engine.backends.cuda.graphs import DecodeGraphs
    from engine.memory import Decision, DevicePool


class CudaBackend(Backend):
    name = "cuda"

    def __init__(
        self,
        settings: EngineSettings | None = None,
        dtype: str = "bfloat16",
        max_rows: int = 512,
        pool: DevicePool | None = None,
        tuning: Tuning | None = None,
    ) -> None:
        import cupy

        from engine.memory import CupyPool

        super().__init__(settings)
        # A card, dtype or NVRTC the kernels do not cover is refused by name, before the
        # stream, the pool or any compile.
        simulate(parse_device_props(self.settings.device_props))  # "": the GPU's own
        self.card = card()
        version, archs = nvrtc.loaded_version(), nvrtc.supported_archs()
        support.check_card(self.card.capability, dtype, version, archs)
        use_cache_dir(self.settings.cache_dir)
        self.kernels = Kernels(dtype, overlap=self.settings.overlap_launches)
        self.tuning = tuning or Tuning()
        self.dtype = dtype
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.stream.use()
        # Every long-lived block (weights, state, scratch, workspace, saved prompts) comes
        # from this pool, which enforces the memory limit and reports what Snug holds.
        self.pool = pool or CupyPool(limit=self.settings.limit_bytes)
        self.graphs: DecodeGraphs | None = None  # torn down before buffers move
        self.model: Any = None  # the forward the decode graphs capture (set at warm-up)
        self.config: ModelConfig | None = None
        self.arena: Any = None
        self.max_rows = max_rows
        # What admission decided (`configure`): embeddings in host memory (invariant 7), and
        # prefill attention's query rows.
        self.host_embeddings = False
        self.score_rows = ATTN_QUERY_ROWS
        self.snapshot_room: int | None = None  # the plan's bytes for saved states on the card
        k, t = self.kernels, self.tuning
        self.frame = Frame(k.act_dtype, self._teardown_graphs)
        self.state = StreamState(k, self.pool, self.stream)
        self.state.kv_int8 = self.settings.kv_cache == "int8"  # the 8-bit KV cache
        self.norms = Norms(k, self.frame)
        self.projections = Projections(k, self.frame, self.norms)
        self.attn = Attention(k, self.frame, self.state, t)
        # Batch-invariant decode: each row summed as it is at one row (projections.py's gemv,
        # attention.decode_kernel), whatever streams share the step.
        self.projections.invariant = self.attn.batch_invariant = self.settings.batch_invariant
        self.deltanet = DeltaNet(k, self.frame, self.state, self.projections, t)
        self.sampling = Sampling(k, self.frame, t)
        self.verify_rows = self.deltanet.verify_rows = DeviceVerifyRows(self.state)
        self.prebuild: Prebuild | None = None  # the model's kernels compiling (load_weights)

    # ----- what admission decided ---------------------------------------------------------
    @property
    def act_itemsize(self) -> int:
        return self.kernels.act_itemsize

    def configure(self, decision: Decision | None, vocab_rows: int) -> None:
        """Rows per forward, where the embedding table lives and prefill attention's query
        rows from `decision` (None: the constructor's max_rows, the table on the card, the
        default query rows); `vocab_rows` bounds every pick (the rest is padding)."""
        super().configure(decision, vocab_rows)
        if decision is None:
            self.host_embeddings, self.score_rows = False, ATTN_QUERY_ROWS
            self.snapshot_room = None
            return
        self.max_rows = decision.max_rows
        self.host_embeddings = decision.host_embeddings
        self.score_rows = decision.score_rows
        self.state.snapshots_on_host = decision.prompt_cache_on_host
        self.snapshot_room = decision.breakdown.prompt_cache

    def held_bytes(self) -> int:
        """Bytes Snug holds on the card: the pool's blocks plus the small step buffers."""
        small = 0
        if self.frame.meta is not None:
            small = self.frame.nbytes + self.sampling.nbytes
        return self.pool.held_bytes + small

    def _teardown_graphs(self) -> None:
        if self.graphs is not None:
            self.graphs.teardown()

    # ----- weights and state --------------------------------------------------------------
    def load_weights(self, checkpoint: Any, config: ModelConfig) -> dict[str, Any]:
        import cupy

        from engine.memory.arena import checkpoint_specs

        support.check_model(config, self.card.capability, self.dtype)  # before the upload
        specs = checkpoint_specs(checkpoint)
        kv = self.settings.kv_cache
        args = (config, specs, self.dtype, self.card, self.tuning, kv)
        self.kernels.catalog = catalog.requests(catalog.modules(*args))
        # The programs this load will meet compile on worker threads while the weights
        # upload (prebuild.py); anything else compiles when asked for.
        meets = catalog.modules(*args, invariant=self.projections.invariant)
        jobs = prebuild.jobs(meets, self.projections.gemv4_compile_defines, catalog.extern_kernels)
        device = cupy.cuda.Device().id
        self.prebuild = Prebuild(jobs, self.dtype, device, prebuild.threads()).start()
        self.stream.use()
        self.config = config
        self.vocab_rows = self.vocab_rows or config.vocab_size
        skip = ("embed_tokens",) if self.host_embeddings else ()
        if skip and config.tie_word_embeddings:
            raise ValueError("a tied embedding table is the LM head and must be on the card")
        try:
            mtp = self.draft_tokens > 0  # the MTP head drafts: its weights too
            args = (checkpoint, self.norms, self.projections, self.pool, skip, mtp)
            weights, self.arena = upload(*args)
        except cupy.cuda.memory.OutOfMemoryError as exc:
            raise DeviceOutOfMemory(
                f"{checkpoint.dir}: the weights do not fit on the GPU ({exc}); choose a smaller "
                "model or a 4-bit checkpoint"
            ) from exc
        if skip:  # mapped pinned host memory, read in place by the gather (invariant 7)
            self.state.host_table = host_table(checkpoint, "embed_tokens", self.dtype)
            weights["embed_tokens"] = self.state.host_table
        return weights

    @property
    def cheap_snapshots(self) -> bool:
        """Saved states in pinned host memory cost a copy over PCIe (and a pinned
        allocation): the session takes those only at a request's end."""
        return not self.state.snapshots_on_host

    def check_model(self, config: ModelConfig) -> None:
        """UnsupportedModel, naming the config key, where the kernels do not cover it."""
        support.check_model(config, self.card.capability, self.dtype)

    def alloc_state(self, config: ModelConfig, slots: int, context: int) -> None:
        """The state block, `meta`, the sampling buffers, and the scratch and workspace (to
        be allocated when first ensured); a second call replaces everything sized by it."""
        support.check_model(config, self.card.capability, self.dtype)
        self.stream.use()
        self._teardown_graphs()
        self.config = config
        self.vocab_rows = self.vocab_rows or config.vocab_size
        self.state.free()  # what the old shape held goes first, then the new state
        self.frame.release_blocks()
        if self.graphs is not None:
            self.graphs.lost.clear()  # the old shape's: warm-up captures for the new one
        self.verify_rows.free()
        self.state.mtp_layers = 1 if self.draft_tokens else 0  # the MTP head's KV layer
        self.state.alloc(config, slots, context)
        if self.draft_tokens:
            self.verify_rows.alloc(config, slots, self.draft_tokens)
        rows = max(self.max_rows, 64)
        try:  # small buffers from CuPy's own pool, outside the plan's blocks
            self.frame.alloc_meta(rows)
            self.sampling.alloc(rows, slots, config.vocab_size)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            raise DeviceOutOfMemory(
                f"no memory for the decode step's buffers ({rows} rows, {slots} streams: the "
                f"batch layout and the sampling buffers) ({exc}); lower the number of streams "
                "or raise the memory reserve (SNUG_MEMORY_RESERVE_GIB)"
            ) from exc
        isz, mr = self.act_itemsize, self.max_rows
        kv, score_rows = self.settings.kv_cache, self.score_rows
        step_rows = verify_step_rows(slots, self.draft_tokens)  # as the plan counts them
        self.frame.alloc_blocks(self.pool, config, isz, mr, step_rows, context, score_rows, kv)

    def reset_slot(self, slot: int) -> None:
        self.state.reset_slot(slot)

    def save_slot(self, slot: int, length: int) -> Any:
        return self.state.save_slot(slot, length)

    def restore_slot(self, slot: int, snapshot: Any) -> None:
        self.state.restore_slot(slot, snapshot)

    def snapshot_bytes(self, length: int) -> int:
        return self.state.snapshot_bytes(length)

    def snapshot_nbytes(self, snapshot: Any) -> int:
        return self.state.snapshot_nbytes(snapshot)

    def free_snapshot(self, snapshot: Any) -> None:
        self.state.free_snapshot(snapshot)

    def snapshot_to_host(self, snapshot: Any, wait: bool = True) -> HostSnapshot:
        return self.state.snapshot_to_host(snapshot, wait)

    def fused_prefill_attention(self, config: ModelConfig) -> bool:
        card = self.card
        return bool(
            prefill_kernel(config.head_dim, self.dtype, card.capability, card.smem_per_block)[0]
        )

    def settle_host_copies(self) -> None:
        self.state.settle()

    def ready_host_copy(self, restores: bool = False, moves: Sequence[Any] = ()) -> None:
        if restores or not self.state.snapshots_on_host:
            self.state.keep_spare()
        self.state.keep_ready(moves)

    def host_buffer(self, nbytes: int) -> np.ndarray | None:
        return self.state.give_spare(nbytes)

    def return_host_buffer(self, buffer: np.ndarray) -> None:
        self.state.take_back_spare(buffer)

    def save_slot_to_host(self, slot: int, length: int) -> HostSnapshot:
        return self.state.save_slot_to_host(slot, length)

    @property
    def precision(self) -> str:
        return f"cuda:{self.dtype}{self.kv_tag}"

    # ----- host transfer ------------------------------------------------------------------
    def to_host(self, x: Any) -> np.ndarray:
        import cupy

        if x.dtype == self.kernels.act_dtype and self.dtype != "float32":
            out = cupy.empty(x.shape, cupy.float32)
            self.norms.to_f32(x, out)
            x = out
        return cupy.asnumpy(x, stream=self.stream, blocking=True)

    def write_batch(self, batch: Batch, ids: np.ndarray) -> None:
        """Copy token ids and the batch layout to the device (asynchronously)."""
        self.frame.write(batch, ids, self.state.context, self.stream)

    def prepare(self, batch: Batch, ids: np.ndarray) -> Any:
        self.stream.use()
        if not self.frame.capturing:  # first: a grow captures the decode graphs again, and
            self.grow_for(batch)  # each capture prepares a step of its own
        self.projections.step = batch.is_step  # batch-invariant steps stay on the GEMVs
        if not self.frame.capturing:
            self.write_batch(batch, np.asarray(ids, np.int32))
            self.frame.workspace.reset("ws")
        self.frame.scratch.reset("r1")  # the embedding output is layer -1's
        return self.frame.meta[0, : batch.rows]

    def begin_layer(self, index: int) -> None:
        self.frame.scratch.begin(f"r{index % 2}")

    def begin_head(self) -> None:
        self.frame.scratch.begin("head")

    # ----- ops ----------------------------------------------------------------------------
    def grow_for(self, batch: Batch) -> None:
        """Lazy growth, before any kernel of this forward. A grow tears the decode graphs
        down (invariant 5); they are captured again here, before the forward that grew runs,
        so the decode steps after it replay them. Steps never grow the scratch after
        warm-up: on the lazy path a grow happens at a prompt's chunk, not at a step."""
        try:
            self.frame.ensure(batch)
        finally:  # a grow that failed part way may have torn the graphs down too
            if self.graphs is not None and self.graphs.lost:
                self.graphs.restore()

    def embedding(self, table: Any, ids: Any) -> Any:
        """The rows of `ids`, gathered on the device from the table on the card or in
        mapped host memory (a step in a captured graph reads its ids from `meta`)."""
        R = ids.shape[0]
        out = self.frame.take((R, table.shape[1]))
        self.norms.embed_into(table, ids, out)
        return out

    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any:
        return self.norms.rms_norm(x, weight, eps)

    def add_rms_norm(self, x: Any, delta: Any, weight: Any, eps: float) -> tuple[Any, Any]:
        return self.norms.add_rms_norm(x, delta, weight, eps)

    def linear(self, x: Any, weight: Any) -> Any:
        return self.projections.linear(x, weight)

    def linear_many(self, x: Any, weights: list[Any]) -> list[Any]:
        return self.projections.linear_many(x, weights)

    def norm_linear_many(
        self, x: Any, delta: Any, weight: Any, eps: float, weights: list[Any]
    ) -> tuple[list[Any], Any]:
        """Add, norm and projection in one launch where it applies, else one by one."""
        fused = self.projections.norm_linear_many(x, delta, weight, eps, weights)
        return super().norm_linear_many(x, delta, weight, eps, weights) if fused is None else fused

    def norm_mlp(
        self, x: Any, delta: Any, weight: Any, eps: float, gate: Any, up: Any, down: Any
    ) -> tuple[Any, Any]:
        fused = self.projections.norm_mlp(x, delta, weight, eps, gate, up, down)
        if fused is None:
            return super().norm_mlp(x, delta, weight, eps, gate, up, down)
        return fused

    def mlp(self, x: Any, gate: Any, up: Any, down: Any) -> Any:
        return self.projections.mlp(x, gate, up, down)

    def take_rows(self, x: Any, rows: np.ndarray) -> Any:
        return self.norms.take_rows(x, rows)

    # ----- drafting (engine/drafting.py): small copies from CuPy's pool, off the plan -----
    def concat_cols(self, a: Any, b: Any) -> Any:
        """[a | b] in the forward's scratch (the MTP head's input, read at once: a captured
        head allocates nothing)."""
        out = self.frame.take((a.shape[0], a.shape[1] + b.shape[1]), a.dtype)
        out[:, : a.shape[1]] = a
        out[:, a.shape[1] :] = b
        return out

    def concat_rows(self, a: Any, b: Any) -> Any:
        import cupy

        return cupy.concatenate([a, b], axis=0)

    def hold_rows(self, x: Any, rows: np.ndarray) -> Any:
        import cupy

        return cupy.take(x, cupy.asarray(rows, cupy.int64), axis=0)

    def argmax_rows(self, logits: Any) -> np.ndarray:
        return self.sample_greedy(logits).get()

    def rewind(self, slot: int, rows: int) -> None:
        self.verify_rows.rewind(slot, rows)

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
        return self.attn.forward(layer, qg, k, v, q_norm, k_norm, batch, ahead)

    def gated_delta(
        self, layer: int, mixed: Any, z: Any, b: Any, a: Any, weights: dict, batch: Batch
    ) -> Any:
        return self.deltanet.gated_delta(layer, mixed, z, b, a, weights, batch)

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
        """The gated output norm inside out_proj's launch where it applies, else apart."""
        args = (layer, mixed, z, b, a, weights, out_proj, batch)
        out = self.deltanet.gated_delta_out(*args, ahead)
        return super().gated_delta_out(*args) if out is None else out

    # ----- lifetime and decode ------------------------------------------------------------
    def finish_compiling(self, report: Callable[[int, int], None]) -> None:
        if self.prebuild is not None:
            self.prebuild.wait(report)

    def warm_up(self, model: Any, eager: bool) -> None:
        """Compile every kernel a request will use, capture the decode graph of every batch
        size up to the stream count and re-choose the one-row step's projections by the
        step's own time (`DecodeGraphs.tune`, where a step is short). When the whole scratch
        fits (`eager`), scratch and workspace are first allocated at max rows, so no request
        pays for an allocation or a capture (invariant 4). Lazy, they hold warm-up's rows
        (a step's always fit), and a prompt's chunk that grows them captures the graphs
        again (`grow_for`), so decode steps still replay graphs with the tuned choices.
        Then the rest of what a first request meets (warmup.warm_requests: the prompt's
        window sizes and long keys, every draw of the device sampler, launched steps, a
        saved state), so it compiles, tunes and creates nothing either. Runs on the slots
        before any stream is live and leaves them zeroed."""
        from engine.backends.cuda.graphs import TUNE_BUDGET_S, TUNE_MAX_STEP_S
        from engine.backends.cuda.warmup import first_rows, warm_requests

        self.model = model
        graphs = self._decode_graphs()
        fr = self.frame
        if eager:
            fr.mem_scratch.ensure(fr.mem_scratch.max_rows)
            fr.mem_workspace.ensure(fr.mem_workspace.max_rows)
        rows = first_rows(self.max_rows, self.state.context, eager)
        w4 = self.projections.w4
        w4.timing = True  # each 4-bit matrix's prompt route, by its time here (w4_mma.py)
        try:
            model.forward(Batch.window(0, 0, rows), np.zeros(rows, np.int32))
        finally:
            w4.timing = False
        for batch_size in range(1, self.state.slots + 1):
            graphs.warm(batch_size)  # compiles and tunes the step kernels for this size
            graphs.capture(batch_size)
        step = tuple(graphs.keys.get(1, ()))
        tuner = self.projections.tuner
        if step not in tuner.step_tuned:
            chosen = dict(tuner.choice)
            graphs.tune(1, max_step_s=TUNE_MAX_STEP_S, budget_s=TUNE_BUDGET_S)
            tuner.step_tuned.add(step)  # later loads of these shapes keep the choices
            if self.projections.invariant and tuner.choice != chosen:
                # Batch-invariant: the other sizes sum each row in the one-row choices'
                # orders, which the tuning changed: their variants and graphs again.
                for batch_size in range(2, self.state.slots + 1):
                    graphs.warm(batch_size)
                    graphs.capture(batch_size)
        warm_requests(self, model, eager)  # the rest of a first request (warmup.py)
        for slot in range(self.state.slots):
            self.reset_slot(slot)
        self.stream.synchronize()

    def decode_step(self, model: Any, batch: Batch, ids: np.ndarray) -> tuple[Any, Any]:
        """One decode row per stream through the captured graph (captured at warm-up or
        after the last grow; on first use where neither did, of the model warm-up gave);
        returns (logits [B, V], greedy tokens [B] int32) on the device."""
        return self._decode_graphs(model).replay(batch, ids)

    def verify_forward(self, model: Any, batch: Batch, ids: np.ndarray) -> tuple[Any, Any]:
        """A drafting verify on its captured graph (`DecodeGraphs.verify`)."""
        return self._decode_graphs(model).verify(batch, ids)

    def head_forward(
        self,
        head: Any,
        batch: Batch,
        ids: np.ndarray,
        hidden: Any,
        logits_rows: Any,
        fill: Any = None,
    ) -> Any:
        """The MTP head's draft-sized forwards on captured graphs (`DecodeGraphs.head`)."""
        return self._decode_graphs().head(head, batch, ids, hidden, logits_rows, fill)

    def verify_follow(self, model: Any, head: Any, batch: Batch, ids: np.ndarray, fill: Any) -> Any:
        """The verify and the head after it as one captured graph (`DecodeGraphs.follow`)."""
        return self._decode_graphs(model).follow(head, batch, ids, fill)

    def id_buffer(self, n: int) -> Any:
        import cupy

        self.stream.use()  # the forwards that read and write it run on this stream
        return cupy.zeros(n, cupy.int32)

    def pick_into(self, logits: Any, out: Any) -> None:
        self.sample_greedy(logits, out)

    @property
    def launches_steps(self) -> bool:
        """A step takes its input ids from the previous step's picks on the device: the
        gather reads the embedding table where it lives, on the card or in mapped host
        memory (invariant 7), so no step waits for the host to know its id."""
        return True

    def launch_step(self, batch: Batch | None, ids: Any, rows: list) -> Any:
        """A decode step that does not wait (`DecodeGraphs.launch`; batch None: the step
        after the last one, fed by its picks on the device)."""
        return self._decode_graphs().launch(batch, ids, rows)

    def _decode_graphs(self, model: Any = None) -> DecodeGraphs:
        """The DecodeGraphs, made on first use (it registers itself as self.graphs)."""
        from engine.backends.cuda.graphs import DecodeGraphs

        return self.graphs or DecodeGraphs(self, model if self.model is None else self.model)

    @contextmanager
    def capture_mode(self, splits: int | None) -> Iterator[None]:
        """While a decode graph is captured: no batch is written and nothing grows, the
        scratch refuses to spill, launches overlap where they can, the projections' choice
        keys are recorded in order, and the attention grid is capped at `splits`."""
        fr, k = self.frame, self.kernels
        fr.capturing = fr.scratch.capturing = k.graphing = True
        self.projections.tuner.step_keys = []
        self.attn.step_splits = splits
        try:
            yield
        finally:
            fr.capturing = fr.scratch.capturing = k.graphing = False
            self.attn.step_splits = None

    def release(self) -> None:
        """Free graphs, scratch, workspace, state and weights (unload)."""
        if self.prebuild is not None:
            self.prebuild.cancel()
        self._teardown_graphs()
        self.graphs = None
        self.frame.release_blocks()
        self.frame.detach()
        self.state.free()
        self.verify_rows.free()
        if self.arena is not None and self.arena.alloc is not None:
            self.arena.alloc.free()
        self.arena = None
        self.stream.synchronize()
        self.state.host_table = None  # no kernel reads it any more

    # ----- sampling on the device ---------------------------------------------------------
    @property
    def samples_on_device(self) -> bool:
        return True

    def sample_greedy(self, logits: Any, out: Any = None) -> Any:
        """argmax over the real vocabulary of each row, int32 on the device."""
        return self.sampling.greedy(logits, self.vocab_rows, out)

    def sample_rows(self, logits: Any, greedy: Any, rows: list, *, in_place: bool = False) -> Any:
        """Each decode row's next token on the device (`Sampling.rows`); `in_place`: the
        draws overwrite their rows of `greedy`, which is returned (a launched step's picks)."""
        return self.sampling.rows(logits, greedy, rows, self.vocab_rows, in_place)

    def sample(
        self, logits: Any, temperature: float, top_k: int, top_p: float, seed: int, out: Any = None
    ) -> Any:
        """top-k (at most 1024; 0 means 1024) then top-p sampling at `temperature`."""
        return self.sampling.sample(logits, self.vocab_rows, temperature, top_k, top_p, seed, out)
