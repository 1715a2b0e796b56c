"""Drafting with the checkpoint's MTP head: several tokens a decode step, the same reply.

A `Drafter` serves a single-stream reply (`Engine._next_tokens` hands it one-stream steps).
Each round, with x the last token (not yet fed) at position n:

1. The MTP head (engine/models/mtp.py) runs over the positions whose final hidden state it
   has not seen, up to n - 1 (the next token of each is known now, x for the last), which
   writes its KV there, and drafts d1 from the last row; then k - 1 one-row steps chain
   d2..dk from its own hidden state.
2. One verify forward of the main model runs the k + 1 rows [x, d1..dk] at positions
   n..n+k (`Batch.verify`: its DeltaNet rows' states are kept), with every row's logits.
3. engine.speculative decides: greedy keeps the drafts the model itself would pick (so the
   reply equals decoding without drafts, token for token); sampling keeps each with
   probability min(1, p/q) and draws the replacement from norm(max(0, p - q)), which keeps
   the model's distribution. The round yields a + 1 tokens (a kept drafts, one more).
4. When a < k the backend rewinds the slot's DeltaNet state to the one after row a
   (`Backend.rewind`); the KV entries of the rejected rows stay and are overwritten later.
   The verify's hidden states of rows 0..a wait for the next round's step 1.

A greedy reply's round waits once (`Drafter._greedy_round`): the drafts stay on the backend
(each chained step reads the last one's pick there), and the verify, its picks and step 1 of
the next round run as one forward (`Backend.verify_follow`, one captured graph on a GPU):
the head runs over all k + 1 verified positions with the verify's own picks as their next
tokens, which are the true ones up to row a, and its LM head over row a (chosen on the
device) gives the next round's d1.
A sampled reply waits for each draft, whose distribution the verify needs.

`Engine.prefill` keeps the head in step with the prompt (`follow`), so the head's KV cache
covers the prompt and a saved prompt state holds it too (it is the backend's last KV layer).
"auto" picks k from 0..3 each round by the acceptance seen so far (`DraftPolicy`); at 0
the reply decodes plainly (the decode graph on a GPU) and tries drafting again later.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from engine import speculative
from engine.backends.base import Batch
from engine.memory.draft import DraftChoice, draft_choice
from engine.models.mtp import MtpHead
from engine.sampling import Sampler, SamplingParams

log = logging.getLogger(__name__)

# "auto": an extra verify row costs about this share of a decode step (the issue's
# targets: 1.15x, 1.25x, 1.35x a step for k = 1, 2, 3); a draft costs the share of a step's
# weight bytes its head reads (the MTP layer and the LM head).
VERIFY_ROW_COST = 0.12
PRIOR_RATE, PRIOR_TRIES = 0.8, 4.0  # acceptance assumed before any is seen, and its weight
DECAY = 0.9  # per round: the acceptance follows the reply's recent text
PROBE_EVERY = 32  # plain tokens before "auto" at 0 tries one draft again


class DraftPolicy:
    """How many tokens the next round drafts: the setting's count, or ("auto") the count
    with the most tokens per unit of cost at the acceptance rate seen so far. A round's
    cost in decode steps is the one measured on this backend at load (`round_costs`, k ->
    steps; `sampled_costs` for a sampled reply's rounds, which wait for each draft and draw
    on the host), else estimated from VERIFY_ROW_COST and the drafts' weight bytes."""

    def __init__(
        self,
        most: int,
        auto: bool,
        draft_cost: float,
        round_costs: dict[int, float] | None = None,
        sampled_costs: dict[int, float] | None = None,
    ) -> None:
        self.most, self.auto, self.draft_cost = most, auto, draft_cost
        self.round_costs = dict(round_costs or {})
        self.sampled_costs = dict(sampled_costs or {})
        self.tried, self.kept = PRIOR_TRIES, PRIOR_TRIES * PRIOR_RATE
        self.plain = 0  # tokens decoded without drafts since "auto" chose 0

    def cost(self, k: int, sampled: bool = False) -> float:
        """A round of k drafts, in decode steps (k = 0: one plain step)."""
        if not k:
            return 1.0
        measured = self.sampled_costs if sampled and self.sampled_costs else self.round_costs
        return measured.get(k, 1 + k * (VERIFY_ROW_COST + self.draft_cost))

    @property
    def rate(self) -> float:
        """Estimated chance that a draft is kept, given the drafts before it were."""
        return self.kept / self.tried

    def record(self, drafted: int, kept: int) -> None:
        """A round kept `kept` of its `drafted` drafts (draft i was tried if all before it
        were kept)."""
        self.tried = DECAY * self.tried + min(drafted, kept + 1)
        self.kept = DECAY * self.kept + kept

    def gain(self, k: int, sampled: bool = False) -> float:
        """Expected tokens a round of k drafts gives, per decode step it costs."""
        a = self.rate
        return sum(a**i for i in range(k + 1)) / self.cost(k, sampled)

    def next(self, sampled: bool = False) -> int:
        """The next round's drafts (`sampled`: for a reply that draws its tokens)."""
        if not self.auto:
            return self.most
        best = max(range(self.most + 1), key=lambda k: self.gain(k, sampled))
        if best:
            self.plain = 0
            return best
        self.plain += 1
        if self.plain > PROBE_EVERY:
            self.plain = 0
            return 1
        return 0


