"""Token sampling on the host: greedy, temperature, top-k, top-p, min-p, presence and
frequency penalties, a bias on chosen tokens' logits.

Logits columns at or past `vocab_rows` are vocabulary padding (Qwen3.5 pads 248077 real ids
to 248320 columns); they are masked before anything else so they can never be sampled.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from engine.errors import SettingOutOfRange, quoted

# Qwen3.5's model cards recommend one sampling for replies without thinking and another
# for replies that think first (general tasks; no repetition penalty). The app's two
# sampling sets start from these; the command line takes them where no flag is given.
RECOMMENDED: dict[bool, dict[str, float | int]] = {
    False: {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0, "presence_penalty": 1.5},
    True: {"temperature": 1.0, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "presence_penalty": 1.5},
}


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the next token. `greedy` (or temperature 0) ignores the other knobs."""

    temperature: float = 0.7
    top_k: int = 20
    top_p: float = 0.8
    min_p: float = 0.0
    presence_penalty: float = 0.0
    # Taken off a token's logit once for each time the reply so far holds it (OpenAI's
    # `frequency_penalty`); on the host only.
    frequency_penalty: float = 0.0
    # (token id, value added to its logit) pairs (OpenAI's `logit_bias`); on the host only.
    logit_bias: tuple[tuple[int, float], ...] = ()
    seed: int | None = None
    greedy: bool = False
    # Ids of the reply that came before this request's first token (a reply gone on with
    # after its thinking was closed at a budget): the penalties count them as the reply's.
    # Keyword-only: the positional order of this and GenerationParams' fields stays as it was.
    earlier: tuple[int, ...] = field(default=(), kw_only=True)

    def __post_init__(self) -> None:
        self._check_types()
        checks = (
            (
                self.temperature >= 0 and math.isfinite(self.temperature),
                f"temperature {self.temperature} must be a finite number >= 0",
            ),
            (self.top_k >= 0, f"top_k {self.top_k} must be >= 0 (0 = off)"),
            (0 < self.top_p <= 1, f"top_p {self.top_p} must be in (0, 1]"),
            (0 <= self.min_p < 1, f"min_p {self.min_p} must be in [0, 1)"),
            (
                math.isfinite(self.presence_penalty),
                f"presence_penalty {self.presence_penalty} must be a finite number",
            ),
            (
                math.isfinite(self.frequency_penalty),
                f"frequency_penalty {self.frequency_penalty} must be a finite number",
            ),
            (
                all(t >= 0 for t, _ in self.logit_bias),
                "logit_bias names a negative token id",
            ),
            (
                not any(math.isnan(b) for _, b in self.logit_bias),
                "logit_bias gives a token a bias that is not a number (NaN)",
            ),
        )
        for ok, message in checks:
            if not ok:
                _refuse(message)

    def _check_types(self) -> None:
        """Each setting of its type, or refused by name: the knobs real numbers, top_k and
        seed whole numbers (kept as ints), greedy a bool; `logit_bias` (pairs, or OpenAI's
        dict {token id: bias}, kept sorted by id) and `earlier` kept as tuples."""
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                _refuse(f"{name} {quoted(value, 80)} must be a number")
        if not isinstance(self.greedy, bool | np.bool_):
            _refuse(f"greedy {quoted(self.greedy, 80)} must be True or False")
        _set(self, "greedy", bool(self.greedy))
        _set(self, "top_k", whole_number("top_k", self.top_k, " >= 0 (0 = off)", negative=True))
        if self.seed is not None:
            _set(
                self,
                "seed",
                whole_number("seed", self.seed, " >= 0 (or None: a new draw each time)"),
            )
        _set(self, "logit_bias", _bias_pairs(self.logit_bias))
        if not isinstance(self.earlier, Sequence):
            _refuse(f"earlier {quoted(self.earlier, 80)} must be a sequence of token ids")
        _set(
            self,
            "earlier",
            tuple(whole_number("earlier token id", t, " >= 0") for t in self.earlier),
        )

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0

    @property
    def takes_argmax(self) -> bool:
        """Greedy with nothing to take off the logits: the decode step's own argmax."""
        return self.is_greedy and not (self.presence_penalty or self.host_scores)

    @property
    def host_scores(self) -> bool:
        """The logits are changed in ways only the host sampler does (frequency penalty,
        logit bias): every pick is made there."""
        return bool(self.frequency_penalty or self.logit_bias)


