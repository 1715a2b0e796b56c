"""Admission: does a plan fit on this card, how, and what to change when it does not.

One rule for room, with or without a limit (invariant 1):

    available = min(card_free, limit - held)        (just card_free with no limit)
    room      = available - reserve - scratch - workspace   (counted as they will be held)

The weights, the stream states and the prompt cache are then taken from room, so they can
never be given bytes the scratch or workspace will need later. An eager scratch/workspace
(allocated whole at warm-up) counts at its size at max_rows; a lazy one (empty, grown on
demand) counts at its growth peak, old and new block together.

Among the arrangements that fit, the first in this order wins: memory goes where speed
comes from (invariant 8). Large prefill chunks come before optional memory, so the saved
prompt states move to pinned host memory (restored over PCIe) before the chunks shrink:

    rows                      where the saved states live   the embedding table
    max rows, eager           card                          card
                              host                          card
                              host                          host (untied tables only)
    each rung >= 256, lazy    the same three
    each rung < 256, lazy     the same three

The verdict names the arrangement: fits (eager, everything on the card), fits with host
embeddings, fits with lazy scratch, or does not fit (with suggestions whose numbers were each
checked to fit). `largest_context` keeps chunks of at least 256 rows when any context does,
so a card short of memory gets a shorter context before it gets smaller chunks.

`admit` returns a Decision; it never raises for "does not fit". `decide` is the one
admission route: the load panel's preview, `snug plan` and `Engine.load` all call it, with
the tensor specs of a checkpoint's headers or of a catalog shape, so they reach the same
Decision from the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from engine.config import GIB, EngineSettings
from engine.memory.arena import TensorSpec, act_itemsize, arena_bytes
from engine.memory.decision import Breakdown, Decision, Verdict, streams_text, tokens_text
from engine.memory.draft import draft_choice
from engine.memory.growth import ladder_below
from engine.memory.plan import Plan, WeightBytes, make_plan
from engine.memory.shapes import shape_tensor_specs
from engine.memory.speed import CardSpeed, predict
from engine.memory.wording import can_give, context_cap_text, gib_text, reserve_takes_all
from engine.memory.workspace import FAST_QUERY_ROWS, score_rows_for
from engine.model_config import ModelConfig, QuantConfig, QuantSpec

CONTEXT_STEP = 256
FAST_ROWS = 256  # prefill chunks at least this large keep the prompt's speed (invariant 8)
BASE_ROWS = 512  # the prefill chunk a plan is admitted with when the caller names none
# Chunks a plan widens to when memory is left over (max rows not named): each window pays
# the 4-bit weights' dequantization and its launches once, so an 8K prompt on the H200 took
# 0.337 s in 512-row windows and 0.195 s in 2048-row ones (docs/benchmarks.md).
WIDE_ROWS = (2048, 1024)
SMALLEST_CONTEXT = 256  # what `decide` plans with before it searches for the largest context
_RESERVE_STEP = GIB // 20  # suggestions round the reserve down to 0.05 GiB
_MLX4 = QuantConfig(QuantSpec(bits=4, group_size=64))


@dataclass(frozen=True)
class _Try:
    plan: Plan
    eager: bool
    host_embeddings: bool
    breakdown: Breakdown
    cache_on_host: bool = False

    @property
    def fits(self) -> bool:
        return self.breakdown.free_after >= 0


def available_bytes(card_free: int, held: int, settings: EngineSettings) -> int:
    """What the engine may still take before the reserve: the card's free bytes, or the limit
    minus what the engine already holds, whichever is smaller."""
    if settings.limit_bytes is None:
        return card_free
    return min(card_free, settings.limit_bytes - held)


def _evaluate(
    plan: Plan,
    card_free: int,
    card_total: int,
    held: int,
    settings: EngineSettings,
    eager: bool,
    host_embeddings: bool,
    cache_on_host: bool = False,
) -> _Try:
    w = plan.weights
    on_card = w.required_on_card + (0 if host_embeddings else w.movable_to_host)
    scratch = plan.scratch_bytes if eager else plan.scratch_peak_bytes
    work = plan.workspace_bytes if eager else plan.workspace_peak_bytes
    cache = 0 if cache_on_host else plan.prompt_cache_bytes
    room = available_bytes(card_free, held, settings) - settings.reserve_bytes - scratch - work
    free_after = room - on_card - plan.stream_state_total - cache
    b = Breakdown(
        weights=on_card,
        embeddings_on_host=w.movable_to_host if host_embeddings else 0,
        stream_state_each=plan.state.total,
        streams=plan.streams,
        stream_state_total=plan.stream_state_total,
        prompt_cache=cache,
        prompt_cache_on_host=plan.prompt_cache_bytes if cache_on_host else 0,
        scratch_peak=scratch,
        workspace_peak=work,
        reserve=settings.reserve_bytes,
        free_after=free_after,
        card_total=card_total,
        card_free=card_free,
        limit=settings.limit_bytes,
        held=held,
    )
    return _Try(plan, eager, host_embeddings, b, cache_on_host)


def _placements(plan: Plan) -> list[tuple[bool, bool]]:
    """(saved states on the host, embedding table on the host), fastest first."""
    out = [(False, False)]
    if plan.prompt_cache_bytes:
        out.append((True, False))
    if plan.weights.movable_to_host:
        out.append((bool(plan.prompt_cache_bytes), True))
    return out


def _best(
    plan: Plan,
    card_free: int,
    card_total: int,
    held: int,
    settings: EngineSettings,
    min_rows: int = 1,
) -> _Try:
    """The first arrangement that fits, in the module docstring's order, with prefill chunks
    of at least `min_rows`; else the leanest one (which does not fit): the one missing the
    fewest bytes, so a shortfall names what the card truly lacks (the first of equals)."""
    args = (card_free, card_total, held, settings)
    if 0 < plan.score_rows < FAST_QUERY_ROWS:
        # A card with room gets a workspace that holds prefill attention scores for many
        # query rows, so long prompts run in fewer, larger passes.
        fast = _evaluate(plan.resized(score_rows=FAST_QUERY_ROWS), *args, True, False)
        if fast.fits:
            return fast
    floor = max(plan.streams, 1, min(min_rows, plan.max_rows))
    rungs = [r for r in ladder_below(plan.max_rows) if r >= floor]
    leanest: _Try | None = None
    for rows in [plan.max_rows, *reversed(rungs)]:
        eager = rows == plan.max_rows
        sized = plan if eager else plan.resized(max_rows=rows)
        for cache_on_host, host_embeddings in _placements(plan):
            attempt = _evaluate(sized, *args, eager, host_embeddings, cache_on_host)
            if attempt.fits:
                return attempt
            if leanest is None or attempt.breakdown.free_after > leanest.breakdown.free_after:
                leanest = attempt
    assert leanest is not None  # max rows, on the card, is always tried
    return leanest


def _widen(best: _Try, card_free: int, card_total: int, held: int, s: EngineSettings) -> _Try:
    """The admitted arrangement with wider prefill chunks, where what is left over holds
    them whole; otherwise unchanged. Only memory nothing else was given is spent: the context,
    the streams and where each block lives stay as admitted (invariant 8)."""
    if not best.eager:
        return best
    for rows in WIDE_ROWS:
        if rows <= best.plan.max_rows:
            break
        wide = _evaluate(
            best.plan.resized(max_rows=rows), card_free, card_total, held, s, True,
            best.host_embeddings, best.cache_on_host,
        )  # fmt: skip
        if wide.fits:
            return wide
    return best


def _fits(
    plan: Plan, card_free: int, card_total: int, held: int, s: EngineSettings, min_rows: int = 1
) -> bool:
    return _best(plan, card_free, card_total, held, s, min_rows).fits


def largest_context(
    plan: Plan,
    card_free: int,
    card_total: int,
    held: int = 0,
    settings: EngineSettings | None = None,
    any_chunks: bool = False,
) -> int:
    """Largest context (a multiple of 256, at most max_position_embeddings) admitted for the
    plan's streams; 0 when not even 256 tokens fit. `any_chunks`: the largest with prefill
    chunks of any size, not the largest that keeps the fastest chunks any context keeps."""
    s = settings or EngineSettings()
    # A shorter context before smaller or lazy chunks (invariant 8): the whole scratch at
    # max rows where any context allows it, else chunks of at least FAST_ROWS.
    for min_rows in (1,) if any_chunks else (plan.max_rows, FAST_ROWS, 1):
        most = context_with_chunks(plan, card_free, card_total, held, s, min_rows)
        if most:
            return most
    return 0


def context_with_chunks(
    plan: Plan, card_free: int, card_total: int, held: int, s: EngineSettings, min_rows: int
) -> int:
    """Largest context (a multiple of 256, at most max_position_embeddings) admitted with
    prefill chunks of at least `min_rows` (or max rows, where smaller); 0 where none is."""
    args = (card_free, card_total, held, s)
    lo, hi = 0, plan.config.max_position_embeddings // CONTEXT_STEP
    while lo < hi:  # largest k with context k*256 fitting; fitting shrinks as context grows
        mid = (lo + hi + 1) // 2
        if _fits(plan.resized(context=mid * CONTEXT_STEP), *args, min_rows):
            lo = mid
        else:
            hi = mid - 1
    return lo * CONTEXT_STEP


def args_of(b: Breakdown, s: EngineSettings) -> tuple[int, int, int, EngineSettings]:
    """The card arguments a breakdown was made with."""
    return b.card_free, b.card_total, b.held, s


def _suggest(
    plan: Plan, card_free: int, card_total: int, held: int, s: EngineSettings
) -> tuple[tuple[str, ...], tuple[tuple[str | int | float, ...], ...]]:
    """Concrete changes that each make the plan fit on their own (each one was checked)."""
    args = (card_free, card_total, held, s)
    texts: list[str] = []
    fixes: list[tuple[str | int | float, ...]] = []
    ctx = largest_context(plan, *args)
    if ctx >= CONTEXT_STEP:
        texts.append(f"shorten the context to {ctx:,} tokens")
        fixes.append(("context", ctx))
    if plan.kv_cache != "int8" and plan.config.full_layers:
        small = plan.with_kv_cache("int8")
        if _fits(small, *args):
            saved = plan.stream_state_total - small.stream_state_total
            texts.append(f"use the 8-bit KV cache, int8 ({gib_text(saved)} less stream state)")
            fixes.append(("kv_cache", "int8"))
    if plan.streams > 1:
        fewer = _largest(1, plan.streams - 1, lambda n: _fits(plan.resized(streams=n), *args))
        if fewer:
            texts.append(f"use {streams_text(fewer)} instead of {plan.streams:,}")
            fixes.append(("streams", fewer))
    if plan.prompt_cache_states > 0 and _fits(plan.resized(prompt_cache_states=0), *args):
        kept = _largest(
            0,
            plan.prompt_cache_states - 1,
            lambda n: _fits(plan.resized(prompt_cache_states=n), *args),
        )
        texts.append(
            f"keep {kept} saved prompt state{'s' if kept != 1 else ''} instead of "
            f"{plan.prompt_cache_states:,}"
        )
        fixes.append(("prompt_cache", kept))
    four_bit = None if plan.config.quantized else _four_bit(plan)
    if four_bit is not None and _fits(four_bit, *args):
        texts.append(f"use the MLX 4-bit build ({_weights_text(four_bit)})")
        fixes.append(("format", "mlx4"))
    zero = replace(s, reserve_bytes=0)
    if s.reserve_bytes > 0 and _fits(plan, card_free, card_total, held, zero):
        attempt = _best(plan, card_free, card_total, held, zero)
        new = attempt.breakdown.free_after // _RESERVE_STEP * _RESERVE_STEP
        if new < s.reserve_bytes and _fits(plan, *args[:3], replace(s, reserve_bytes=new)):
            to = gib_text(new) if new else "none"
            texts.append(f"lower the memory reserve from {gib_text(s.reserve_bytes)} to {to}")
            fixes.append(("reserve_gib", new / GIB))
    if s.limit_bytes is not None and s.limit_bytes - held < card_free:
        unlimited = replace(s, limit_bytes=None)
        if _fits(plan, card_free, card_total, held, unlimited):
            short = -_best(plan, *args).breakdown.free_after
            need = math.ceil((s.limit_bytes + short) / _RESERVE_STEP) * _RESERVE_STEP
            if _fits(plan, card_free, card_total, held, replace(s, limit_bytes=need)):
                texts.append(
                    f"raise the memory limit from {gib_text(s.limit_bytes)} to {gib_text(need)}"
                )
                fixes.append(("limit_gib", need / GIB))
    if not texts:  # no one change is enough
        for text, fix in _combined(plan, four_bit, *args):
            texts.append(text)
            fixes.append(fix)
    return tuple(texts), tuple(fixes)


def _largest(low: int, high: int, ok: Callable[[int], bool]) -> int:
    """The largest n in [low, high] with `ok(n)`, by bisection, or `low - 1` where none is:
    `ok` holds up to some count and not past it (a plan only fits more easily with fewer
    streams or fewer saved states), so this is what trying each count from the top finds,
    in log2(high) checks instead of `high` (a plan asked for 10**9 streams)."""
    if low > high or not ok(low):
        return low - 1
    while low < high:
        mid = (low + high + 1) // 2
        if ok(mid):
            low = mid
        else:
            high = mid - 1
    return low


def _four_bit(plan: Plan) -> Plan:
    """The same choices with the weights of the model's MLX 4-bit build."""
    q_config = replace(plan.config, quantization=_MLX4, source=plan.config.source)
    q_bytes = arena_bytes(shape_tensor_specs(q_config, "mlx4"), plan.dtype_bytes)
    return plan.with_weights(WeightBytes.from_tensors(q_bytes, q_config), q_config)


