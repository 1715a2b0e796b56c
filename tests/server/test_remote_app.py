"""The app's side: the remote engine against the served model (plain Python, then through
the app's engine worker), the server switch around a loaded engine, the connect dialog."""

import threading

import pytest

from app.engine_bridge import LoadRequest, load_engine
from app.remote_engine import RemoteEngine, RemoteError, RemoteLoader, RemoteTarget, list_models
from app.thinking import split_reply
from engine.session import GenerationParams

KEY = "test-key"
USER = [{"role": "user", "content": "Hello"}]
GREEDY = GenerationParams(max_new_tokens=16, greedy=True)


def test_remote_engine_streams_what_the_server_says(served, solo):
    engine = RemoteEngine(RemoteTarget(served.url, KEY))
    assert engine.model == served.model
    assert engine.backend_name == "remote" and engine.held_bytes() == 0
    prompt = engine.chat_ids(USER, enable_thinking=False)
    events = list(engine.generate(prompt, GREEDY))
    text = "".join(e.text for e in events)
    assert text == solo(USER, 16, thinking=False).lstrip("\n").rstrip()
    final = events[-1]
    assert final.finished and final.finish_reason == "length"
    assert final.stats.new_tokens == 16
    assert final.stats.prompt_tokens == len(solo.engine.chat_ids(USER, enable_thinking=False))
    # Thinking comes back wrapped in <think>, as a local model writes it.
    thought = "".join(e.text for e in engine.generate(engine.chat_ids(USER, True), GREEDY))
    assert thought.startswith("<think>\n") and thought.endswith("\n</think>")
    assert split_reply(thought, True).thinking == solo(USER, 16).strip()
    engine.unload()


def test_remote_engine_cancel_and_errors(served):
    engine = RemoteEngine(RemoteTarget(served.url, KEY, served.model))
    cancel = threading.Event()
    params = GenerationParams(max_new_tokens=500, greedy=True)
    events = []
    for event in engine.generate(engine.chat_ids(USER, False), params, cancel):
        events.append(event)
        if len(events) == 3:
            cancel.set()
    assert events[-1].finished and events[-1].finish_reason == "cancelled"
    served.wait_idle(5)  # closing the stream freed the server's slot
    with pytest.raises(RemoteError, match="answered 401"):
        RemoteEngine(RemoteTarget(served.url, "wrong"))
    with pytest.raises(RemoteError, match="cannot reach"):
        list_models("http://127.0.0.1:9/v1")
    assert list_models(served.url, KEY) == [{"id": served.model, "context": 1024}]


def test_the_app_chats_with_a_remote_model(qtbot, served):
    from app.controllers import EngineController

    never = lambda request, progress: pytest.fail("the local loader was used")  # noqa: E731
    loader = RemoteLoader(never)
    controller = EngineController(loader)
    try:
        target = RemoteTarget(served.url, KEY, served.model, context=1024)
        with qtbot.waitSignal(controller.loaded, timeout=10000) as loaded:
            controller.load(loader.request_for(target))
        assert loaded.args[0]["backend"] == "remote" and loaded.args[0]["held"] == 0
        assert KEY not in loaded.args[0]["model_dir"]
        text: list[str] = []
        controller.tokens.connect(lambda _id, t, _n: text.append(t))
        with qtbot.waitSignal(controller.finished, timeout=20000) as done:
            controller.send(USER, GREEDY, False)
        assert done.args[1]["finish_reason"] == "length" and done.args[1]["new_tokens"] == 16
        assert "".join(text)
        # The app's thinking budget reaches the server through the worker.
        text.clear()
        params = GenerationParams(max_new_tokens=90, greedy=True)
        with qtbot.waitSignal(controller.finished, timeout=20000):
            controller.send(USER, params, True, thinking_budget=4)
        thought = split_reply("".join(text), True).thinking
        assert thought.endswith("based on the thinking directly now.")  # the closing words
    finally:
        assert controller.shutdown()


