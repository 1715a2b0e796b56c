"""A drafting round's graphs (the verify, the MTP head), worked out without a GPU (forwards that
record their calls, captures that record what they captured): the first of a (slot, rows) runs
eagerly and captures its graph, later ones replay it. On the GPU the same path runs in
tests/device/test_mtp.py."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from engine.backends.base import Batch
from engine.backends.cuda.graphs import DecodeGraphs, _Captured


class _Graph:
    def __init__(self, log: list) -> None:
        self.log = log

    def launch(self, stream) -> None:
        self.log.append("replay")


def test_the_first_verify_runs_eagerly_then_replays_its_graph():
    log: list = []
    rows_kept: list = []
    be = SimpleNamespace(graphs=None, stream=SimpleNamespace(use=lambda: None))
    be.write_batch = lambda batch, ids: log.append(("ids", list(ids)))
    be.verify_rows = SimpleNamespace(record=rows_kept.append)
    model = SimpleNamespace(hidden=None)

    def forward(batch, ids, all_logits=False, hidden=False):
        log.append(("eager", list(ids)))
        model.hidden = "eager hidden"
        return "eager logits"

    model.forward = forward
    graphs = DecodeGraphs(be, model)
    captured: list = []

    def capture_verify(slot, rows):
        captured.append((slot, rows))
        return _Captured(_Graph(log), "graph logits", None, hidden="graph hidden")

    graphs._capture_verify = capture_verify
    batch = Batch.verify(0, 10, 3)
    first = graphs.verify(batch, np.array([1, 2, 3]))
    assert first == ("eager logits", "eager hidden")
    assert captured == [(0, 3)] and log == [("eager", [1, 2, 3])]
    second = graphs.verify(Batch.verify(0, 13, 3), np.array([4, 5, 6]))
    assert second == ("graph logits", "graph hidden") and model.hidden == "graph hidden"
    assert log[1:] == [("ids", [4, 5, 6]), "replay"] and len(rows_kept) == 1
    assert captured == [(0, 3)]  # one capture for the (slot, rows)


def test_the_heads_first_forward_runs_eagerly_then_replays_with_its_hidden_states():
    log: list = []
    be = SimpleNamespace(graphs=None, stream=SimpleNamespace(use=lambda: None), draft_tokens=3)
    be.write_batch = lambda batch, ids: log.append(("ids", list(ids)))
    be.filled = lambda ids, fill: ids
    graphs = DecodeGraphs(be, SimpleNamespace(hidden=None))
    head = SimpleNamespace(hidden=None)

    def forward(batch, ids, hidden, logits_rows):
        log.append(("eager", list(ids)))
        return "eager logits"

    head.forward = forward
    inputs = np.zeros((2, 4), np.float32)
    graphs._capture_head = lambda head, key, like: _Captured(
        _Graph(log), "graph logits", None, hidden="graph hidden", inputs=inputs
    )
    batch = Batch.window(0, 20, 2)
    hidden = np.ones((2, 4), np.float32)
    assert graphs.head(head, batch, np.array([7, 8]), hidden, [1], None) == "eager logits"
    assert list(graphs.heads) == [(0, 2, True)]
    again = graphs.head(head, Batch.window(0, 22, 2), np.array([9, 10]), hidden * 2, [1], None)
    assert again == "graph logits" and head.hidden == "graph hidden"
    assert np.array_equal(inputs, hidden * 2)  # the replay reads the new hidden states
    assert log == [("eager", [7, 8]), ("ids", [9, 10]), "replay"]
