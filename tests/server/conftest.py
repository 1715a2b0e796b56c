"""A served tiny model: the numpy engine, the scheduler and uvicorn on a free port of
127.0.0.1, talked to with the official `openai` client."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from engine.config import EngineSettings
from engine.scheduler import Scheduler
from engine.server.app import create_app
from engine.server.runner import ServerThread
from engine.session import Engine, GenerationParams

NUMPY = EngineSettings(backend="numpy")
KEY = "test-key"
TEMPLATE = Path(__file__).with_name("qwen35_template.jinja")
CONTEXT = 1024


def with_template(source: Path, out: Path) -> Path:
    """A copy of a checkpoint folder (links) with the Qwen3.5-format template."""
    out.mkdir()
    for path in source.iterdir():
        if path.name != "chat_template.jinja":
            (out / path.name).symlink_to(path)
    shutil.copy(TEMPLATE, out / "chat_template.jinja")
    return out


@pytest.fixture(scope="session")
def tools_checkpoint(tiny_checkpoint, tmp_path_factory) -> Path:
    """The 8-layer tiny checkpoint (varied greedy text) with a chat template in Qwen3.5's
    format (tools, thinking on by default)."""
    source = tiny_checkpoint("untied-l8-r2", "hf-fp32")
    return with_template(source, tmp_path_factory.mktemp("tools") / "tiny-tools")


@pytest.fixture(scope="session")
def light_checkpoint(tiny_checkpoint, tmp_path_factory) -> Path:
    """The 4-layer tiny checkpoint (fast; greedy only repeats itself), same template."""
    source = tiny_checkpoint("tied-l4-r1", "hf-fp32")
    return with_template(source, tmp_path_factory.mktemp("light") / "tiny-light")


# The weather tool's parameters, and a call of it in Qwen3.5's form (what the tool tests make
# the model say), for the APIs that take tools each in their own shape.
WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}
PARIS_CALL = (
    "I will check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
    "</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"
)


class Scripted(Scheduler):
    """Runs the model as usual but picks the tokens of `script` (then end of sequence), so
    a test can make the tiny random model say what a real one would. Records each prompt."""

    def __init__(self, engine: Engine, **kwargs) -> None:
        super().__init__(engine, **kwargs)
        self.script: list[int] = []
        self.prompts: list[list[int]] = []

    def say(self, text: str) -> None:
        self.script = self.engine.tokenizer.encode(text)

    def last_prompt(self) -> str:
        return self.engine.tokenizer.decode(self.prompts[-1])

    def _pick(self, request) -> int:
        n = len(request.generated)
        return self.script[n] if n < len(self.script) else min(self.engine.eos_ids)

    def _first_token(self, request, logits) -> int:
        self.prompts.append(list(request.prompt_ids))
        return self._pick(request)

    def _next_tokens(self, batch) -> list[int]:
        super()._next_tokens(batch)  # the step still runs: the streams' state stays true
        return [self._pick(r) for r in batch]


@dataclass
class Served:
    engine: Engine
    scheduler: Scheduler
    server: ServerThread
    model: str

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def base(self) -> str:
        return self.server.url[: -len("/v1")]

    def client(self, key: str = KEY, **kwargs):
        import openai

        return openai.OpenAI(base_url=self.url, api_key=key, max_retries=0, **kwargs)

    def wait_idle(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while self.scheduler.running or self.scheduler.waiting:
            assert time.monotonic() < deadline, "the scheduler did not become idle"
            time.sleep(0.01)


def serve(
    model_dir: Path, scheduler_class=Scheduler, streams: int = 2, queue: int = 6, rows: int = 64
):
    engine = Engine.load(model_dir, NUMPY, context=CONTEXT, streams=streams, max_rows=rows)
    scheduler = scheduler_class(engine, queue_size=queue).start()
    server = ServerThread(create_app(scheduler, api_key=KEY)).start()
    return Served(engine, scheduler, server, model_dir.name)


@pytest.fixture(scope="module")
def served(tools_checkpoint):
    s = serve(tools_checkpoint)
    yield s
    s.server.stop()
    s.scheduler.close()


@pytest.fixture(scope="module")
def scripted(light_checkpoint):
    s = serve(light_checkpoint, Scripted, streams=1, queue=2)
    yield s
    s.server.stop()
    s.scheduler.close()


@pytest.fixture(scope="module")
def solo(tools_checkpoint):
    """`solo(messages, max_tokens, thinking)` -> the reply's text from Engine.generate alone
    (greedy), on an engine of its own."""
    engine = Engine.load(tools_checkpoint, NUMPY, context=CONTEXT, streams=1, max_rows=64)

    def run(messages, max_tokens: int, thinking: bool | None = None, ids=None) -> str:
        ids = ids or engine.chat_ids(messages, enable_thinking=thinking)
        params = GenerationParams(max_new_tokens=max_tokens, greedy=True)
        return "".join(e.text for e in engine.generate(ids, params))

    run.engine = engine
    return run
