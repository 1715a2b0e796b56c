"""Which decode graph a step launches (`DecodeGraphs._pick`), worked out without a GPU: the
graph for short rows while every row holds at most `short_limit()` keys, the full one after,
and only the full one where the context admits no more splits than the short graph has."""

from __future__ import annotations

import numpy as np

from engine.backends.base import Batch
from engine.backends.cuda.graphs import SHORT_SPLITS, DecodeGraphs, _Captured


class _Graph:
    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log

    def launch(self, stream) -> None:
        self.log.append(self.name)


class _Backend:
    def __init__(self, context: int) -> None:
        self.state = type("State", (), {"context": context})()
        self.stream = type("S", (), {"use": lambda self: None})()
        self.graphs = None

    def write_batch(self, batch, ids) -> None:
        pass


def _graphs(context: int, with_short: bool) -> tuple[DecodeGraphs, list]:
    log: list = []
    g = DecodeGraphs(_Backend(context), model=None)
    short = _Captured(_Graph("short", log), None, None) if with_short else None
    g.graphs[2] = _Captured(_Graph("full", log), None, None, short)
    return g, log


def test_short_rows_take_the_short_graph_until_the_longest_row_passes_the_limit():
    g, log = _graphs(8200, True)
    limit = g.short_limit()
    assert limit == 32 * SHORT_SPLITS == 1024
    # rows at positions limit - 3 and 10: the longest holds limit - 2 keys with the new one
    g.replay(Batch.step([(0, limit - 3), (1, 10)]), np.zeros(2, np.int32))
    for _ in range(4):
        g.replay_next(2)
    assert log == ["short"] * 3 + ["full"] * 2
    g.replay(Batch.step([(0, 5), (1, 6)]), np.zeros(2, np.int32))  # a new pair of streams
    assert log[-1] == "short"


def test_a_small_context_has_one_graph_for_every_row():
    g, log = _graphs(600, False)
    assert g.short_limit() == 0  # 19 splits at most: the short graph would be the same
    g.replay(Batch.step([(0, 3), (1, 4)]), np.zeros(2, np.int32))
    g.replay_next(2)
    assert log == ["full", "full"]