@dataclass
class DraftStats:
    """Counts over the drafter's life (tools/bench_draft.py reads them)."""

    rounds: int = 0  # verify forwards
    drafted: int = 0
    kept: int = 0
    tokens: int = 0  # tokens the rounds gave (kept drafts plus one a round)
    plain: int = 0  # tokens decoded without drafts
    tried_at: list[int] = field(default_factory=lambda: [0, 0, 0])  # per draft position
    kept_at: list[int] = field(default_factory=lambda: [0, 0, 0])

    def acceptance(self) -> list[float]:
        """Per draft position: the share kept of those tried."""
        return [k / t if t else 0.0 for k, t in zip(self.kept_at, self.tried_at, strict=True)]


@dataclass
class _Track:
    """One stream's place in the head: the final hidden states of positions pos.. that the
    head has not run over yet (`rows` of them), and tokens a verify gave, not yet handed out.
    After a greedy round (`Drafter._greedy_round`) the head has run up to pos - 1: `first`
    is its draft for pos + 1 and `chain` its hidden state at pos - 1 `[1, H]`."""

    stream: Any
    pos: int
    held: Any = None
    rows: int = 0
    queue: list[int] = field(default_factory=list)
    first: int | None = None
    chain: Any = None

    def drop_first(self) -> None:
        self.first, self.chain = None, None


def choose(checkpoint: Any, settings: Any, decision: Any) -> DraftChoice:
    """Drafting for a load: what admission decided (a GPU), else from the checkpoint."""
    if decision is not None:
        auto = settings.draft_tokens == "auto" and decision.draft_tokens > 0
        return DraftChoice(decision.draft_tokens, auto, decision.drafting)
    from engine.memory import checkpoint_specs

    return draft_choice(checkpoint_specs(checkpoint), checkpoint.config, settings)


def attach(engine: Any, choice: DraftChoice) -> Any:
    """Give a loaded engine its Drafter (where `choice` drafts) and warm it up; returns
    the engine."""
    engine.drafting = choice.reason
    if choice.on:
        engine.drafter = Drafter(engine, choice)
        engine.drafter.warm_up()
    return engine


def draft_cost(tensors: dict[str, Any], tied: bool) -> float:
    """A draft's weight bytes (MTP layer and LM head) over a decode step's."""
    head = tensors["embed_tokens" if tied else "lm_head"].nbytes
    mtp = sum(t.nbytes for n, t in tensors.items() if n.startswith("mtp."))
    step = sum(t.nbytes for n, t in tensors.items() if not n.startswith("mtp."))
    if not tied:
        step -= tensors["embed_tokens"].nbytes  # a step reads a few rows of it
    return (mtp + head) / max(step, 1)


