"""The app over the real engine: a tiny random checkpoint on the numpy backend."""

from __future__ import annotations

import pytest

from app import planning
from app.state.catalog import Entry
from engine.config import EngineSettings


def test_plan_a_local_folder_with_the_real_planner(tiny):
    gpu = planning.Gpu("Test GPU", 4 << 30, 3 << 30)
    decision = planning.plan(
        gpu=gpu,
        settings=EngineSettings(),
        context=2048,
        streams=1,
        max_rows=128,
        model_dir=str(tiny),
    )
    assert planning.verdict_label(decision).startswith("Fits"), decision
    assert planning.breakdown_value(decision, "weights") > 0


def load_tiny(qtbot, window, tiny, max_new_tokens: int) -> dict:
    """The tiny checkpoint loaded through the load panel on the numpy backend, at a
    256-token context, greedy; what the load reported."""
    s = window.ctx.settings
    s.set("engine/backend", "numpy")
    s.set("sampling/max_new_tokens", max_new_tokens)
    s.set("sampling/temperature", 0.0)
    s.set("thinking_sampling/temperature", 0.0)  # greedy with thinking on too
    window.choose(Entry("folder:tiny", "tiny", "", 0, "folder", local_dir=str(tiny)))
    s.set("engine/context", 256)
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=20000) as loaded:
        window.load.load_button.click()
    return loaded.args[0]


def test_load_and_chat_with_the_real_engine(qtbot, make_window, tiny):
    window = make_window()  # no GPU here: the numpy backend, labelled CPU mode
    assert load_tiny(qtbot, window, tiny, max_new_tokens=6)["backend"] == "numpy"
    assert "CPU mode" in window.model_status.text()
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=20000) as done:
        assert window.ctx.chats.send("hello")
    assert done.args[1]["finish_reason"] in ("stop", "length")
    assert window.chat.message_widgets()[-1].property("role") == "assistant"


def test_environment_engine_settings_reach_the_engine_on_load(
    qtbot, make_window, tiny, monkeypatch
):
    """SNUG_COMPUTE_DTYPE and SNUG_OVERLAP_LAUNCHES pass through the app's own settings."""
    from engine.session import Engine

    monkeypatch.setenv("SNUG_COMPUTE_DTYPE", "float32")
    monkeypatch.setenv("SNUG_OVERLAP_LAUNCHES", "0")
    received: list[EngineSettings] = []
    real_load = Engine.load.__func__

    def spy(cls, model_dir, settings=None, *args, **kwargs):
        received.append(settings)
        return real_load(cls, model_dir, settings, *args, **kwargs)

    monkeypatch.setattr(Engine, "load", classmethod(spy))
    window = make_window()  # the real loader: app.engine_bridge.load_engine
    s = window.ctx.settings
    s.set("engine/backend", "numpy")
    s.set("memory/reserve_gib", 0.25)
    window.choose(Entry("folder:tiny", "tiny", "", 0, "folder", local_dir=str(tiny)))
    s.set("engine/context", 256)
    failures: list[tuple[str, str]] = []
    window.ctx.engine.load_failed.connect(lambda cls, msg: failures.append((cls, msg)))
    window.load.load_button.click()  # the Load panel builds the request, as a user's click does
    qtbot.waitUntil(lambda: window.ctx.engine.state != "loading", timeout=20000)
    assert not failures and window.ctx.engine.state == "ready", failures
    assert len(received) == 1
    got = received[0]
    assert (got.compute_dtype, got.overlap_launches) == ("float32", False)
    assert (got.backend, got.reserve_bytes) == ("numpy", 1 << 28)  # the app's own fields


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_server_setting_serves_the_loaded_model(qtbot, make_window, tiny):
    """Settings > Local server on, then Load: the model is served on this machine and the
    window says where; a client's completion and the chat share the model."""
    import openai

    window = make_window()
    s = window.ctx.settings
    s.set("engine/backend", "numpy")
    s.set("engine/context", 256)
    s.set("engine/streams", 2)
    s.set("server/enabled", True)
    s.set("server/port", _free_port())
    window.choose(Entry("folder:tiny", "tiny", "", 0, "folder", local_dir=str(tiny)))
    with qtbot.waitSignal(window.ctx.server.url_changed, timeout=30000) as url:
        window.load.load_button.click()
    assert url.args[0].startswith("http://127.0.0.1:")
    assert url.args[0] in window.settings.server_status.text()
    client = openai.OpenAI(base_url=url.args[0], api_key="none", max_retries=0)
    reply = client.completions.create(model=tiny.name, prompt="Hi", max_tokens=3)
    assert reply.usage.completion_tokens == 3
    # The chat reads replies with the model's tokenizer there too: a reply cut by the token
    # limit goes on (Continue), and attached files are counted before they are sent.
    assert window.ctx.engine.info["tokenizer"] is not None
    s.set("sampling/max_new_tokens", 3)
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=20000) as done:
        assert window.ctx.chats.send("hello")
    if done.args[1]["finish_reason"] == "length":
        assert window.ctx.chats.can_continue()
        with qtbot.waitSignal(window.ctx.engine.finished, timeout=20000):
            assert window.ctx.chats.continue_reply()
        assert window.ctx.chats.current.turns[-1].stats["new_tokens"] > 3
    with qtbot.waitSignal(window.ctx.server.state_changed, timeout=10000) as state:
        window.ctx.engine.unload()
    assert state.args == ["stopped"]


