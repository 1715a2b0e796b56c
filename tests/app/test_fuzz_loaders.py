"""Property tests: whatever a chat file or the settings file holds, loading ends in a value or
a logged skip, never an uncaught exception, and within a time bound per case.

200 cases per test by default (a few seconds); a longer run:
    SNUG_FUZZ_EXAMPLES=20000 pytest tests/app/test_fuzz_loaders.py --hypothesis-show-statistics
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from PySide6.QtCore import QSettings

from app.chat_controller import format_stats
from app.state.chat_history import NUMERIC_STATS
from app.state.chat_store import ChatStore
from app.state.settings import BY_KEY, FIELDS, AppSettings, SettingError, env_settings, parse
from engine.config import EngineSettings

EXAMPLES = int(os.environ.get("SNUG_FUZZ_EXAMPLES", "200"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=timedelta(seconds=2),  # the time bound for one case
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# --- strategies ---------------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats()
    | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
ids = st.just("c1") | st.sampled_from(["../c1", "/c1", "c1/", "", "c" * 65, "c1\x00"]) | scalars
finite = st.floats(allow_nan=False, allow_infinity=False) | st.integers(0, 10**9)
good_stats = st.dictionaries(st.sampled_from(NUMERIC_STATS), finite, max_size=5).map(
    lambda d: {**d, "finish_reason": "stop"}
)
stats = good_stats | st.dictionaries(
    st.sampled_from([*NUMERIC_STATS, "finish_reason"]) | st.text(max_size=6), scalars, max_size=4
)
good_turn = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "error"]), "content": st.text(max_size=40)},
    optional={"thinking_enabled": st.booleans(), "stats": good_stats},
)
turns = good_turn | st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["user", "assistant", "error", "system"]) | scalars,
        "content": st.text(max_size=40) | scalars,
        "thinking_enabled": st.booleans() | scalars,
        "stats": stats | json_values,
        "extra": scalars,
    },
)
good_chat = st.fixed_dictionaries(
    {"id": st.just("c1")},
    optional={
        "title": st.text(max_size=30),
        "created": finite,
        "updated": finite,
        "turns": st.lists(good_turn, max_size=4),
    },
)
chats = good_chat | st.fixed_dictionaries(
    {},
    optional={
        "id": ids,
        "title": st.text(max_size=30) | scalars,
        "created": finite | scalars,
        "updated": finite | scalars,
        "turns": st.lists(turns | json_values, max_size=4) | json_values,
    },
)
deep = st.integers(1, 200_000).map(lambda n: ("[" * n + "]" * n).encode())
chat_bytes = (
    st.binary(max_size=400)
    | deep
    | st.builds(lambda v, cut: json.dumps(v).encode()[:cut], chats, st.integers(0, 400))
)
numberish = st.from_regex(r"-?[0-9]{0,450}(\.[0-9]{0,5})?([eE][+-]?[0-9]{1,4})?", fullmatch=True)
qt_values = st.sampled_from(
    ["@Variant(", "@ByteArray(", "@Invalid()", "@Rect(1 2 3 4)", "@Size(1 2)", "@Point(1 2)"]
)
setting_text = (
    st.text(max_size=40)
    | numberish
    | st.sampled_from(["nan", "-nan", "inf", "-inf", "1e400", "true", "cpu", '"a, b"', "a, b"])
    | st.builds(lambda a, b: a + b, qt_values, st.text(max_size=20))
)


@contextmanager
def logged(name: str) -> Iterator[list[logging.LogRecord]]:
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


# --- chat history -------------------------------------------------------------------------


def check_chat_file(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp, logged("app.state.chat_store") as records:
        folder = Path(tmp)
        (folder / "c1.json").write_bytes(data)
        store = ChatStore(folder)
        chat = store.get("c1")
        if chat is None:
            event("chat: skipped")
            assert len(store.problems) == 1 and "c1.json" in store.problems[0]
            assert len(records) == 1
            store.create()
            assert (folder / "c1.json").read_bytes() == data  # never written over
            return
        event("chat: loaded")
        assert store.problems == [] and records == []
        for turn in chat.turns:
            format_stats(turn.stats)  # what the message widget shows
        chat.messages("system")
        store.save(chat)
        again = ChatStore(folder).get("c1")
        assert again is not None and again.turns == chat.turns and again.title == chat.title


@FUZZ
@given(chats | json_values)
def test_any_json_value_in_a_chat_file_loads_or_is_skipped(value):
    check_chat_file(json.dumps(value).encode())


@FUZZ
@given(chat_bytes)
def test_any_bytes_in_a_chat_file_load_or_are_skipped(data):
    check_chat_file(data)


# --- settings -----------------------------------------------------------------------------


def check_settings_file(ini: bytes) -> AppSettings:
    with tempfile.TemporaryDirectory() as tmp, logged("app.state.settings") as records:
        path = Path(tmp) / "Snug.conf"
        path.write_bytes(ini)
        s = AppSettings(QSettings(str(path), QSettings.Format.IniFormat))
        for field in FIELDS:
            value = s.get(field.key)
            assert parse(field, value) == value or value != value  # a valid value
        s.engine_settings()
        s.sampling()
        assert s.backend in ("auto", "cuda", "numpy")
        assert len(records) == len(s.problems)
        event("settings: fell back" if s.problems else "settings: used")
        return s


@FUZZ
@given(st.sampled_from([f.key for f in FIELDS]), setting_text)
def test_any_stored_setting_reads_as_a_valid_value_or_its_default(key, raw):
    group, name = key.split("/")
    s = check_settings_file(f"[{group}]\n{name}={raw}\n".encode())
    for problem in s.problems:
        assert key in problem and f"default {BY_KEY[key].default!r}" in problem


@FUZZ
@given(
    st.sampled_from([b"", b"[memory]\nreserve_gib=", b"[engine]\nbackend="]),
    st.binary(max_size=400),
)
def test_any_bytes_in_the_settings_file_read_as_valid_values(head, data):
    check_settings_file(head + data)


@FUZZ
@given(st.sampled_from([f.key for f in FIELDS]), setting_text | scalars | json_values)
def test_setting_any_value_stores_a_valid_one_or_is_refused(key, value):
    with tempfile.TemporaryDirectory() as tmp:
        s = AppSettings(QSettings(str(Path(tmp) / "Snug.conf"), QSettings.Format.IniFormat))
        try:
            s.set(key, value)
        except SettingError as exc:
            event("set: refused")
            assert key in str(exc)
            return
        event("set: stored")
        again = AppSettings(QSettings(str(Path(tmp) / "Snug.conf"), QSettings.Format.IniFormat))
        assert again.problems == [] and again.get(key) == s.get(key)


@FUZZ
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "SNUG_MEMORY_RESERVE_GIB",
                "SNUG_MEMORY_LIMIT_GIB",
                "SNUG_BACKEND",
                "SNUG_CACHE_DIR",
                "SNUG_COMPUTE_DTYPE",
                "SNUG_OVERLAP_LAUNCHES",
            ]
        ),
        setting_text,
        max_size=6,
    )
)
def test_any_snug_environment_gives_engine_settings_and_names_what_it_ignored(environ):
    es, problems = env_settings(environ)
    assert isinstance(es, EngineSettings)
    for problem in problems:
        assert any(name in problem for name in environ)
    event("env: some ignored" if problems else "env: all used")
