"""No class of the project assigns an instance attribute under the name of one of its own
methods. Such an attribute hides the method for every later call on that instance, and
where the method runs only on a GPU path no CPU test reaches the call (the pick ring's
positions were once named `_first` and stopped every drafting load on the GPU)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _shadowed(source: str, name: str) -> list[str]:
    """`name:line Class.attribute` for each assignment to self.<one of Class's methods>."""
    found = []
    for cls in ast.walk(ast.parse(source, name)):
        if not isinstance(cls, ast.ClassDef):
            continue
        methods = {
            f.name for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        for node in ast.walk(cls):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and node.attr in methods
            ):
                found.append(f"{name}:{node.lineno} {cls.name}.{node.attr}")
    return found


def test_no_instance_attribute_hides_a_method():
    files = [p for d in ("engine", "app", "tools") for p in sorted((ROOT / d).rglob("*.py"))]
    assert len(files) > 100
    found = [hit for p in files for hit in _shadowed(p.read_text(), str(p.relative_to(ROOT)))]
    assert not found, "instance attributes named like a method of their class: " + ", ".join(found)


def test_the_check_finds_one():
    src = "class A:\n    def __init__(self):\n        self.run = {}\n\n    def run(self): ...\n"
    assert _shadowed(src, "a.py") == ["a.py:3 A.run"]
    assert _shadowed(src.replace("self.run", "self.runs"), "a.py") == []
