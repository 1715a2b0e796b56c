"""A reply's settings of the wrong type are refused when they are made, each by its name,
not as a TypeError or IndexError from inside numpy at the first token (or, through the
scheduler, on the engine thread); a params object that is not GenerationParams is refused
before a stream is taken; a dict of logit biases is read as OpenAI's {id: bias}."""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import EngineSettings
from engine.errors import RequestRefused, SettingOutOfRange
from engine.sampling import Sampler, SamplingParams
from engine.scheduler import Scheduler
from engine.session import Engine, GenerationParams


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"temperature": None}, "temperature None must be a number"),
        ({"temperature": "0.7"}, "temperature '0.7' must be a number"),
        ({"top_p": None}, "top_p None must be a number"),
        ({"min_p": "0"}, "min_p '0' must be a number"),
        ({"presence_penalty": None}, "presence_penalty None must be a number"),
        ({"frequency_penalty": [1]}, r"frequency_penalty \[1\] must be a number"),
        ({"top_k": 2.5}, "top_k 2.5 must be a whole number"),
        ({"top_k": None}, "top_k None must be a whole number"),
        ({"top_k": True}, "top_k True must be a whole number"),
        ({"seed": -1}, r"seed -1 must be a whole number >= 0 \(or None"),
        ({"seed": 1.5}, "seed 1.5 must be a whole number"),
        ({"seed": "7"}, "seed '7' must be a whole number"),
        ({"logit_bias": ((3.5, 1.0),)}, "logit_bias token id 3.5 must be a whole number"),
        ({"logit_bias": (("3", 1.0),)}, "logit_bias token id '3' must be a whole number"),
        ({"logit_bias": ((3, "big"),)}, "logit_bias value 'big' for token 3 must be a number"),
        ({"logit_bias": (3, 4)}, r"logit_bias must hold \(token id, bias\) pairs"),
        ({"logit_bias": 5}, r"logit_bias must hold \(token id, bias\) pairs"),
        ({"earlier": (4, -2)}, "earlier token id -2 must be a whole number >= 0"),
        ({"greedy": "yes"}, "greedy 'yes' must be True or False"),
    ],
)
def test_settings_of_the_wrong_type_are_refused_by_name(kwargs, named):
    with pytest.raises(SettingOutOfRange, match=named):
        SamplingParams(**kwargs)
    with pytest.raises(SettingOutOfRange, match=named):
        GenerationParams(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"logprobs": 2.5}, "logprobs 2.5 must be a whole number"),
        ({"logprobs": True}, "logprobs True must be a whole number"),
        ({"grammar": 5}, "grammar 5 must be a grammar's text"),
    ],
)
def test_reply_settings_of_the_wrong_type_are_refused_by_name(kwargs, named):
    with pytest.raises(SettingOutOfRange, match=named):
        GenerationParams(**kwargs)


def test_whole_numbers_of_any_integer_type_are_taken():
    params = GenerationParams(top_k=np.int64(5), seed=np.uint32(3), logprobs=np.int8(2))
    assert (params.top_k, params.seed, params.logprobs) == (5, 3, 2)
    assert GenerationParams(seed=2**70).seed == 2**70  # any size: numpy's generator takes it
    assert SamplingParams(temperature=1, top_p=np.float32(0.5)).top_p == 0.5


def test_logit_bias_as_a_dict_or_a_list_is_kept_as_pairs():
    as_dict = SamplingParams(logit_bias={7: 100.0, 3: -2})
    assert as_dict.logit_bias == ((3, -2.0), (7, 100.0))
    assert SamplingParams(logit_bias=[(7, 100.0), [3, -2]]).logit_bias == ((7, 100.0), (3, -2.0))
    assert hash(as_dict) == hash(SamplingParams(logit_bias={3: -2, 7: 100}))
    favoured = Sampler(SamplingParams(temperature=1.0, seed=1, logit_bias={7: 100.0}), 300)
    x = np.random.default_rng(0).standard_normal(300).astype(np.float32)
    assert {favoured(x) for _ in range(20)} == {7}
    assert SamplingParams(earlier=[4, np.int64(5)]).earlier == (4, 5)


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    return Engine.load(tiny_checkpoint(), EngineSettings(backend="numpy"), context=64)


@pytest.mark.parametrize("params", [{"max_new_tokens": 3}, 3, "greedy"])
def test_params_that_are_not_generation_params_are_refused_before_a_stream(engine, params):
    named = "params must be a GenerationParams"
    with pytest.raises(RequestRefused, match=named):
        next(engine.generate([1, 2, 3], params))
    with pytest.raises(RequestRefused, match=named):
        engine.generate_many([[1, 2, 3]], params)
    scheduler = Scheduler(engine)
    with pytest.raises(RequestRefused, match=named):
        scheduler.submit([1, 2, 3], params)
    assert scheduler.waiting == 0 and engine._free_slots == [0]
    # A SamplingParams (no max_new_tokens) is not a reply's params either.
    with pytest.raises(RequestRefused, match=named):
        next(engine.generate([1, 2, 3], SamplingParams()))
    assert len([e for e in engine.generate([1, 2, 3], GenerationParams(max_new_tokens=2))]) == 2
