"""One admission route: the load panel's preview of a catalog entry, its preview once
downloaded, `snug plan`, and `Engine.load` reach the same Decision from the same bytes."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import engine.session as session
from app import planning
from app.paths import resource
from engine.backends.numpy_backend import NumpyBackend
from engine.config import GIB, EngineSettings
from engine.errors import DoesNotFit
from engine.memory import SimulatedPool
from engine.session import Engine
from engine.testing.synth import write_checkpoint
from engine.testing.tiny import write_tokenizer

CATALOG = json.loads(resource("catalog.json").read_text())
MODELS = [(m["shape"], m["format"]) for m in CATALOG["models"]]
CARD, OTHERS = 8 * GIB, GIB // 2  # an 8 GiB card with half a GiB held by the desktop


class _Loaded(Exception):
    """Stops a load once admission has decided (nothing is uploaded in these tests)."""


class CardProbe(NumpyBackend):
    """A backend on a simulated card: Engine.load plans against its pool, as on a GPU."""

    def __init__(self, settings):
        super().__init__(settings)
        self.pool = SimulatedPool(CARD, other_used=OTHERS, limit=settings.limit_bytes)
        self.decision = None

    @property
    def act_itemsize(self) -> int:
        return 2  # bf16 activations, as the CUDA backend under the default settings

    def fused_prefill_attention(self, config) -> bool:
        return True  # as the CUDA backend on an sm_86 card

    def configure(self, decision, vocab_rows):
        self.decision = decision
        raise _Loaded


def _load_decision(model_dir, settings, monkeypatch, **kw):
    probes = []

    def select(s, rows, config=None):
        probes.append(CardProbe(s))
        return probes[-1]

    monkeypatch.setattr(session, "select_backend", select)
    try:
        Engine.load(model_dir, settings, **kw)
    except _Loaded:
        return probes[-1].decision
    except DoesNotFit as exc:
        return exc.decision
    raise AssertionError("the load went past admission")


@pytest.mark.parametrize("limit_gib", [None, 4.0, 3.0])
@pytest.mark.parametrize(("shape", "fmt"), MODELS)
def test_preview_equals_load_for_every_catalog_model(tmp_path, monkeypatch, shape, fmt, limit_gib):
    settings = EngineSettings().with_gib(limit=limit_gib)
    gpu = planning.Gpu("simulated", total_bytes=CARD, free_bytes=CARD - OTHERS, capability=86)
    sizes = dict(context=8192, streams=1, max_rows=512)
    config = planning.shape_config(shape, fmt, 64, CATALOG["shapes"].get(shape))
    catalog = planning.plan(gpu=gpu, settings=settings, shape=(config, fmt, 64), **sizes)

    model_dir = write_checkpoint(tmp_path / "model", shape, fmt, headers_only=True)
    write_tokenizer(model_dir)
    downloaded = planning.plan(gpu=gpu, settings=settings, model_dir=str(model_dir), **sizes)
    loaded = _load_decision(model_dir, settings, monkeypatch, **sizes)

    assert not isinstance(catalog, planning.PlanProblem), catalog
    # The reason names the model as its config does: the shape's name, the file's path.
    named = [(catalog, config.source), (downloaded, str(model_dir / "config.json"))]
    named.append((loaded, str(model_dir / "config.json")))
    same = [replace(d, reason=d.reason.replace(source, "MODEL")) for d, source in named]
    assert same[0] == same[1] == same[2]
    assert loaded.breakdown.weights > 0


def test_largest_context_is_the_same_on_both_routes(tmp_path, monkeypatch):
    """context None (the largest the card admits at the fastest chunks): the load and
    `snug plan` agree."""
    from engine.cli_plan import card_table

    settings = EngineSettings().with_gib(limit=4.0)
    model_dir = write_checkpoint(tmp_path / "model", "4B", "mlx4", headers_only=True)
    write_tokenizer(model_dir)
    loaded = _load_decision(model_dir, settings, monkeypatch, context=None)
    rows = card_table(CARD, CARD - OTHERS, settings)
    row = next(r for r in rows if (r["shape"], r["format"]) == ("4B", "mlx4"))
    assert loaded.fits and loaded.context == row["fastest_chunks_context"]
    assert row["largest_context"] >= loaded.context