def _refuse(message: str) -> None:
    raise SettingOutOfRange(f"sampling setting out of range: {message}")


def _set(params: SamplingParams, name: str, value: Any) -> None:
    object.__setattr__(params, name, value)  # a frozen dataclass's setting, normalised


def whole_number(name: str, value: Any, bound: str, negative: bool = False) -> int:
    """`value` as an int where it is a whole number (any integer type, not a bool) and,
    unless `negative`, not below 0; else SettingOutOfRange naming `name` and `bound`."""
    if isinstance(value, int | np.integer) and not isinstance(value, bool):
        if negative or value >= 0:
            return int(value)
    _refuse(f"{name} {quoted(value, 80)} must be a whole number{bound}")
    raise AssertionError  # (unreached: _refuse raises)


def _bias_pairs(bias: Any) -> tuple[tuple[int, float], ...]:
    """`logit_bias` as ((token id, bias), ...): from pairs in their order, or from a dict
    {token id: bias} sorted by id. Negative ids and NaN biases are refused afterwards."""
    pairs = list(bias.items()) if isinstance(bias, dict) else bias
    shape = "logit_bias must hold (token id, bias) pairs (or be a dict {token id: bias})"
    try:
        pairs = [tuple(pair) for pair in pairs]
    except TypeError:
        pairs = [()]
    if isinstance(bias, str | bytes) or any(len(pair) != 2 for pair in pairs):
        _refuse(f"{shape}, not {quoted(bias, 80)}")
    out = []
    for token, value in pairs:
        token = whole_number("logit_bias token id", token, "", negative=True)
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            _refuse(f"logit_bias value {quoted(value, 80)} for token {token} must be a number")
        try:
            value = float(value)
        except OverflowError:  # an int past float's range: as far as a float goes
            value = math.copysign(math.inf, value)
        out.append((token, value))
    return tuple(sorted(out) if isinstance(bias, dict) else out)


MAX_TOP_LOGPROBS = 20  # alternatives a token's log-probabilities may list (as OpenAI's API)


class TokenLogprobs(NamedTuple):
    """A picked token's log-probability under the model, and the `top` most likely tokens
    at that step with theirs ((id, logprob), most likely first)."""

    logprob: float
    top: tuple[tuple[int, float], ...]


def token_logprobs(logits: np.ndarray, token: int, top: int, vocab_rows: int) -> TokenLogprobs:
    """The model's log-probabilities at one step: a log-softmax of the raw logits over the
    real vocabulary in float64, before temperature, penalties, top-k / top-p or a grammar
    (what the model itself gives each token, however the token was then drawn)."""
    x = np.asarray(logits[:vocab_rows], dtype=np.float64)
    peak = x.max()
    lse = peak + np.log(np.exp(x - peak).sum())
    alts: tuple[tuple[int, float], ...] = ()
    if top > 0:
        k = min(top, x.size)
        ids = np.argpartition(-x, k - 1)[:k]
        ids = ids[np.lexsort((ids, -x[ids]))]  # most likely first, ties by id
        alts = tuple((int(i), float(x[i] - lse)) for i in ids)
    return TokenLogprobs(float(x[token] - lse), alts)


_F32_MAX = float(np.finfo(np.float32).max)


def _shift(x: np.ndarray, ids: Any, amount: Any) -> None:
    """`x[ids] += amount` in float32, held within float32's finite range: a huge penalty or
    bias moves a token as far as float32 goes, never to an infinity (two of which would
    make NaN once the largest score is taken off)."""
    with np.errstate(over="ignore"):
        moved = x[ids] + amount
    x[ids] = np.clip(moved, -_F32_MAX, _F32_MAX)