def test_server_switch_serves_the_loaded_engine(qtbot, tiny_checkpoint):
    import openai

    from app.controllers import EngineController
    from app.server_controller import ServerController
    from engine.config import EngineSettings

    server = ServerController()
    controller = EngineController(server.wrap_loader(load_engine))
    try:
        assert not server.start(port=0)  # nothing loaded yet
        model = tiny_checkpoint("tied-l4-r1", "hf-fp32")
        request = LoadRequest(str(model), EngineSettings(backend="numpy"), context=512, streams=2)
        with qtbot.waitSignal(controller.loaded, timeout=30000):
            controller.load(request)
        failures: list[str] = []
        server.failed.connect(failures.append)
        assert not server.start(host="0.0.0.0", port=0)
        assert "--api-key" in failures[-1]
        with qtbot.waitSignal(server.url_changed) as url:
            assert server.start(port=0, api_key="k")
        assert url.args[0] == server.url and server.url.startswith("http://127.0.0.1:")
        client = openai.OpenAI(base_url=server.url, api_key="k", max_retries=0)
        # The app's chat and a client share the scheduler's two streams.
        with qtbot.waitSignal(controller.finished, timeout=20000) as done:
            controller.send(USER, GREEDY, False)
            reply = client.completions.create(model=model.name, prompt="Hi", max_tokens=5)
        assert reply.usage.completion_tokens == 5 and done.args[1]["new_tokens"] == 16
        controller.unloaded.connect(server.forget_engine)
        with qtbot.waitSignal(server.state_changed, timeout=10000) as state:
            controller.unload()
        assert state.args == ["stopped"] and not server.running
    finally:
        server.stop()
        assert controller.shutdown()


def test_connect_dialog_lists_models_and_returns_the_target(qtbot, served):
    from app.panels.connect import ConnectDialog

    dialog = ConnectDialog(url=served.url, api_key=KEY)
    qtbot.addWidget(dialog)
    with qtbot.waitSignal(dialog.models_listed, timeout=10000):
        dialog.refresh()
    assert dialog.model.currentText() == served.model
    with qtbot.waitSignal(dialog.target_chosen) as chosen:
        dialog.accept()
    assert chosen.args[0] == RemoteTarget(served.url, KEY, served.model, 1024)
    dialog.api_key.setText("wrong")
    with qtbot.waitSignal(dialog.models_listed, timeout=10000):
        dialog.refresh()
    assert "401" in dialog.status.text()


def test_a_remote_reply_takes_its_draft_counts_from_the_servers_timings():
    """A server that drafts (Snug, llama.cpp) says so in `timings`; the app's stats line
    shows it as for a local reply. Anything else there counts as no drafts."""
    from types import SimpleNamespace

    from app.remote_engine import _stats

    usage = SimpleNamespace(prompt_tokens=20, completion_tokens=10)
    stats = _stats(usage, 0.0, 0.5, {"draft_n": 12, "draft_n_accepted": 9})
    assert (stats.drafted, stats.drafts_kept) == (12, 9)
    for odd in (None, {}, {"draft_n": "12", "draft_n_accepted": True}, {"draft_n": -3}):
        stats = _stats(usage, 0.0, 0.5, odd)
        assert (stats.drafted, stats.drafts_kept) == (0, 0)


def test_another_snug_holds_the_thinking_to_the_apps_budget(served, solo):
    """Connected to snug serve, the app's thinking budget goes as its `thinking_budget`:
    the reply is the one the engine gives under that budget; other servers never get it."""
    from engine.thinking_budget import CLOSE, generate_within

    engine = RemoteEngine(RemoteTarget(served.url, KEY))
    assert engine.kind == "snug" and engine.takes_thinking_budget and not engine.ollama
    params = GenerationParams(max_new_tokens=90, greedy=True)
    ids = solo.engine.chat_ids(USER, enable_thinking=True)
    local = "".join(e.text for e in generate_within(solo.engine, ids, params, 6))
    if CLOSE not in local:
        pytest.skip("the tiny model closed its thinking within the budget")
    events = list(engine.generate(engine.chat_ids(USER, True), params, thinking_budget=6))
    reply = split_reply("".join(e.text for e in events), True)
    thinking, _, answer = local.partition("</think>")
    assert reply.thinking.strip() == thinking.strip() and reply.answer.strip() == answer.strip()
    assert events[-1].stats.new_tokens == 90
    engine.unload()