def _weights_text(plan: Plan) -> str:
    w = plan.weights
    return f"about {gib_text(w.required_on_card + w.movable_to_host)} of weights"


def _combined(
    plan: Plan, four_bit: Plan | None, card_free: int, card_total: int, held: int, s: EngineSettings
) -> list[tuple[str, tuple[str | int | float, ...]]]:
    """The suggestions when no single change makes the plan fit: this model with fewer
    streams and a shorter context, and the 4-bit build with fewer streams or a shorter
    context, each where it fits (checked); else a smaller model. Each fix names every setting
    it changes: (setting, value, setting, value, ...)."""
    args = (card_free, card_total, held, s)
    out = []
    for candidate, most in ((plan, plan.streams - 1), (four_bit, plan.streams)):
        found = None if candidate is None else _fewer_and_shorter(plan, candidate, args, most)
        if found is None:
            continue
        n, ctx = found
        fix: tuple[str | int | float, ...] = () if candidate is plan else ("format", "mlx4")
        parts = []
        if n < plan.streams:
            parts.append(streams_text(n))
            fix += ("streams", n)
        if ctx < plan.context:
            parts.append(f"a context of {ctx:,} tokens")
            fix += ("context", ctx)
        if not parts:  # nothing changes: the one change was suggested already
            continue
        if candidate is plan:
            out.append((f"use {' with '.join(parts)}", fix))
        else:
            build = f"the MLX 4-bit build ({_weights_text(candidate)})"
            out.append((f"use {build} with {' and '.join(parts)}", fix))
    if out:
        return out
    least = plan.resized(context=min(plan.context, CONTEXT_STEP), streams=1, prompt_cache_states=0)
    short = -_best(least, *args).breakdown.free_after
    return [
        (
            f"choose a smaller model: even at {tokens_text(least.context)} with 1 stream this "
            f"one needs {gib_text(short)} more than {can_give(s, held, card_free)}",
            ("model", "smaller"),
        )
    ]


