"""engine.tokenizer on a tiny byte-level BPE trained in the test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from engine.errors import TemplateError, TokenizerError
from engine.tokenizer import StreamDecoder, Tokenizer

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
CORPUS = [
    "hello world, this is a tiny corpus for a tiny tokenizer.",
    "the assistant answers the user; the user asks the assistant.",
    "numbers 12345 and words words words",
] * 20

CHATML = """\
{%- for message in messages %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}
{{- '<think>\\n\\n</think>\\n\\n' }}
{%- else %}
{{- '<think>\\n' }}
{%- endif %}
{%- endif %}
"""

MESSAGES = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hi 👋 你好"},
]
MIXED = "hello 👋🏽 world 你好，世界 😀 café naïve 🇯🇵 done"


def build_tokenizer(folder: Path) -> HFTokenizer:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(folder / "tokenizer.json"))
    return tok


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    build_tokenizer(tmp_path)
    (tmp_path / "chat_template.jinja").write_text(CHATML)
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
    )
    return tmp_path


def test_encode_decode_round_trip(model_dir):
    tok = Tokenizer.load(model_dir)
    for text in ("hello world", MIXED, "", "  spaces\n\nand lines\t"):
        assert tok.decode(tok.encode(text)) == text
    ids = tok.encode("<|im_start|>user")
    assert ids[0] == tok.token_to_id("<|im_start|>")  # special tokens match whole
    assert (
        tok.vocab_size
        == max(HFTokenizer.from_file(str(model_dir / "tokenizer.json")).get_vocab().values()) + 1
    )


def test_eos_ids(model_dir):
    tok = Tokenizer.load(model_dir, eos_token_ids=[0, 0])
    im_end, eot = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    assert eot == 0
    assert tok.eos_ids == (0, im_end)


def test_chatml_rendering(model_dir):
    tok = Tokenizer.load(model_dir)
    head = "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi 👋 你好<|im_end|>\n"
    assert tok.apply_chat_template(MESSAGES) == head + "<|im_start|>assistant\n<think>\n"
    assert tok.apply_chat_template(MESSAGES, enable_thinking=True) == (
        head + "<|im_start|>assistant\n<think>\n"
    )
    assert tok.apply_chat_template(MESSAGES, enable_thinking=False) == (
        head + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert tok.apply_chat_template(MESSAGES, add_generation_prompt=False) == head
    ids = tok.chat_ids(MESSAGES, enable_thinking=False)
    assert ids == tok.encode(tok.apply_chat_template(MESSAGES, enable_thinking=False))
    assert ids.count(tok.token_to_id("<|im_start|>")) == 3
    assert tok.token_to_id("</think>") in ids


def test_template_from_tokenizer_config_and_helpers(tmp_path):
    build_tokenizer(tmp_path)
    template = (
        "{% if messages[0].role != 'user' %}{{ raise_exception('no user message') }}{% endif %}"
        "{% generation %}{{ messages[0] | tojson }}{% endgeneration %}"
    )
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    tok = Tokenizer.load(tmp_path)
    out = tok.apply_chat_template([{"role": "user", "content": "你好"}])
    assert json.loads(out) == {"role": "user", "content": "你好"} and "你好" in out
    with pytest.raises(
        TemplateError, match=r"tokenizer_config\.json \[chat_template\].*no user message"
    ):
        tok.apply_chat_template([{"role": "system", "content": "only"}])


def test_stream_decoder_multibyte(model_dir):
    tok = Tokenizer.load(model_dir)
    ids = tok.encode(MIXED)
    # The tiny vocabulary splits emoji and CJK into byte tokens: the case under test.
    assert any("\ufffd" in tok.decode([i]) for i in ids)
    stream = StreamDecoder(tok)
    pieces = [stream.push(i) for i in ids]
    pieces.append(stream.flush())
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == tok.decode(ids) == MIXED
    assert sum(1 for p in pieces if p) > 10  # text flows token by token, not at the end


def test_stream_decoder_special_and_invalid_bytes(model_dir):
    tok = Tokenizer.load(model_dir)
    ids = tok.encode("<think>\nok</think>\n\nanswer 你<|im_end|>")
    stream = StreamDecoder(tok)
    text = "".join(stream.push(i) for i in ids) + stream.flush()
    assert text == tok.decode(ids)
    # A lone continuation byte is really invalid: it comes out at the latest on flush.
    lone = tok.encode("你")[-1:]
    stream = StreamDecoder(tok)
    assert stream.push(lone[0]) == ""
    assert stream.flush() == tok.decode(lone)


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ cycler.__init__.__globals__ }}",
        "{{ messages.append(1) }}",
    ],
)
def test_sandbox_escape_refused(model_dir, template):
    (model_dir / "chat_template.jinja").write_text(template)
    tok = Tokenizer.load(model_dir)
    with pytest.raises(TemplateError, match=r"chat_template\.jinja: .*sandbox"):
        tok.apply_chat_template(MESSAGES)


def test_bad_template_syntax(model_dir):
    (model_dir / "chat_template.jinja").write_text("{% for m in messages %}")
    tok = Tokenizer.load(model_dir)
    with pytest.raises(TemplateError, match=r"chat_template\.jinja: line 1: .*not valid Jinja"):
        tok.apply_chat_template(MESSAGES)


def test_missing_tokenizer_json(tmp_path):
    with pytest.raises(TokenizerError, match=r"tokenizer\.json: tokenizer\.json not found"):
        Tokenizer.load(tmp_path)


def test_missing_chat_template(tmp_path):
    build_tokenizer(tmp_path)
    tok = Tokenizer.load(tmp_path)
    assert not tok.has_chat_template
    assert tok.decode(tok.encode("raw prompt")) == "raw prompt"
    with pytest.raises(TokenizerError, match="no chat template .*use raw prompts"):
        tok.chat_ids(MESSAGES)