def test_without_the_server_setting_the_chat_keeps_the_engine(qtbot, make_window, tiny):
    """Off (the default): the chat runs the Engine's own reply loop, and nothing listens."""
    from engine.session import Engine

    window = make_window()
    s = window.ctx.settings
    s.set("engine/backend", "numpy")
    s.set("engine/context", 256)
    window.choose(Entry("folder:tiny", "tiny", "", 0, "folder", local_dir=str(tiny)))
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=20000):
        window.load.load_button.click()
    assert isinstance(window.ctx.engine._worker._engine, Engine)
    assert not window.ctx.server.running


def test_a_chat_longer_than_the_context_goes_on(qtbot, make_window, tiny):
    """With the real tokenizer and template: once the chat outgrows the 256-token context,
    its oldest turns are left out of the prompt and the engine answers (it would refuse the
    whole conversation by name)."""
    window = make_window()
    load_tiny(qtbot, window, tiny, max_new_tokens=4)
    chats = window.ctx.chats
    for n in range(6):
        with qtbot.waitSignal(window.ctx.engine.finished, timeout=20000) as done:
            assert chats.send(f"message {n}: " + "hello world " * 20)
        assert done.args[1]["finish_reason"] in ("stop", "length"), done.args
    roles = [t.role for t in chats.current.turns]
    assert roles == ["user", "assistant"] * 6  # no error turn, every message kept
    assert chats.current.turns[-1].stats.get("left_out", 0) > 0


def test_a_reply_cut_by_the_token_limit_goes_on(qtbot, make_window, tiny):
    """Continue over the real engine: the prompt the reply answered, then its text so far
    (re-read by the tokenizer), answered greedily, added to the same reply."""
    window = make_window()
    load_tiny(qtbot, window, tiny, max_new_tokens=4)
    chats = window.ctx.chats
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=20000) as done:
        assert chats.send("hello")
    if done.args[1]["finish_reason"] != "length":
        pytest.skip("the tiny model ended its reply before the limit")
    first = chats.current.turns[-1].content
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=20000) as more:
        assert chats.continue_reply()
    assert more.args[1]["finish_reason"] in ("stop", "length")
    turns = chats.current.turns
    assert [t.role for t in turns] == ["user", "assistant"]
    assert turns[-1].content.startswith(first) and len(turns[-1].content) > len(first)
    assert turns[-1].stats["new_tokens"] > 4


def test_a_thinking_budget_closes_the_thinking_and_the_answer_follows(
    qtbot, make_window, tiny_checkpoint
):
    """Settings > Chat's thinking budget over the real engine: a reply still thinking after
    that many tokens gets Qwen's closing words, then its answer, in the same reply; its
    stats count every token of it. Thinking off, the budget changes nothing."""
    from engine.thinking_budget import CLOSE

    window = make_window()
    varied = tiny_checkpoint("untied-l8-r2", "hf-fp32")  # its greedy text is not all alike
    load_tiny(qtbot, window, varied, max_new_tokens=120)
    settings, chats = window.ctx.settings, window.ctx.chats
    settings.set("chat/thinking", True)
    settings.set("chat/thinking_budget", 4)
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=30000) as done:
        assert chats.send("hello")
    reply = chats.current.turns[-1]
    if "</think>" in reply.content.split(CLOSE)[0]:
        pytest.skip("the tiny model closed its thinking within the budget")
    thinking, _, answer = reply.content.partition(CLOSE)
    assert answer and thinking  # the words once, between the thinking and the answer
    assert done.args[1]["new_tokens"] == 120 and done.args[1]["finish_reason"] == "length"
    assert "thinking closed at its budget of 4 tokens" in window.chat.status.text()
    shown = window.chat.message_widgets()[-1].answer_view.toPlainText()
    assert shown.strip() and "Considering the limited time" not in shown  # in the thinking
    settings.set("chat/thinking", False)
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=30000):
        assert chats.send("again")
    assert CLOSE not in chats.current.turns[-1].content
    # Cut by the token limit while it thinks, then Continue: the budget counts what it has
    # thought already, and closes the thinking when the rest is spent.
    settings.set("chat/thinking", True)
    settings.set("chat/thinking_budget", 12)
    settings.set("sampling/max_new_tokens", 8)
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=30000):
        assert chats.send("once more")
    cut = chats.current.turns[-1].content
    if "</think>" in cut:
        pytest.skip("the tiny model closed its thinking before the token limit")
    settings.set("sampling/max_new_tokens", 120)
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=30000):
        assert chats.continue_reply()
    went_on = chats.current.turns[-1]
    assert went_on.content.startswith(cut) and CLOSE in went_on.content
    assert went_on.stats["thinking_cut"] == 12