def _fewer_and_shorter(
    plan: Plan, candidate: Plan, args: tuple, most: int
) -> tuple[int, int] | None:
    """(streams, context): the most streams, at most `most`, that leave `candidate` a context
    (256 tokens, or the one `plan` asks for), and the longest context they leave, at most
    the one asked for; None where no count leaves one."""

    def context_at(n: int) -> int:
        return min(largest_context(candidate.resized(streams=n), *args), plan.context)

    def has_context(n: int) -> bool:
        ctx = context_at(n)
        return ctx >= CONTEXT_STEP or ctx >= plan.context

    n = _largest(1, most, has_context)  # fewer streams only leave a longer context
    return (n, context_at(n)) if n >= 1 else None


def admit(
    plan: Plan,
    card_free: int,
    card_total: int,
    held: int = 0,
    settings: EngineSettings | None = None,
    widen: bool = False,
) -> Decision:
    """Decide how (and whether) `plan` fits.

    card_free / card_total: the card now (NVML or cudaMemGetInfo). held: bytes this engine
    already holds outside the plan (they count against the limit; card_free already excludes
    them). Nothing in the plan is assumed allocated yet. widen: prefill chunks may grow past
    the plan's max_rows into memory left over (`WIDE_ROWS`).
    """
    s = settings or EngineSettings()
    best = _best(plan, card_free, card_total, held, s)
    if widen and best.fits:
        best = _widen(best, card_free, card_total, held, s)
    b = best.breakdown
    if not best.fits:
        texts, fixes = _suggest(plan, card_free, card_total, held, s)
        short = -b.free_after
        return Decision(
            verdict=Verdict.DOES_NOT_FIT,
            breakdown=b,
            streams=0,
            context=0,
            max_rows=plan.max_rows,
            eager=best.eager,
            host_embeddings=best.host_embeddings,
            prompt_cache_on_host=best.cache_on_host,
            kv_cache=plan.kv_cache,
            suggestions=texts,
            fixes=fixes,
            reason=f"the model needs {gib_text(short)} more than {can_give(s, held, card_free)} "
            f"({streams_text(plan.streams)} at {tokens_text(plan.context)})"
            + reserve_takes_all(s, held, card_free, available_bytes(card_free, held, s)),
        )
    if best.eager and not best.host_embeddings:
        verdict = Verdict.FITS
        reason = (
            "the model fits on the card" if best.cache_on_host else "everything fits on the card"
        )
    elif best.eager:
        verdict = Verdict.FITS_HOST_EMBEDDINGS
        reason = (
            f"the {gib_text(b.embeddings_on_host)} embedding table stays in the computer's RAM "
            "and is read from there; the rest of the model fits on the card"
        )
    else:
        verdict = Verdict.FITS_LAZY
        reason = (
            f"prompts are read in chunks of {best.plan.max_rows:,} tokens, as chunks of "
            f"{plan.max_rows:,} do not fit (their working memory grows as needed)"
        )
        if best.host_embeddings:
            reason += "; the embedding table stays in the computer's RAM"
    if best.plan.max_rows > plan.max_rows:
        reason += (
            f"; prompts are read in chunks of {best.plan.max_rows:,} tokens, in memory left over"
        )
    if best.cache_on_host:
        reason += (
            f"; saved conversation states ({gib_text(b.prompt_cache_on_host)}) are kept in the "
            "computer's RAM"
        )
    fast = min(FAST_ROWS, plan.max_rows)
    if best.plan.max_rows < fast:
        # Only a context that really keeps such chunks, and only one shorter than this.
        shorter = context_with_chunks(plan, *args_of(b, s), min_rows=fast)
        if 0 < shorter < plan.context:
            reason += f"; a context of {shorter:,} tokens keeps chunks of {fast:,} tokens"
    return Decision(
        verdict=verdict,
        breakdown=b,
        streams=plan.streams,
        context=plan.context,
        max_rows=best.plan.max_rows,
        eager=best.eager,
        host_embeddings=best.host_embeddings,
        prompt_cache_on_host=best.cache_on_host,
        score_rows=best.plan.score_rows,
        kv_cache=plan.kv_cache,
        suggestions=(),
        fixes=(),
        reason=reason,
    )


