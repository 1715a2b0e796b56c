"""The app serving its loaded model (Settings > Local server) while its clients stream: what
they get when the model is unloaded or replaced, and what the window says when it cannot
listen. The real engine: a tiny random checkpoint on the numpy backend."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from app.state.catalog import Entry


@pytest.fixture
def slow_steps(monkeypatch):
    """Each decode step of the shared scheduler takes 10 ms more, so that a client's reply
    is still streaming when the window acts."""
    from engine.scheduler import Scheduler

    step = Scheduler._decode_one

    def slower(self):
        time.sleep(0.01)
        return step(self)

    monkeypatch.setattr(Scheduler, "_decode_one", slower)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load(qtbot, window, model, port: int) -> None:
    s = window.ctx.settings
    s.set("engine/backend", "numpy")
    s.set("engine/context", 512)
    s.set("engine/streams", 2)
    s.set("server/enabled", True)
    s.set("server/port", port)
    window.choose(Entry(f"folder:{model.name}", model.name, "", 0, "folder", local_dir=str(model)))
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=30000):
        window.load.load_button.click()
    server, status = window.ctx.server, window.settings.server_status
    # The server starts off the GUI thread: it listens, or the settings say why not.
    qtbot.waitUntil(lambda: server.running or "Not serving:" in status.text(), timeout=30000)


class StreamingClient(threading.Thread):
    """An `openai` client streaming a long greedy reply: how the stream ended (its finish
    reason, or the error raised)."""

    def __init__(self, url: str, model: str) -> None:
        super().__init__(daemon=True)
        import openai

        self.client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
        self.model, self.reason, self.error = model, "", None
        self.start()

    def run(self) -> None:
        try:
            stream = self.client.chat.completions.create(
                model=self.model,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=400,
                temperature=0,
                stream=True,
            )
            for chunk in stream:
                if chunk.choices and chunk.choices[0].finish_reason:
                    self.reason = chunk.choices[0].finish_reason
        except Exception as exc:
            self.error = exc


@pytest.mark.parametrize("then", ["unload", "load another"])
def test_a_client_streaming_when_the_model_goes_is_told_not_cut_short(
    qtbot, make_window, tiny, tiny_checkpoint, slow_steps, then
):
    """Unload, or Load of another model, while a client streams: its reply ends with the
    server's error (not a finish reason, as if the reply were whole), the window does not
    wait on the server, and a new model is served again."""
    import openai

    window = make_window()
    _load(qtbot, window, tiny, _free_port())
    server = window.ctx.server
    assert server.running
    scheduler = window.ctx.engine._worker._engine.scheduler
    client = StreamingClient(server.url, tiny.name)
    qtbot.waitUntil(lambda: scheduler.running == 1, timeout=20000)
    qtbot.wait(300)  # some 30 tokens into its reply
    if then == "unload":
        with qtbot.waitSignal(server.state_changed, timeout=10000) as state:
            window.ctx.engine.unload()
        assert state.args == ["stopped"]
    else:
        other = tiny_checkpoint("tied-l4-r1", "hf-bf16")
        with qtbot.waitSignal(server.url_changed, timeout=30000, check_params_cb=bool):
            _load(qtbot, window, other, _free_port())
    client.join(10)
    assert not client.is_alive()
    assert client.reason == "" and isinstance(client.error, openai.APIError), (
        client.reason,
        client.error,
    )
    assert "shutting down" in str(client.error)
    if then == "load another":
        assert server.running and window.settings.server_status.text().startswith("Serving")


def test_a_port_in_use_names_the_port_and_the_setting(qtbot, make_window, tiny):
    """Another program listens on the server's port: the settings panel says which port
    and the setting that changes it (not the command line's flag)."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        window = make_window()
        _load(qtbot, window, tiny, port)
    said = window.settings.server_status.text()
    assert not window.ctx.server.running
    assert f"port {port}" in said and "Settings > Local server > Server port" in said, said
    assert "--port" not in said


def test_starting_and_stopping_the_server_leave_the_window_free(
    qtbot, make_window, tiny, monkeypatch
):
    """uvicorn taking seconds to listen, or to end its connections, holds the controller's
    own thread, not the window's: start and stop return at once, the server's state comes
    after, and a start asked right after a stop waits for that stop (same port)."""
    from engine.server.runner import ServerThread

    start, stop = ServerThread.start, ServerThread.stop

    def slow_start(self):
        time.sleep(1.0)
        return start(self)

    def slow_stop(self):
        time.sleep(1.0)
        return stop(self)

    window = make_window()
    port = _free_port()
    _load(qtbot, window, tiny, port)
    server = window.ctx.server
    assert server.running
    monkeypatch.setattr(ServerThread, "start", slow_start)
    monkeypatch.setattr(ServerThread, "stop", slow_stop)
    began = time.monotonic()
    server.stop()
    assert not server.running and "Not serving" in window.settings.server_status.text()
    with qtbot.waitSignal(server.url_changed, timeout=10000, check_params_cb=bool) as url:
        assert server.start(port=port)
        assert time.monotonic() - began < 0.5  # neither call waited for uvicorn
    assert url.args[0] == f"http://127.0.0.1:{port}/v1" and server.running
    assert time.monotonic() - began >= 2.0  # the start waited for the stop before it
    assert window.ctx.shutdown()
    assert not server.running
