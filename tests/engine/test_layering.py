"""The seams of the layout (docs/architecture.md): the engine never imports Qt or the app,
and the app reaches `engine.session` through `app/engine_bridge.py` alone."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imports(path: Path) -> set[str]:
    """Every module `path` imports, at any depth of its code (lazy imports included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def offenders(folder: str, banned, allowed=()) -> dict[str, list[str]]:
    out = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        name = str(path.relative_to(ROOT))
        bad = sorted(m for m in imports(path) if banned(m))
        if bad and name not in allowed:
            out[name] = bad
    return out


def test_the_engine_never_imports_qt_or_the_app():
    qt = ("PySide6", "PyQt5", "PyQt6", "pyqtgraph", "app")
    assert offenders("engine", lambda m: m.split(".")[0] in qt) == {}


def test_the_app_reaches_the_session_through_the_bridge_alone():
    session = offenders("app", lambda m: m == "engine.session", allowed=("app/engine_bridge.py",))
    assert session == {}


def test_the_check_sees_lazy_imports(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from engine.session import Engine\n    import PySide6.QtCore\n")
    assert imports(path) == {"engine.session", "PySide6.QtCore"}
