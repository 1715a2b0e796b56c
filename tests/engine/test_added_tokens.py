"""Added tokens as transformers' AutoTokenizer completes them from tokenizer_config.json.

A fine-tune may list a token only in tokenizer_config.json's `added_tokens_decoder`, change
its flags there, or name a special token (a new `bos_token`, `additional_special_tokens`)
that tokenizer.json lacks; transformers then makes each one token, where tokenizer.json
alone splits it into pieces. Snug's ids, decoded text and skipped specials must be
transformers' for the same folder.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine.errors import TokenizerError
from engine.testing.tiny import write_tokenizer
from engine.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")

PUBLISHED = Path(__file__).resolve().parents[1] / "fixtures" / "published"
TEXTS = (
    "hi <think>x</think> <|tool|> a<|bos|>b <extra_0> done",
    "a<x1>b<x2> <img> <foo>hi",
    "<n>x<|bos|> hi there",
)


def token(content: str, special: bool = True, **flags: bool) -> dict:
    entry = {"content": content, "special": special, "normalized": not special}
    return entry | {"lstrip": False, "rstrip": False, "single_word": False} | flags


def model_folder(root: Path, config: dict, drop: tuple[str, ...] = ()) -> Path:
    """A Qwen3.5 model folder (a published config.json) with the tiny tokenizer: `drop`
    taken out of tokenizer.json's added tokens, `config` merged into tokenizer_config.json
    (`added_tokens_decoder` entries added to its own)."""
    root.mkdir(parents=True)
    write_tokenizer(root)
    shutil.copy(PUBLISHED / "Qwen3.5-4B-MLX-4bit.config.json", root / "config.json")
    path = root / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] not in drop]
    path.write_text(json.dumps(data), encoding="utf-8")
    path = root / "tokenizer_config.json"
    tok_config = json.loads(path.read_text(encoding="utf-8"))
    for key, value in config.items():
        if key == "added_tokens_decoder":
            tok_config[key].update(value)
        else:
            tok_config[key] = value
    path.write_text(json.dumps(tok_config), encoding="utf-8")
    return root


CASES = {
    "listed only in the config": ({}, ("<think>",)),
    "listed only in the config, generic class": (
        {"tokenizer_class": "PreTrainedTokenizerFast"},
        ("<think>",),
    ),
    "a new plain token": ({"added_tokens_decoder": {"405": token("<|tool|>", False)}}, ()),
    "a new special token past a gap": ({"added_tokens_decoder": {"410": token("<|tool|>")}}, ()),
    "normalized, not special": (
        {"added_tokens_decoder": {"405": token("<n>", False, normalized=True)}},
        (),
    ),
    "flags changed in the config": (
        {"added_tokens_decoder": {"403": token("<think>", lstrip=True, rstrip=True)}},
        (),
    ),
    "a new bos_token": ({"bos_token": "<|bos|>"}, ()),
    "a bos_token from the vocabulary": ({"bos_token": "hi"}, ()),
    "another named token": ({"foo_token": "<foo>"}, ()),
    "model-specific tokens": ({"model_specific_special_tokens": {"img_token": "<img>"}}, ()),
    "extra special tokens, a map": ({"extra_special_tokens": {"img_token": "<img>"}}, ()),
    "extra special tokens, a list": ({"extra_special_tokens": ["<extra_0>"]}, ()),
    "additional special tokens": ({"additional_special_tokens": ["<x1>", "<x2>"]}, ()),
}


@pytest.mark.parametrize("case", CASES)
def test_added_tokens_are_transformers(tmp_path, case) -> None:
    config, drop = CASES[case]
    root = model_folder(tmp_path / "model", config, drop)
    hf = transformers.AutoTokenizer.from_pretrained(str(root))
    snug = Tokenizer.load(root)
    for text in TEXTS:
        ids = hf.encode(text, add_special_tokens=False)
        assert snug.encode(text) == ids, text
        assert snug.decode(ids) == hf.decode(ids)
        assert snug.decode(ids, skip_special_tokens=True) == hf.decode(
            ids, skip_special_tokens=True
        )
    assert snug.vocab_size == len(hf)


def test_a_token_only_in_the_config_is_one_token_and_stops(tmp_path) -> None:
    """Without the config's map, `<think>` would be four pieces and an eos named only in the
    config would never stop a reply."""
    root = model_folder(tmp_path / "model", {"eos_token": "<|stop|>"}, ("<think>",))
    snug = Tokenizer.load(root)
    assert snug.encode("<think>") == [snug.token_to_id("<think>")]
    assert snug.token_to_id("<|stop|>") in snug.eos_ids


def test_a_folder_that_agrees_is_read_once(tmp_path, monkeypatch) -> None:
    """tokenizer.json is parsed again only where the config changes its added tokens."""
    import engine.tokenizer_files as files

    calls: list[Path] = []
    monkeypatch.setattr(files, "_rebuilt", lambda path, declared: calls.append(path))
    Tokenizer.load(model_folder(tmp_path / "model", {}))
    assert calls == []


@pytest.mark.parametrize(
    ("decoder", "named"),
    [
        (["<a>"], "added_tokens_decoder"),
        ({"x": token("<a>")}, "'x'"),
        ({"-1": token("<a>")}, "'-1'"),
        ({"405": "<a>"}, "'405'"),
        ({"405": {"special": True}}, "content"),
        ({"405": token("")}, "content"),
    ],
)
def test_a_broken_added_tokens_decoder_is_named(tmp_path, decoder, named) -> None:
    root = tmp_path / "model"
    root.mkdir()
    write_tokenizer(root)
    path = root / "tokenizer_config.json"
    tok_config = json.loads(path.read_text(encoding="utf-8"))
    tok_config["added_tokens_decoder"] = decoder
    path.write_text(json.dumps(tok_config), encoding="utf-8")
    with pytest.raises(
        TokenizerError, match=r"tokenizer_config\.json \[added_tokens_decoder"
    ) as err:
        Tokenizer.load(root)
    assert named in str(err.value)
