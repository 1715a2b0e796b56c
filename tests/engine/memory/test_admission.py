"""Admission on a simulated card: room, eager/lazy/host embeddings, suggestions, failures."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.config import GIB, EngineSettings
from engine.errors import DeviceOutOfMemory, ScratchGrowFailed
from engine.memory import (
    Card,
    SimulatedPool,
    Verdict,
    admit,
    available_bytes,
    decide,
    largest_context,
)
from engine.memory.growth import ladder_below
from engine.memory.shapes import shape_config, shape_tensor_nbytes, shape_tensor_specs
from tests.engine.memory.conftest import commit, shape_plan


def _need(plan, eager=True, host=False) -> int:
    """Bytes the plan takes (reserve excluded), counted the way admission counts."""
    w = plan.weights
    scratch = plan.scratch_bytes if eager else plan.scratch_peak_bytes
    work = plan.workspace_bytes if eager else plan.workspace_peak_bytes
    weights = w.required_on_card + (0 if host else w.movable_to_host)
    return weights + scratch + work + plan.stream_state_total + plan.prompt_cache_bytes


def test_room_is_the_same_with_and_without_a_non_binding_limit(small_plan):
    free = 3 * GIB
    plain = admit(small_plan, free, 4 * GIB, held=0, settings=EngineSettings())
    loose = admit(small_plan, free, 4 * GIB, held=GIB, settings=EngineSettings(limit_bytes=8 * GIB))
    assert plain.breakdown.free_after == loose.breakdown.free_after
    assert plain.verdict == loose.verdict
    assert available_bytes(free, GIB, EngineSettings(limit_bytes=2 * GIB)) == GIB


def test_eager_exactly_when_the_full_scratch_fits(small_plan):
    s = EngineSettings()
    plan = small_plan.resized(prompt_cache_states=0)
    card = _need(plan) + s.reserve_bytes
    eager = admit(plan, card, card, settings=s)
    assert eager.verdict is Verdict.FITS and eager.eager and eager.max_rows == 512
    assert eager.breakdown.free_after == 0
    lazy = admit(plan, card - 1, card, settings=s)
    assert lazy.verdict is Verdict.FITS_LAZY and not lazy.eager
    assert lazy.max_rows in ladder_below(512) and lazy.context == plan.context


def test_chunks_widen_only_into_memory_left_over(small_plan):
    """Asked to, admission widens the prefill chunks where what is left over holds the
    wider scratch whole; the context, the streams and every placement stay as admitted."""
    s = EngineSettings()
    plan = small_plan.resized(prompt_cache_states=0, score_rows=0)  # fused attention: no scores
    exact = _need(plan) + s.reserve_bytes
    assert admit(plan, exact, exact, settings=s, widen=True).max_rows == 512
    for rows in (2048, 1024):
        wide = plan.resized(max_rows=rows)
        card = _need(wide) + s.reserve_bytes
        d = admit(plan, card, card, settings=s, widen=True)
        assert d.max_rows == rows and d.eager and d.breakdown.free_after == 0
        assert f"chunks of {rows:,} tokens" in d.reason and d.context == plan.context
        assert admit(plan, card, card, settings=s).max_rows == 512  # not asked: as planned
        assert admit(plan, card - 1, card, settings=s, widen=True).max_rows < rows
    # Where the saved states had to leave the card, they stay in host memory: widening
    # spends only what the admitted arrangement leaves over.
    cached = small_plan.resized(score_rows=0)
    for card in range(_need(cached) + s.reserve_bytes - 1, exact - GIB // 4, -GIB // 64):
        plain = admit(cached, card, card, settings=s)
        wide = admit(cached, card, card, settings=s, widen=True)
        assert wide.fits == plain.fits and wide.prompt_cache_on_host == plain.prompt_cache_on_host
        assert wide.host_embeddings == plain.host_embeddings and wide.eager == plain.eager
        assert wide.max_rows >= plain.max_rows
        assert wide.breakdown.free_after >= 0 or not plain.fits


def test_saved_states_leave_the_card_before_the_chunks_shrink(small_plan):
    """Invariant 8: one byte short, the prompt cache moves to host memory and the scratch
    stays whole; short by more, the chunks shrink but stay at 256 rows or more."""
    s = EngineSettings()
    card = _need(small_plan) + s.reserve_bytes
    assert not admit(small_plan, card, card, settings=s).prompt_cache_on_host
    hosted = admit(small_plan, card - 1, card, settings=s)
    assert hosted.verdict is Verdict.FITS and hosted.eager and hosted.prompt_cache_on_host
    assert hosted.breakdown.prompt_cache == 0
    assert hosted.breakdown.prompt_cache_on_host == small_plan.prompt_cache_bytes
    short = card - small_plan.prompt_cache_bytes - 1
    lazy = admit(small_plan, short, card, settings=s)
    assert lazy.verdict is Verdict.FITS_LAZY and lazy.max_rows == 256
    assert lazy.prompt_cache_on_host and "kept in the computer's RAM" in lazy.reason


@pytest.mark.parametrize("limit", [False, True])
def test_streams_and_cache_never_take_what_the_lazy_scratch_needs(small_plan, limit):
    s = EngineSettings()
    card = _need(small_plan) + s.reserve_bytes - 1 - small_plan.prompt_cache_bytes
    if limit:  # the same card simulated by a limit on a large one
        s = replace(s, limit_bytes=card)
        pool = SimulatedPool(64 * GIB, limit=card - s.reserve_bytes)
        decision = admit(small_plan, pool.card_free(), pool.card_total(), settings=s)
    else:
        # the reserve is the desktop's: the pool never lends it
        pool = SimulatedPool(card, other_used=s.reserve_bytes)
        decision = admit(small_plan, card, card, settings=s)
    assert decision.verdict is Verdict.FITS_LAZY and decision.prompt_cache_on_host
    held = commit(small_plan, decision, pool)
    assert held.scratch.nbytes == 0 and len(held.streams) == 2 and len(held.cache) == 0
    # the worst order of requests: climb every rung, then the full chunk size
    for rows in [*ladder_below(decision.max_rows), decision.max_rows]:
        held.scratch.ensure(rows)
        held.workspace.ensure(rows)
    assert held.scratch.capacity_rows == decision.max_rows


def test_no_limit_set_lazy_path_on_a_small_card():
    plan = shape_plan("4B", "mlx4", context=8192, streams=1, max_rows=1024, prompt_cache_states=0)
    s = EngineSettings()
    assert s.limit_bytes is None
    card = _need(plan) + s.reserve_bytes - 1
    decision = admit(plan, card, card, settings=s)
    assert decision.verdict is Verdict.FITS_LAZY
    held = commit(plan, decision, SimulatedPool(card, other_used=s.reserve_bytes))
    for rows in (1, 300, decision.max_rows // 2 + 1, decision.max_rows):
        held.scratch.ensure(rows)


def test_host_embeddings_when_an_untied_table_has_no_room():
    plan = shape_plan("9B", "mlx4", context=2048, streams=1, max_rows=256)
    assert not plan.weights.tied and plan.weights.movable_to_host > 0
    s = EngineSettings()
    card = _need(plan, host=True) + s.reserve_bytes + plan.weights.embedding // 2
    decision = admit(plan, card, card, settings=s)
    assert decision.verdict is Verdict.FITS_HOST_EMBEDDINGS and decision.host_embeddings
    assert decision.eager
    assert decision.breakdown.embeddings_on_host == plan.weights.embedding
    held = commit(plan, decision, SimulatedPool(card, other_used=s.reserve_bytes))
    assert held.embeddings is None


def test_tied_table_never_goes_to_host(small_plan):
    assert small_plan.weights.tied and small_plan.weights.movable_to_host == 0
    d = admit(small_plan, small_plan.weights.required_on_card, 4 * GIB)
    assert d.verdict is Verdict.DOES_NOT_FIT and not d.host_embeddings


def _apply(plan, settings, setting, value):
    if setting == "context":
        return plan.resized(context=value), settings
    if setting == "streams":
        return plan.resized(streams=value), settings
    if setting == "prompt_cache":
        return plan.resized(prompt_cache_states=value), settings
    if setting == "reserve_gib":
        return plan, settings.with_gib(reserve=value)
    if setting == "limit_gib":
        return plan, settings.with_gib(limit=value)
    if setting == "kv_cache":
        return plan.with_kv_cache(value), settings
    if setting == "format":
        config = shape_config("2B", value)
        return plan.with_weights(
            plan.weights.from_tensors(shape_tensor_nbytes(config, value), config), config
        ), settings
    raise AssertionError(setting)


@pytest.mark.parametrize(
    ("shape", "fmt", "context", "streams", "card", "limit"),
    [
        ("4B", "mlx4", 32768, 2, 4 * GIB, None),
        ("2B", "bf16", 4096, 1, 4 * GIB, None),
        ("0.8B", "mlx4", 65536, 4, 8 * GIB, 3 * GIB),
        ("4B", "mlx4", 40960, 1, 4 * GIB, None),
    ],
)
def test_does_not_fit_suggestions_fit_when_applied(shape, fmt, context, streams, card, limit):
    plan = shape_plan(shape, fmt, context=context, streams=streams, max_rows=512)
    s = EngineSettings(limit_bytes=limit)
    d = admit(plan, card, card, settings=s)
    assert d.verdict is Verdict.DOES_NOT_FIT and not d.fits
    assert d.streams == 0 and d.suggestions and len(d.suggestions) == len(d.fixes)
    assert d.breakdown.free_after < 0 and "more than" in d.reason
    for (setting, value), text in zip(d.fixes, d.suggestions, strict=True):
        assert (
            str(value).split(".")[0].replace(",", "") in text.replace(",", "")
            or setting == "format"
        )
        p2, s2 = _apply(plan, s, setting, value)
        assert admit(p2, card, card, settings=s2).fits, text


def test_suggestion_texts_carry_numbers():
    plan = shape_plan("4B", "mlx4", context=32768, streams=2, max_rows=512)
    d = admit(plan, 4 * GIB, 4 * GIB)
    assert any(
        t.startswith("shorten the context to ") and t.endswith(" tokens") for t in d.suggestions
    )
    bf16 = admit(shape_plan("2B", "bf16", context=4096, max_rows=512), 4 * GIB, 4 * GIB)
    four_bit = shape_plan("2B", "mlx4", context=4096, max_rows=512).weights
    gib = f"{four_bit.required_on_card / GIB:.2f}".rstrip("0").rstrip(".")
    assert f"use the MLX 4-bit build (about {gib} GiB of weights)" in bf16.suggestions


def test_largest_context_is_admitted_and_the_next_step_is_not(small_plan):
    """The largest context with the whole scratch at max rows; the next step would need
    smaller or lazy chunks (invariant 8: a shorter context before smaller chunks), or does
    not fit at all."""
    card = 2 * GIB
    ctx = largest_context(small_plan, card, card)
    assert ctx % 256 == 0 and ctx > 0
    at = admit(small_plan.resized(context=ctx), card, card)
    assert at.fits and at.eager and at.max_rows == small_plan.max_rows
    past = admit(small_plan.resized(context=ctx + 256), card, card)
    assert not past.fits or not past.eager or past.max_rows < small_plan.max_rows


def test_the_whole_scratch_comes_before_the_last_tokens_of_context():
    """The 0.8B on a 4 GiB card: its longest context in lazy 256-row chunks is 261,888
    tokens; 768 fewer keep the whole 512-row scratch, which the planner takes (an 8,000-token
    prompt took 0.44 s in the lazy chunks on the H200 and 0.08 s in 512-row ones)."""
    plan = shape_plan("0.8B", "mlx4", context=4096, max_rows=512)
    card = 4 * GIB
    ctx = largest_context(plan, card, card)
    at = admit(plan.resized(context=ctx), card, card)
    assert at.eager and at.max_rows == 512
    lazy = admit(plan.resized(context=ctx + 256), card, card)
    assert lazy.fits and not lazy.eager  # more context was there, in smaller chunks


def test_the_largest_context_at_any_chunks_fits_and_the_next_step_does_not():
    """The 4B on a 3 GiB card keeps its 512-row chunks only to 1,280 tokens, and fits 4,096
    in lazy ones: the largest context at any chunks is past both, and 256 more do not fit."""
    plan = shape_plan("4B", "mlx4", context=4096, max_rows=512)
    card = 3 * GIB
    fastest = largest_context(plan, card, card)
    most = largest_context(plan, card, card, any_chunks=True)
    assert admit(plan, card, card).fits and most >= 4096 > fastest
    assert admit(plan.resized(context=most), card, card).fits
    assert not admit(plan.resized(context=most + 256), card, card).fits


def test_failure_at_every_commit_site_is_named_and_leaves_the_rest(small_plan):
    card = 4 * GIB
    decision = admit(small_plan, card, card)
    assert decision.verdict is Verdict.FITS
    sites = ["arena", "scratch", "workspace", "stream:1", "prompt_cache:0"]
    for site in sites:
        pool = SimulatedPool(card, fail_at={site})
        error = ScratchGrowFailed if site == "scratch" else DeviceOutOfMemory
        if site == "workspace":
            from engine.errors import WorkspaceGrowFailed as error  # noqa: N813
        with pytest.raises(error) as info:
            commit(small_plan, decision, pool)
        if error is DeviceOutOfMemory:
            assert info.value.category == site.split(":")[0]
        before = pool.held_by_tag()
        assert site not in before  # nothing half-allocated under the failing tag
        assert all(n > 0 for n in before.values())


def test_to_dict_and_table_render(small_plan):
    import json

    d = admit(small_plan, 4 * GIB, 4 * GIB)
    data = json.loads(json.dumps(d.to_dict()))
    assert data["verdict"] == "fits" and data["breakdown"]["streams"] == 2
    table = d.format_table()
    assert "verdict: fits" in table and "scratch (whole)" in table


def test_a_card_with_room_gets_the_large_attention_workspace():
    from engine.memory.workspace import ATTN_QUERY_ROWS, FAST_QUERY_ROWS

    big = shape_plan("4B", "mlx4", context=32768, streams=1, max_rows=512)
    roomy = admit(big, 140 * GIB, 140 * GIB, 0, EngineSettings())
    assert roomy.eager and roomy.score_rows == FAST_QUERY_ROWS
    tight = admit(big.resized(context=16384), 4 * GIB, 4 * GIB, 0, EngineSettings())
    assert tight.fits and tight.score_rows == ATTN_QUERY_ROWS
    assert tight.breakdown.workspace_peak < roomy.breakdown.workspace_peak


def _decide(shape, fmt, card_gib, context, streams=1, **settings):
    """The decision the app's views and `snug plan --card-gib` show for a catalog shape."""
    config = shape_config(shape, fmt)
    card = Card(int(card_gib * GIB), int(card_gib * GIB), fused_attention=True)
    return decide(
        shape_tensor_specs(config, fmt),
        config,
        EngineSettings(**settings),
        card,
        context=context,
        streams=streams,
    )