class Draw(NamedTuple):
    """One row's draw on the device (`sample_rows`): top-k, temperature, top-p, one seeded
    draw; `penalty` off the logits of the ids the slot's bitmap marks (the reply so far),
    after clearing it (`clear`) and marking `mark`. The draw marks its own pick."""

    temperature: float
    top_k: int
    top_p: float
    seed: int
    penalty: float = 0.0
    slot: int = 0
    mark: tuple[int, ...] = ()
    clear: bool = False


class Sampler:
    """One request's sampler: owns its random generator so a seed reproduces a reply."""

    # The presence penalty on the device (`Draw.penalty`, a bitmap of the reply). Off: a
    # request with a penalty samples on the host (tests compare the two paths).
    device_penalty = True

    def __init__(
        self,
        params: SamplingParams,
        vocab_rows: int,
        constraint: Any = None,
        logprobs: int | None = None,
    ):
        self.params = params
        self.vocab_rows = vocab_rows
        self.rng = np.random.default_rng(params.seed)
        self._marked: int | None = None  # ids of the reply the device bitmap holds
        # engine.constraint.Constraint: the tokens a grammar allows (then on the host only)
        self.constraint = constraint
        # Each pick's log-probabilities with this many alternatives (None: not asked; then on
        # the host only), the latest in `last`.
        self.logprobs = logprobs
        self.last: TokenLogprobs | None = None

    @property
    def host_only(self) -> bool:
        """Every pick is made here, from the logits on the host: a grammar holds the reply,
        or each pick's log-probabilities are asked for, or the logits are changed in ways
        the device's draw does not (`SamplingParams.host_scores`)."""
        return self.constraint is not None or self.logprobs is not None or self.params.host_scores

    @property
    def takes_argmax(self) -> bool:
        """The decode step's own argmax is this sampler's pick."""
        return self.params.takes_argmax and not self.host_only

    def __call__(self, logits: np.ndarray, generated: Iterable[int] = ()) -> int:
        """Pick one token id from `logits [V]` given the ids generated so far."""
        x = self._scores(logits, generated)
        if self.params.is_greedy:
            token = int(np.argmax(x))
        else:
            cand, probs = self._candidates(x)
            token = int(cand[self.rng.choice(probs.size, p=probs)])
        if self.logprobs is not None:
            self.last = token_logprobs(logits, token, self.logprobs, self.vocab_rows)
        return token

    def distribution(self, logits: np.ndarray, generated: Iterable[int] = ()) -> np.ndarray:
        """The probabilities `__call__` draws from, over the real vocabulary `[vocab_rows]`
        float64 (greedy: all of it on the argmax). Speculative sampling (engine.speculative)
        compares the target's and the draft's."""
        x = self._scores(logits, generated)
        out = np.zeros(x.size, np.float64)
        if self.params.is_greedy:
            out[int(np.argmax(x))] = 1.0
            return out
        cand, probs = self._candidates(x)
        out[cand] = probs
        return out

    def _scores(self, logits: np.ndarray, generated: Iterable[int]) -> np.ndarray:
        """The logits over the real vocabulary, less the penalties, plus the bias."""
        p = self.params
        if not isinstance(generated, Sequence):  # read more than once below
            generated = list(generated)
        # A float32 copy, padding dropped (logits arrive as float32 or narrower, so nothing is
        # rounded); the probabilities below are computed in float64 on the candidates.
        x = np.array(logits[: self.vocab_rows], dtype=np.float32)
        counted = generated  # what the penalties count: the reply's earlier part too
        if p.earlier and (p.presence_penalty or p.frequency_penalty):
            counted = [*p.earlier, *generated]
        if p.presence_penalty:
            seen = np.fromiter(set(counted), dtype=np.int64)
            seen = seen[seen < self.vocab_rows]
            _shift(x, seen, -p.presence_penalty)
        if p.frequency_penalty:
            ids, counts = np.unique(np.fromiter(counted, dtype=np.int64), return_counts=True)
            inside = ids < self.vocab_rows
            with np.errstate(over="ignore"):
                amounts = (p.frequency_penalty * counts[inside]).astype(np.float32)
            _shift(x, ids[inside], -amounts)
        for token, bias in p.logit_bias:
            if token < self.vocab_rows:
                _shift(x, token, bias)
        if self.constraint is not None:
            self.constraint.mask(x, generated)  # type: ignore[arg-type]
        return x

    def _candidates(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ids that can be drawn, their probabilities) after temperature, top-k, min-p and
        top-p."""
        p = self.params
        # Only the top_k candidates (ties at the k-th value kept) can be drawn, so the rest of
        # the work runs on them: a 248K vocabulary costs one partition, not a sort.
        if 0 < p.top_k < x.size:
            kth = np.partition(x, -p.top_k)[-p.top_k]
            cand = np.flatnonzero(x >= kth)
        else:
            cand = np.arange(x.size)
        xc = x[cand].astype(np.float64)
        with np.errstate(over="ignore"):
            scaled = xc / p.temperature
        peak, top = scaled.max(), xc.max()
        if np.isfinite(peak):
            probs = np.exp(scaled - peak)
        elif np.isfinite(top):
            # x / temperature overflowed (a temperature near 0): the largest score taken off
            # first, (x - top) <= 0 cannot reach +inf, and every score below the largest goes
            # to -inf: greedy among the maxima, the limit, never inf - inf = NaN.
            with np.errstate(over="ignore"):
                probs = np.exp((xc - top) / p.temperature)
        else:  # +inf logits, or every candidate at -inf: an even draw among those at `top`
            probs = (xc == top).astype(np.float64)
        probs /= probs.sum()
        if p.min_p > 0:
            probs[probs < p.min_p * probs.max()] = 0.0
        if p.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            cumulative = np.cumsum(probs[order])
            # Keep the smallest prefix whose mass reaches top_p (always at least one token).
            keep = int(np.searchsorted(cumulative, p.top_p * cumulative[-1])) + 1
            mask = np.zeros_like(probs, dtype=bool)
            mask[order[:keep]] = True
            probs[~mask] = 0.0
        probs /= probs.sum()
        return cand, probs

    @property
    def on_device(self) -> bool:
        """Whether the device's sampler does what this one does: top-k (at most 1024 of
        them), temperature, top-p and the presence penalty, or greedy with a penalty (top-k
        1); not min-p. (Plain greedy takes the step's own argmax.)"""
        p = self.params
        if self.host_only:
            return False
        if p.min_p > 0 or (p.presence_penalty and not self.device_penalty):
            return False
        return bool(p.presence_penalty) if p.is_greedy else 0 < p.top_k <= 1024

    def device_draw(self, generated: Sequence[int], slot: int) -> Draw:
        """The next draw on the device for the stream in `slot`, whose reply so far is
        `generated`. The seed comes from this request's generator, so a seeded request still
        repeats itself; with a presence penalty, the ids the slot's bitmap lacks are marked
        (all of them, after a clear, on the request's first device draw)."""
        p = self.params
        seed = int(self.rng.integers(1 << 62))
        # Within float32's range, as on the host (`_shift`): the device reads it as float32.
        penalty = min(max(p.presence_penalty, -_F32_MAX), _F32_MAX)
        mark, clear = (), False
        if p.presence_penalty:
            clear = self._marked is None
            mark = tuple(int(t) for t in generated[0 if clear else self._marked :])
            mark = (*p.earlier, *mark) if clear else mark
            self._marked = len(generated) + 1  # the draw marks its own pick
        if p.is_greedy:
            return Draw(1.0, 1, 1.0, seed, penalty, slot, mark, clear)
        return Draw(p.temperature, p.top_k, p.top_p, seed, penalty, slot, mark, clear)
