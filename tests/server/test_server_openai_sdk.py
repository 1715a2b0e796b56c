"""Request and reply shapes the official `openai` client sends and reads, beyond the common
ones: what its typed parameters allow must be taken, and what its methods call must answer
in the shape the client parses."""

from __future__ import annotations


OFF = {"chat_template_kwargs": {"enable_thinking": False}}


def test_an_assistant_refusal_sent_back_is_read_as_its_words(scripted):
    """The client's assistant message takes `refusal` parts beside text parts, and a reply's
    message carries `refusal` beside a null content (what an earlier reply refused, sent
    back as history): either is read as the assistant's words."""
    for refused in (
        {"content": [{"type": "refusal", "refusal": "I cannot say."}]},
        {"content": None, "refusal": "I cannot say."},
    ):
        history = [
            {"role": "user", "content": "Tell me a secret."},
            {"role": "assistant", **refused},
            {"role": "user", "content": "Fine."},
        ]
        scripted.scheduler.say("Ok.")
        reply = scripted.client().chat.completions.create(
            model=scripted.model, messages=history, extra_body=OFF
        )
        assert reply.choices[0].message.content == "Ok."
        assert "assistant\nI cannot say.<|im_end|>" in scripted.scheduler.last_prompt()
