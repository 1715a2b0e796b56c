"""Which route a prompt's 4-bit product takes (W4Route), decided without a GPU: the setting,
and in `auto` the fixed and per-row costs warm-up measured for each matrix shape."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.cuda.w4_mma import ENV_W4, W4Route
from engine.errors import ConfigError


class _W:
    shape, blocked = (2560, 9216), True


def _route(monkeypatch, mode: str) -> W4Route:
    monkeypatch.setenv(ENV_W4, mode)
    route = W4Route(None)
    monkeypatch.setattr(route, "applies", lambda x, w, out: True)
    return route


def test_the_setting_is_read_and_a_wrong_one_named(monkeypatch):
    monkeypatch.setenv(ENV_W4, "maybe")
    with pytest.raises(ConfigError, match="SNUG_W4_MMA='maybe'.*auto, on or off"):
        W4Route(None)
    x = np.zeros((512, 9216), np.float16)
    assert _route(monkeypatch, "on").wants(x, _W(), None, None)
    assert not _route(monkeypatch, "off").wants(x, _W(), None, None)


def test_auto_takes_the_route_its_fitted_costs_say_is_faster(monkeypatch):
    route = _route(monkeypatch, "auto")
    x = np.zeros((512, 9216), np.float16)
    assert not route.wants(x, _W(), None, None)  # a shape warm-up did not time: cuBLAS
    # w4_mma 20 us + 0.4 us a row; dequantize + cuBLAS 200 us + 0.06 us a row: w4_mma up to
    # about 529 rows
    route.fits[((2560, 9216), True)] = (20e-6, 0.4e-6, 200e-6, 0.06e-6)
    assert route.wants(x, _W(), None, None)
    assert not route.wants(np.zeros((2048, 9216), np.float16), _W(), None, None)