def _apply_all(fix, shape, fmt, context, streams, settings):
    """A suggestion's settings (setting, value, setting, value, ...) applied to the inputs."""
    settings = dict(settings)
    for setting, value in zip(fix[::2], fix[1::2], strict=True):
        if setting == "format":
            fmt = value
        elif setting == "context":
            context = value
        elif setting == "streams":
            streams = value
        else:
            raise AssertionError(setting)
    return shape, fmt, context, streams, settings


@pytest.mark.parametrize(
    ("shape", "fmt", "card_gib", "context", "streams", "settings", "changes"),
    [
        # the 4-bit build fits, but only with a shorter context and fewer streams
        ("4B", "bf16", 4, 65536, 3, {}, {"format", "context"}),
        ("9B", "bf16", 6, 262144, 4, {}, {"format", "context"}),
        ("2B", "bf16", 2, 32768, 4, {"kv_cache": "int8"}, {"format", "context"}),
        # nothing of this model fits: a smaller one, with the bytes it lacks
        ("9B", "mlx4", 4, 8192, 1, {}, {"model"}),
        ("0.8B", "mlx4", 0.4, 4096, 1, {}, {"model"}),  # a card smaller than the reserve
    ],
)
def test_a_model_that_fits_no_single_change_is_told_what_to_change(
    shape, fmt, card_gib, context, streams, settings, changes
):
    d = _decide(shape, fmt, card_gib, context, streams, **settings)
    assert not d.fits and len(d.suggestions) == len(d.fixes) == 1
    (text,), (fix,) = d.suggestions, d.fixes
    assert set(fix[::2]) == changes, (text, fix)
    if changes == {"model"}:
        assert text.startswith("choose a smaller model") and "GiB more than" in text
        return
    for setting, value in zip(fix[::2], fix[1::2], strict=True):
        assert str(value) in text.replace(",", "") or setting == "format", text
    shape, fmt, context, streams, settings = _apply_all(fix, shape, fmt, context, streams, settings)
    assert _decide(shape, fmt, card_gib, context, streams, **settings).fits, text


def test_the_shortfall_names_the_memory_limit_where_the_limit_is_what_binds():
    tight = _decide("4B", "mlx4", 4, 8192, limit_bytes=2 * GIB)
    assert "more than the 2 GiB memory limit allows" in tight.reason
    assert any(t.startswith("raise the memory limit") for t in tight.suggestions)
    loose = _decide("4B", "mlx4", 4, 65536, limit_bytes=8 * GIB)  # above the card: no cap
    assert "more than this card can give" in loose.reason and "limit" not in loose.reason


def test_a_fit_with_saved_states_in_ram_does_not_say_everything_is_on_the_card():
    """The 4B 4-bit at 16K on a 4 GiB card: the saved state moves to the computer's RAM."""
    d = _decide("4B", "mlx4", 4, 16384)
    assert d.verdict is Verdict.FITS and d.prompt_cache_on_host
    assert "everything" not in d.reason and "kept in the computer's RAM" in d.reason
    alone = _decide("0.8B", "mlx4", 4, 8192)
    assert not alone.prompt_cache_on_host and alone.reason.startswith("everything fits")