@dataclass(frozen=True)
class Card:
    """The card as admission sees it: total and free bytes now, and what this engine already
    holds outside the plan (counted against the limit; `free` already excludes it)."""

    total: int
    free: int
    held: int = 0
    speed: CardSpeed | None = None  # for the decision's prediction (engine.memory.speed)
    # Prefill attention runs fused there for 16-bit activations (the CUDA backend's
    # attn_prefill, sm_80 and newer): the workspace holds no scores (score_rows_for).
    fused_attention: bool = False


def decide(
    specs: Mapping[str, TensorSpec],
    config: ModelConfig,
    settings: EngineSettings,
    card: Card,
    *,
    context: int | None,
    streams: int = 1,
    max_rows: int | None = None,
    prompt_cache_states: int | None = None,
    any_chunks: bool = False,
) -> Decision:
    """The admission decision for a model on a card: the one route every caller takes.

    specs: internal tensor name -> TensorSpec (`engine.memory.arena.checkpoint_specs` for a
    checkpoint on disk, `engine.memory.shapes.shape_tensor_specs` for a catalog shape); the
    weights are planned at the bytes the CUDA backend's arena will carve for them.
    context: tokens per stream, at most the model's max_position_embeddings; None asks for
    the largest context the card admits at the fastest prefill chunks any context keeps
    (with `any_chunks`, at any chunks). max_rows: the most rows a prefill window holds;
    None admits the plan at BASE_ROWS and widens it where memory is left over. Never raises
    for "does not fit".
    """
    itemsize = act_itemsize(settings)
    draft = draft_choice(specs, config, settings)  # the MTP head's weights and state, if on
    weights = WeightBytes.from_tensors(
        arena_bytes(specs, itemsize, mtp=draft.on), config, mtp_loaded=draft.on
    )
    asked = context
    if context is not None:
        context = min(context, config.max_position_embeddings)
    wanted = SMALLEST_CONTEXT if context is None else context
    plan = make_plan(
        weights,
        config,
        wanted,
        streams,
        max_rows or BASE_ROWS,
        itemsize,
        prompt_cache_states,
        score_rows=score_rows_for(card.fused_attention, config, itemsize),
        kv_cache=settings.kv_cache,
        draft_tokens=draft.tokens,
    )
    if context is None:
        best = largest_context(plan, card.free, card.total, card.held, settings, any_chunks)
        plan = plan.resized(context=max(best, SMALLEST_CONTEXT))
    decision = admit(plan, card.free, card.total, card.held, settings, widen=not max_rows)
    decision = replace(decision, draft_tokens=draft.tokens, drafting=draft.reason)
    if asked is not None and asked > config.max_position_embeddings:
        reason = decision.reason + "; " + context_cap_text(asked, config.max_position_embeddings)
        decision = replace(decision, reason=reason)
    if not decision.fits or card.speed is None:
        return decision
    b = decision.breakdown
    table = 0 if decision.host_embeddings else plan.weights.embedding  # in b.weights or not
    step_weights = b.weights - (plan.weights.mtp if draft.on else 0)  # a plain step's reads
    speed = predict(
        config,
        step_weights,
        table,
        decision.context,
        decision.max_rows,
        card.speed,
        tensor_prefill=card.fused_attention and itemsize == 2,
    )
    return replace(decision, prediction=speed)
