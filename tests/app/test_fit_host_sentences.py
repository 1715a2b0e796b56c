"""CPU mode's verdict reads like the card's: one token in the singular, numbers grouped by
thousands, and where neither fewer streams nor a shorter context is enough alone, the two
together (checked to fit) before "choose a smaller model"."""

from __future__ import annotations

import re

import pytest

from app.state.host_fit import host_decide
from engine.memory.shapes import shape_config, shape_tensor_specs

GIB = 1 << 30
UNGROUPED = re.compile(r"(?<![\d,.])\d{4,}")  # four digits or more with no comma among them


def _decide(shape, fmt, ram_gib, context, streams):
    config = shape_config(shape, fmt)
    specs = shape_tensor_specs(config, fmt)
    return host_decide(
        specs, config, available=int(ram_gib * GIB), context=context, streams=streams
    )


def test_one_token_reads_in_the_singular():
    d = _decide("0.8B", "mlx4", 8, 1, 1)
    assert d.fits
    assert "at 1 token," in d.reason and "1 tokens" not in d.reason, d.reason


@pytest.mark.parametrize(
    ("shape", "fmt", "ram_gib", "context", "streams"),
    [
        ("0.8B", "mlx4", 4, 262144, 1024),
        ("2B", "mlx4", 4, 262144, 512),
    ],
)
def test_fewer_streams_with_a_shorter_context_is_suggested_and_fits(
    shape, fmt, ram_gib, context, streams
):
    d = _decide(shape, fmt, ram_gib, context, streams)
    assert not d.fits
    assert _decide(shape, fmt, ram_gib, 256, 1).fits  # this model runs here
    assert "choose a smaller model" not in d.suggestions, d.suggestions
    both = [t for t in d.suggestions if t.startswith("use ") and " with a context of " in t]
    assert both, d.suggestions
    words = both[0].replace(",", "").split()  # "use N streams with a context of C tokens"
    n, ctx = int(words[1]), int(words[-2])
    assert n < streams and ctx < context
    assert _decide(shape, fmt, ram_gib, ctx, n).fits, both[0]
    assert not _decide(shape, fmt, ram_gib, ctx, n + 1).fits, both[0]  # the most streams
    for text in (d.reason, *d.suggestions):
        assert not UNGROUPED.search(text), text  # "6,780.6 GiB", "1,024 streams"
