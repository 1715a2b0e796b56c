"""A Responses reply cut by `max_output_tokens`: the response is "incomplete" with the
reason, and so is the message item that was cut, as OpenAI marks it (the `openai` client's
ResponseOutputMessage.status: in_progress, completed or incomplete), in the response and in
its stream's `response.output_item.done` and `response.incomplete` events."""

from __future__ import annotations

OFF = {"effort": "none"}  # no thinking block
LONG = "One two three four five six seven eight nine ten eleven twelve."


def test_a_message_cut_by_the_limit_is_incomplete(scripted):
    scripted.scheduler.say(LONG)
    reply = scripted.client().responses.create(
        model=scripted.model, input="Count", reasoning=OFF, max_output_tokens=4
    )
    assert reply.status == "incomplete"
    assert reply.incomplete_details.reason == "max_output_tokens"
    (message,) = reply.output
    assert message.type == "message" and message.status == "incomplete"
    assert LONG.startswith(message.content[0].text) and message.content[0].text != LONG


def test_a_message_that_ends_is_completed(scripted):
    scripted.scheduler.say("Done.")
    reply = scripted.client().responses.create(
        model=scripted.model, input="Count", reasoning=OFF, max_output_tokens=64
    )
    assert reply.status == "completed" and reply.output[0].status == "completed"


def test_the_stream_marks_the_cut_item_incomplete(scripted):
    client = scripted.client()
    scripted.scheduler.say(LONG)
    with client.responses.stream(
        model=scripted.model, input="Count", reasoning=OFF, max_output_tokens=4
    ) as s:
        events = list(s)  # (the client's get_final_response wants response.completed)
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [item.status for item in done] == ["incomplete"]
    final = events[-1].response
    assert events[-1].type == "response.incomplete" and final.status == "incomplete"
    assert final.output[-1].status == "incomplete"
    # The kept response's stream again says the same.
    with client.responses.retrieve(final.id, stream=True) as again:
        replayed = [e.item for e in again if e.type == "response.output_item.done"]
    assert [item.status for item in replayed] == ["incomplete"]