class Drafter:
    """Owns drafting for an Engine whose backend loaded the MTP head (`draft_tokens`)."""

    def __init__(self, engine: Any, choice: DraftChoice) -> None:
        self.engine, self.model, self.backend = engine, engine.model, engine.backend
        self.head = MtpHead(engine.model)
        cost = draft_cost(engine.checkpoint.tensors, engine.config.tie_word_embeddings)
        self.policy = DraftPolicy(choice.tokens, choice.auto, cost)
        self.stats = DraftStats()
        self.forced: list[int] | None = None  # a reply's known continuation (tools)
        self._tracks: dict[int, _Track] = {}
        self._drafts: Any = None  # a greedy round's drafts on the backend (`id_buffer`)

    # ----- the prompt --------------------------------------------------------------------
    def follow(self, stream: Any, next_id: int | None) -> None:
        """After one of `Engine.prefill`'s windows (forward with hidden=True; its ids are
        at the end of stream.ids): run the head over the positions whose next token is known
        (`next_id`: the one after the window, if known) and hold the rest."""
        rows = self.model.hidden.shape[0]
        start = len(stream.ids) - rows
        track = self._tracks.get(stream.slot)
        if track is None or track.stream is not stream or track.pos + track.rows != start:
            track = self._tracks[stream.slot] = _Track(stream, start)
        track.queue.clear()
        track.drop_first()
        hidden = self.backend.hold_rows(self.model.hidden, np.arange(rows))
        if track.rows:
            hidden = self.backend.concat_rows(track.held, hidden)
        self._run_head(track, hidden, None if next_id is None else [next_id], logits=False)

    def _run_head(self, track: _Track, hidden: Any, tail: list[int] | None, logits: bool):
        """The head over the held positions pos.. (`hidden` their states): each row's next
        token is in stream.ids, the last one's is `tail` (None: unknown, that row is held).
        Returns the last row's logits when asked."""
        ids, pos, m = track.stream.ids, track.pos, hidden.shape[0]
        n = m if tail else m - 1  # the rows whose next token is known
        nexts = ids[pos + 1 : pos + m] + (tail or [])
        out, max_rows = None, self.engine.max_rows
        for start in range(0, n, max_rows):
            end = min(n, start + max_rows)
            part = hidden if (start, end) == (0, m) else None
            if part is None:
                part = self.backend.hold_rows(hidden, np.arange(start, end))
            want = np.array([end - start - 1], np.int32) if logits and end == n else None
            batch = Batch.window(track.stream.slot, pos + start, end - start)
            ids = np.asarray(nexts[start:end])
            out = self.backend.head_forward(self.head, batch, ids, part, want)
        track.held = self.backend.hold_rows(hidden, np.arange(n, m))
        track.pos, track.rows = pos + n, m - n
        return out

    # ----- decoding ----------------------------------------------------------------------
    def next_token(self, stream: Any, token: int, sampler: Any, generated: list[int]) -> int:
        """The reply's next token after `token` (not yet fed), as `Engine._next_tokens` would
        give it for this one stream."""
        track = self._tracks.get(stream.slot)
        if track is None or track.stream is not stream:
            track = self._tracks[stream.slot] = _Track(stream, len(stream.ids))
        if track.queue:
            return track.queue.pop(0)
        n = len(stream.ids)
        k = min(self.policy.next(not sampler.takes_argmax), self.engine.context - n - 1)
        if k <= 0:  # plainly; the head falls out of step with the stream
            self.stats.plain += 1
            track.pos, track.held, track.rows = n + 1, None, 0
            track.drop_first()
            step = self.engine._next_tokens([stream], [token], [sampler], [generated], False)
            return step[0]
        if sampler.takes_argmax:
            return self._greedy_round(track, token, k, generated)
        track.drop_first()
        if not track.rows or track.pos + track.rows != n:
            # The head needs the final hidden state of position n - 1, which a plain step
            # does not keep: this round verifies the token alone, without drafts.
            track.pos, track.held, track.rows, k = n, None, 0, 0
        drafts, q_rows = self._draft(track, token, k, sampler, generated)
        return self._verify(track, token, drafts, q_rows, sampler, generated)

    def queued(self, stream: Any) -> int | None:
        """The next of the tokens `stream`'s last verify gave and fed, not yet handed out
        (taken from the queue), or None."""
        track = self._tracks.get(stream.slot)
        if track is None or track.stream is not stream or not track.queue:
            return None
        return track.queue.pop(0)

    def _pick(self, logits: Any, sampler: Any, prefix: list[int]) -> tuple[int, Any]:
        """A draft from the head's logits [1, V]: greedy as the model picks, or drawn from
        the request's distribution (returned too, for the verify)."""
        if sampler.takes_argmax:
            return int(self.backend.argmax_rows(logits)[0]), None
        row = np.asarray(self.backend.to_host(logits), np.float32)[0]
        if sampler.params.is_greedy:
            return sampler(row, prefix), None
        q = sampler.distribution(row, prefix)
        return speculative.draw(q, sampler.rng), q

    def _draft(self, track, token, k, sampler, generated) -> tuple[list[int], list]:
        """Step 1: the head over the held positions, then k drafts."""
        if not track.rows:
            return [], []
        logits = self._run_head(track, track.held, [token], logits=k > 0)
        drafts, q_rows = [], []
        hidden = self.head.hidden
        n = len(track.stream.ids)
        for j in range(k):
            if j:
                rows = np.array([hidden.shape[0] - 1])
                h = self.backend.hold_rows(hidden, rows)
                batch = Batch.window(track.stream.slot, n + j - 1, 1)
                first = np.zeros(1, np.int32)
                ids = np.asarray(drafts[-1:])
                logits = self.backend.head_forward(self.head, batch, ids, h, first)
                hidden = self.head.hidden
            draft, q = self._pick(logits, sampler, generated + drafts)
            if self._forces(generated, k) and sampler.params.is_greedy:
                draft = self.forced[len(generated) + j]
            drafts.append(draft)
            q_rows.append(q)
        return drafts, q_rows

    def _verify(self, track, token, drafts, q_rows, sampler, generated) -> int:
        """Steps 2 to 4: verify [token, drafts], keep what the model agrees with, rewind."""
        stream, k = track.stream, len(drafts)
        n = len(stream.ids)
        window = [token, *drafts]
        batch = Batch.verify(stream.slot, n, k + 1)
        logits, hidden = self.backend.verify_forward(self.model, batch, np.asarray(window))
        if sampler.takes_argmax:
            new = speculative.accept_greedy(drafts, self.backend.argmax_rows(logits).tolist())
        else:
            rows = np.asarray(self.backend.to_host(logits), np.float32)
            prefixes = [generated + drafts[:i] for i in range(k + 1)]
            if sampler.params.is_greedy:
                picks = [sampler(r, p) for r, p in zip(rows, prefixes, strict=True)]
                new = speculative.accept_greedy(drafts, picks)
            else:
                p_rows = [sampler.distribution(r, p) for r, p in zip(rows, prefixes, strict=True)]
                new = speculative.accept_sampled(drafts, p_rows, q_rows, sampler.rng)
        kept = len(new) - 1
        stream.ids.extend(window[: kept + 1])
        if kept < k:
            self.backend.rewind(stream.slot, kept + 1)
        track.pos, track.rows = n, kept + 1
        track.held = self.backend.hold_rows(hidden, np.arange(kept + 1))
        track.queue = new[1:]
        self._count(track, k, kept, len(new))
        return new[0]

    def _greedy_round(self, track: _Track, token: int, k: int, generated: list[int]) -> int:
        """A round for a greedy reply with one wait: the drafts stay on the backend, each
        chained step reads the last one's pick there, and the verify, its picks and the head
        over the verified positions run as one forward (`Backend.verify_follow`), which
        leaves the next round's first draft. Same tokens as `_draft` then `_verify`."""
        be, stream, head = self.backend, track.stream, self.head
        n, slot = len(stream.ids), stream.slot
        drafts = self._draft_ids(k)
        if track.first is not None and track.pos == n:
            drafts[0] = track.first
            chain = track.chain
        elif track.rows and track.pos + track.rows == n:
            be.pick_into(self._run_head(track, track.held, [token], logits=True), drafts[:1])
            chain = be.hold_rows(head.hidden, np.array([head.hidden.shape[0] - 1]))
        else:  # the head has not seen position n - 1: this round verifies the token alone
            k, chain = 0, None
        self._chain(slot, n, k, drafts, chain)
        ids = np.zeros(k + 1, np.int32)
        ids[0], fill = token, drafts[:k]
        if k and self._forces(generated, k):
            ids[1:], fill = self.forced[len(generated) : len(generated) + k], None
        out = be.verify_follow(self.model, head, Batch.verify(slot, n, k + 1), ids, fill)
        chain = be.hold_rows(head.hidden, np.arange(k + 1))  # before anything reuses it
        window, picks, follow = np.asarray(be.to_host(out), np.int64).tolist()  # the wait
        new = speculative.accept_greedy(window[1:], picks)
        kept = len(new) - 1
        stream.ids.extend(window[: kept + 1])
        if kept < k:
            be.rewind(slot, kept + 1)
        track.pos, track.held, track.rows = n + kept + 1, None, 0
        track.first, track.chain = follow[0], chain[kept : kept + 1]
        track.queue = new[1:]
        self._count(track, k, kept, len(new))
        return new[0]

    def _draft_ids(self, k: int) -> Any:
        """The backend buffer a greedy round's k drafts stay in (one for every round: each
        round waits for its end)."""
        if self._drafts is None or len(self._drafts) < k:
            self._drafts = self.backend.id_buffer(max(k, self.policy.most))
        return self._drafts

    def _chain(self, slot: int, start: int, k: int, drafts: Any, chain: Any) -> None:
        """Drafts 2..k into `drafts` on the backend: draft j + 1 from the head's one-row
        step at start + j - 1 over draft j (read there), from `chain`, the head's hidden
        state before the first step."""
        be, head, one = self.backend, self.head, np.zeros(1, np.int32)
        for j in range(1, k):
            batch = Batch.window(slot, start + j - 1, 1)
            logits = be.head_forward(head, batch, one, chain, one, fill=drafts[j - 1 : j])
            be.pick_into(logits, drafts[j : j + 1])
            chain = be.hold_rows(head.hidden, one)

    def _forces(self, generated: list[int], k: int) -> bool:
        """Whether this round's k drafts are a tool's (`forced`, a known continuation): the
        rounds it covers whole."""
        return self.forced is not None and len(generated) + k <= len(self.forced)

    def _count(self, track: _Track, drafted: int, kept: int, tokens: int) -> None:
        track.stream.drafted += drafted  # the request's own counts (GenerationStats)
        track.stream.drafts_kept += kept
        s = self.stats
        s.rounds += 1
        s.drafted += drafted
        s.kept += kept
        s.tokens += tokens
        for i in range(min(drafted, kept + 1)):
            s.tried_at[i] += 1
            s.kept_at[i] += int(i < kept)
        if drafted:
            self.policy.record(drafted, kept)

    # ----- load --------------------------------------------------------------------------
    def warm_up(self) -> None:
        """Run a verify of the most rows and the head's forwards once on slot 0 (compiles
        what a reply will use), then zero the slot."""
        be, k = self.backend, self.policy.most
        ids = np.zeros(k + 1, np.int32)
        for rows in range(2, k + 2):  # each verify size: its kernels, then its graph
            for _ in range(2):
                be.verify_forward(self.model, Batch.verify(0, 0, rows), ids[:rows])
        be.rewind(0, 1)
        held = be.hold_rows(self.model.hidden, np.arange(k + 1))
        for rows in range(1, k + 2):  # the head's sizes in a round: kernels, then graphs
            last = np.array([rows - 1], np.int32)
            for _ in range(2):
                be.head_forward(self.head, Batch.window(0, 0, rows), ids[:rows], held[:rows], last)
        for rows in range(1, k + 2):  # a greedy round's verify and head (`_greedy_round`)
            for _ in range(2):
                be.verify_follow(self.model, self.head, Batch.verify(0, 0, rows), ids[:rows], None)
        be.rewind(0, 1)
        if self.policy.auto:
            self.policy.round_costs = self.measure()
            self.policy.sampled_costs = self.measure(sampled=True, reps=2)
        be.reset_slot(0)

    def measure(self, sampled: bool = False, reps: int = 3) -> dict[int, float]:
        """Each greedy round's cost (k - 1 chained head steps, then the verify of k + 1 rows
        with the head after it), or with `sampled` a sampled reply's (`_sampled_round`), in
        decode steps of this backend, timed on slot 0 (the best of `reps`): "auto" drafts
        only where the acceptance pays for it. A slow verify makes it decode plainly."""
        be, model = self.backend, self.model

        def best(run: Any) -> float:
            times = []
            for _ in range(reps):
                t = time.perf_counter()
                be.to_host(run())  # the work is done when its output is on the host
                times.append(time.perf_counter() - t)
            return min(times)

        one = np.zeros(1, np.int32)
        step = best(lambda: be.decode_step(model, Batch.step([(0, 1)]), one)[0])
        sampler = None
        if sampled:
            sampler = Sampler(SamplingParams(seed=0), be.vocab_rows or model.config.vocab_size)
        costs = {}
        for k in range(1, self.policy.most + 1):
            run = partial(self._sampled_round, k, sampler) if sampler else partial(self._round, k)
            costs[k] = best(run) / max(step, 1e-9)
        kind = "sampled" if sampled else "greedy"
        log.info("drafting: a %s round of k = 1.. drafts costs %s decode steps", kind, costs)
        return costs

    def _round(self, k: int) -> Any:
        """A greedy round's work on slot 0 (warm-up's timing), as `_greedy_round` runs it."""
        be, head = self.backend, self.head
        drafts = self._draft_ids(k)[:k]
        self._chain(0, k + 1, k, drafts, be.hold_rows(head.hidden, np.zeros(1, np.int32)))
        ids = np.zeros(k + 1, np.int32)
        out = be.verify_follow(self.model, head, Batch.verify(0, 0, k + 1), ids, drafts)
        be.rewind(0, 1)
        return out

    def _sampled_round(self, k: int, sampler: Any) -> Any:
        """A sampled round's work on slot 0 (warm-up's timing), as `_draft` and `_verify` run
        it with the app's sampling: each draft waits for its logits and draws on the host,
        and so does each verified row."""
        be, head = self.backend, self.head
        one, rows = np.zeros(1, np.int32), np.arange(1)
        hidden = be.hold_rows(head.hidden, rows)
        drafts, q_rows = [], []
        for j in range(k):
            logits = be.head_forward(head, Batch.window(0, k + j, 1), one, hidden, one)
            hidden = be.hold_rows(head.hidden, rows)
            q = sampler.distribution(np.asarray(be.to_host(logits), np.float32)[0], drafts)
            drafts.append(speculative.draw(q, sampler.rng))
            q_rows.append(q)
        logits, _ = be.verify_forward(
            self.model, Batch.verify(0, 0, k + 1), np.zeros(k + 1, np.int32)
        )
        verified = np.asarray(be.to_host(logits), np.float32)
        p_rows = [sampler.distribution(r, drafts[:i]) for i, r in enumerate(verified)]
        speculative.accept_sampled(drafts, p_rows, q_rows, sampler.rng)
        be.rewind(0, 1)
        return np.asarray(drafts)  # on the host: the round has waited for all of it
