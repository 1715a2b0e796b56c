"""Tool parameters' JSON schemas as clients write them (pydantic's, zod's): definitions in
`$defs` (or `definitions`) that properties point to with `$ref`, unions as `anyOf`.

`value_types` tells which JSON types a parameter takes, to read back a value that Qwen3.5's
tool call form writes as text (engine.server.reply). `inline_refs` puts each definition in
place of its `$ref`: a forced tool call's grammar nests the parameters inside the call's
own schema (engine.constraint), where a `#/$defs/...` pointer no longer leads anywhere.
"""

from __future__ import annotations

from typing import Any

_DATA = ("enum", "const", "default", "examples")  # values, not schemas: kept as they are
_NAMED = ("properties", "patternProperties")  # property name -> schema maps


class RecursiveSchema(ValueError):
    """A `$ref` that leads back into itself: it cannot be written out in place."""


def pointer(root: Any, ref: str) -> Any:
    """What a local `$ref` ("#", "#/$defs/Name") points to in `root`; None if nothing."""
    if not ref.startswith("#"):
        return None
    node = root
    for part in ref[1:].split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def resolve(schema: Any, root: Any) -> Any:
    """`schema` with its `$ref` followed (the keywords beside it kept), as often as it takes;
    {} (any value) where a pointer leads nowhere or in a circle."""
    seen: set[str] = set()
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str):
        ref = schema["$ref"]
        target = pointer(root, ref)
        if ref in seen or not isinstance(target, dict):
            return {}
        seen.add(ref)
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        schema = {**target, **rest}
    return schema


def json_type(value: Any) -> str:
    """A parsed JSON value's type name, as schemas write it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def value_types(schema: Any, root: Any, depth: int = 0) -> set[str] | None:
    """The JSON types a value of `schema` may have (`$ref`s followed within `root`, unions
    gathered); None where the schema does not say."""
    schema = resolve(schema, root)
    if not isinstance(schema, dict) or depth > 32:
        return None
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list) and kind and all(isinstance(k, str) for k in kind):
        return set(kind)
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            found: set[str] = set()
            for branch in branches:
                types = value_types(branch, root, depth + 1)
                if types is None:
                    return None
                found |= types
            return found
    for branch in schema.get("allOf") or ():
        types = value_types(branch, root, depth + 1)
        if types is not None:
            return types
    if "const" in schema:
        return {json_type(schema["const"])}
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return {json_type(v) for v in schema["enum"]}
    if "properties" in schema:
        return {"object"}
    return {"array"} if "items" in schema else None


def inline_refs(schema: Any, root: Any = None, trail: tuple[str, ...] = ()) -> Any:
    """`schema` with each local `$ref` replaced by the definition it points to and the
    definitions themselves dropped. Raises RecursiveSchema for a definition that contains
    itself (a tree)."""
    root = schema if root is None else root
    if isinstance(schema, list):
        return [inline_refs(s, root, trail) for s in schema]
    if not isinstance(schema, dict):
        return schema
    ref = schema.get("$ref")
    if isinstance(ref, str) and isinstance(pointer(root, ref), dict):
        if ref in trail:
            raise RecursiveSchema(ref)
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        return inline_refs({**pointer(root, ref), **rest}, root, (*trail, ref))
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("$defs", "definitions") and isinstance(value, dict):
            continue
        if key in _DATA:
            out[key] = value
        elif key in _NAMED and isinstance(value, dict):
            out[key] = {name: inline_refs(s, root, trail) for name, s in value.items()}
        else:
            out[key] = inline_refs(value, root, trail)
    return out


def has_refs(schema: Any) -> bool:
    """Whether a `$ref` appears anywhere in `schema`."""
    if isinstance(schema, dict):
        return "$ref" in schema or any(has_refs(v) for v in schema.values())
    return isinstance(schema, list) and any(has_refs(v) for v in schema)
