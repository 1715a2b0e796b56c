"""Files sent inside a request (OpenAI's `file` part, the Responses API's `input_file`, the
Messages API's `document`), through each API's own client: read as files attached to the
message (engine/attachments.py), each fenced under its name before the text; files the
model cannot read, or that the server would have to fetch, refused by name."""

from __future__ import annotations

import base64

import httpx
import pytest

from engine.testing.documents import text_pdf
from tests.server.conftest import KEY

PDF = base64.b64encode(text_pdf(["Quarterly totals: 42"])).decode()
EXPECTED = "File: totals.pdf\n```\nQuarterly totals: 42\n```\n\nWhat is the total?"


def user_turn(prompt: str) -> str:
    return prompt.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]


def test_a_pdf_in_a_chat_file_part(scripted):
    scripted.scheduler.say("42.")
    data = f"data:application/pdf;base64,{PDF}"
    part = {"type": "file", "file": {"filename": "totals.pdf", "file_data": data}}
    text = {"type": "text", "text": "What is the total?"}
    reply = scripted.client().chat.completions.create(
        model=scripted.model, messages=[{"role": "user", "content": [part, text]}],
        max_tokens=8, extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )  # fmt: skip
    assert reply.choices[0].message.content == "42."
    assert user_turn(scripted.scheduler.last_prompt()) == EXPECTED


def test_a_pdf_as_a_responses_input_file(scripted):
    scripted.scheduler.say("42.")
    content = [
        {"type": "input_file", "filename": "totals.pdf",
         "file_data": f"data:application/pdf;base64,{PDF}"},
        {"type": "input_text", "text": "What is the total?"},
    ]  # fmt: skip
    reply = scripted.client().responses.create(
        model=scripted.model, input=[{"role": "user", "content": content}],
        reasoning={"effort": "none"},
    )  # fmt: skip
    assert reply.output_text == "42."
    assert user_turn(scripted.scheduler.last_prompt()) == EXPECTED


def test_documents_in_a_messages_request(scripted):
    anthropic = pytest.importorskip("anthropic")
    scripted.scheduler.say("42.")
    client = anthropic.Anthropic(base_url=scripted.url[: -len("/v1")], api_key=KEY, max_retries=0)
    pdf = {"type": "document", "title": "totals.pdf",
           "source": {"type": "base64", "media_type": "application/pdf", "data": PDF}}  # fmt: skip
    source = {"type": "text", "media_type": "text/plain", "data": "Ann: 12\r\n"}
    note = {"type": "document", "source": source}
    ask = {"type": "text", "text": "What is the total?"}
    reply = client.messages.create(
        model=scripted.model, max_tokens=8, messages=[{"role": "user", "content": [pdf, note, ask]}]
    )
    assert reply.content[0].text == "42."
    assert user_turn(scripted.scheduler.last_prompt()) == (
        "File: totals.pdf\n```\nQuarterly totals: 42\n```\n\n"
        "File: document\n```\nAnn: 12\n```\n\nWhat is the total?"
    )


PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(32)).decode()


@pytest.mark.parametrize(
    ("path", "body", "words"),
    [
        ("/v1/chat/completions",
         {"messages": [{"role": "user", "content": [
             {"type": "file", "file": {"filename": "cat.png", "file_data": PNG}}]}]},
         "cat.png is a PNG image, not text"),
        ("/v1/chat/completions",
         {"messages": [{"role": "user", "content": [
             {"type": "file", "file": {"file_id": "file-abc"}}]}]},
         "keeps no uploaded files"),
        ("/v1/chat/completions",
         {"messages": [{"role": "user", "content": [
             {"type": "file", "file": {"filename": "x.txt", "file_data": "%%%"}}]}]},
         "x.txt: its data is not base64"),
        ("/v1/responses",
         {"input": [{"role": "user", "content": [
             {"type": "input_file", "file_url": "https://example.com/a.pdf"}]}]},
         "fetches nothing"),
        ("/v1/messages",
         {"max_tokens": 8, "messages": [{"role": "user", "content": [
             {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}}]}]},
         "fetches nothing"),
        ("/v1/messages",
         {"max_tokens": 8, "messages": [{"role": "user", "content": [
             {"type": "document", "title": "scan.pdf", "source": {
                 "type": "base64", "media_type": "application/pdf",
                 "data": base64.b64encode(text_pdf([""])).decode()}}]}]},
         "scan.pdf has no text layer"),
    ],
)  # fmt: skip
def test_files_the_model_cannot_read_are_refused_by_name(served, path, body, words):
    headers = {"Authorization": f"Bearer {KEY}", "x-api-key": KEY}
    r = httpx.post(served.base + path, json={"model": served.model, **body}, headers=headers)
    error = r.json()["error"]
    assert r.status_code == 400 and words in error["message"], error
