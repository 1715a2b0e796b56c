"""A Jinja sandbox with budgets: chat templates are downloaded code, rendered within limits.

jinja2's ImmutableSandboxedEnvironment keeps a template away from Python internals, but not
from the machine: nested `range(100000)` loops run for hours, `10**10000000` or
`'x' * 10**10` take seconds to gigabytes, and 5000 nested parentheses overflow the stack.
`BoundedSandbox` adds three guards; together they refuse every such template with
`LimitHit`, which the tokenizer turns into a TemplateLimitError naming the template file.

  time     every `{% for %}` iterates through `paced`, which checks the deadline every 64
           items, and every call, operator and attribute the template evaluates checks it
           too (a macro that recurses without loops is caught at its calls)
  size     before an operation builds a value, its size is estimated and refused past
           `max_size` (characters, or items of a list): `*` `+` `%` `**`, `~`, comparisons,
           `{{ }}` output, str methods and the filters that take a width or a count
  output   the rendered text is counted chunk by chunk as it is produced

Real templates (Qwen3.5's, with tools and thinking) render exactly as with the plain
sandbox, in well under the budget.
"""

from __future__ import annotations

import functools
import inspect
import math
import re
import string
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame, optimizeconst
from jinja2.runtime import Namespace
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError
from jinja2.utils import generate_lorem_ipsum


@dataclass(frozen=True)
class TemplateLimits:
    """Budgets for one compile or one render of a chat template."""

    seconds: float = 2.0  # a Qwen3.5 template renders 2000 messages in ~0.1 s
    max_size: int = 8 << 20  # characters (or list items) of any value, and of the output
    max_int_bits: int = 1 << 14  # 4932 decimal digits: past what Python prints by default
    max_template_chars: int = 256 << 10  # Qwen3.5's template is 7.8 KB
    max_depth: int = 512  # lists in lists in ...: past what json.dumps of a tool call takes


class LimitHit(Exception):
    """A budget ran out; the message says which (the caller adds the template's file)."""


_PACE = 64  # loop items between two deadline checks
_WIDTH_METHODS = frozenset({"center", "ljust", "rjust", "zfill", "expandtabs", "to_bytes"})
_FORMAT_DIGITS = re.compile(r"\d+")


def measure(
    value: Any,
    limits: TemplateLimits,
    known: Mapping[int, int] | None = None,
    memo: dict[int, int] | None = None,
) -> int:
    """About how many characters `str(value)` prints, computed without building it; stops
    counting a little past `limits.max_size`. Shared references count once per occurrence
    (as str() prints them) but are walked once. `known`: sizes already measured, by id, of
    values that stay alive and unchanged meanwhile; `memo` collects the sizes measured."""
    memo = {} if memo is None else memo
    known = known or {}
    cap = limits.max_size

    def size(v: Any, depth: int) -> int:
        if isinstance(v, str | bytes):
            return len(v)
        if isinstance(v, bool | float) or v is None:
            return 8
        if isinstance(v, int):
            return v.bit_length() // 3 + 1
        key = id(v)
        if key in memo:
            return memo[key]
        if key in known:
            return known[key]
        if isinstance(v, Namespace):
            v = object.__getattribute__(v, "_Namespace__attrs")
        if isinstance(v, Mapping):
            items: Iterable[Any] = (x for pair in v.items() for x in pair)
        elif isinstance(v, list | tuple | set | frozenset):
            items = v
        else:
            return 16  # macros, Undefined, loop objects, generators: printed short
        if depth > limits.max_depth:
            raise LimitHit(f"nests values more than {limits.max_depth} deep")
        total = 2
        for item in items:
            total += size(item, depth + 1) + 2
            if total > cap:
                break
        memo[key] = total
        return total

    return size(value, 0)


class _CheckedCodeGenerator(CodeGenerator):
    """Routes every loop's iterable through `environment.paced` (the deadline), and `~`
    operands and comparison operands through `environment.checked`, so that str() of a huge
    value (or == on two) is refused before Python starts building it."""

    def visit_Template(self, node: nodes.Template, frame: Frame | None = None) -> None:
        for loop in node.find_all(nodes.For):
            paced = nodes.EnvironmentAttribute("paced", lineno=loop.lineno)
            loop.iter = nodes.Call(paced, [loop.iter], [], None, None, lineno=loop.lineno)
        super().visit_Template(node, frame)

    @optimizeconst
    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        if frame.eval_ctx.volatile:
            func_name = "(markup_join if context.eval_ctx.volatile else str_join)"
        elif frame.eval_ctx.autoescape:
            func_name = "markup_join"
        else:
            func_name = "str_join"
        self.write(f"{func_name}(environment.checked((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write(")))")

    @optimizeconst
    def visit_Compare(self, node: nodes.Compare, frame: Frame) -> None:
        self.write("(environment.checked(")
        self.visit(node.expr, frame)
        self.write(")")
        for op in node.ops:
            self.visit(op, frame)
        self.write(")")

    def visit_Operand(self, node: nodes.Operand, frame: Frame) -> None:
        self.write(f" {jinja2.compiler.operators[node.op]} environment.checked(")
        self.visit(node.expr, frame)
        self.write(")")


class _Paced:
    """A loop's iterable that calls `tick` every `_PACE` items; `len` still works, so
    `loop.length` and `loop.last` behave as on the plain iterable."""

    def __init__(self, items: Any, tick: Callable[[], None]) -> None:
        self._items, self._tick = items, tick

    def __iter__(self) -> Any:
        tick = self._tick
        for i, item in enumerate(self._items):
            if not i % _PACE:
                tick()
            yield item

    def __len__(self) -> int:
        return len(self._items)


class TemplateDict:
    """The `dict` global as transformers gives it to chat templates: `dict(...)` and
    `dict.fromkeys(...)`. jinja's own is the builtin type, whose unbound methods would let
    `dict.update(message, ...)` or `dict.clear(tool)` change the caller's data, past the
    immutable sandbox's check (which looks at the object a method is bound to)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class TemplateNamespace(Namespace):
    """The `namespace` global as transformers gives it: a name that starts with an
    underscore is refused (SecurityError), when the namespace is made and when it is set."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 (jinja's signature)
        self, args = args[0], args[1:]  # so that `namespace(self=...)` works, as in jinja
        attrs = dict(*args, **kwargs)
        for name in attrs:
            TemplateNamespace.check_name(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        TemplateNamespace.check_name(name)
        Namespace.__setitem__(self, name, value)

    @staticmethod
    def check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(
                f"a namespace cannot hold the underscore-prefixed attribute {name!r}"
            )


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox with the time, size and output budgets of `TemplateLimits`."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})
    code_generator_class = _CheckedCodeGenerator

    def __init__(self, limits: TemplateLimits | None = None, **options: Any) -> None:
        super().__init__(finalize=self.checked, **options)
        self.limits = limits or TemplateLimits()
        self._clock = threading.local()  # the deadline of the render on this thread
        self.globals.update(dict=TemplateDict(), namespace=TemplateNamespace, lipsum=self.lipsum)
        for name, func in self.filters.items():
            guard = self.guard_filter if name in _FILTER_CHECKS else self.guard_arguments
            self.filters[name] = guard(func, name)
        for name, func in self.tests.items():
            self.tests[name] = self.guard_arguments(func, name)

    # -- entry points --------------------------------------------------------------------

    def compile_bounded(self, source: str) -> jinja2.Template:
        """`from_string(source)` if the template is within the size limit."""
        if len(source) > self.limits.max_template_chars:
            raise LimitHit(
                f"is {len(source):,} characters, over the {self.limits.max_template_chars:,} "
                "a chat template needs"
            )
        self._clock.deadline = time.monotonic() + self.limits.seconds
        return self.from_string(source)

    def render_bounded(self, template: jinja2.Template, variables: Mapping[str, Any]) -> str:
        """`template.render(**variables)` within the time and output budgets."""
        limit = self.limits.max_size
        self._clock.deadline = time.monotonic() + self.limits.seconds
        # The variables are measured once, here: they live through the render and the
        # immutable sandbox keeps the template from changing them, so the checks on every
        # `message.content` and `tool_call.arguments` look their sizes up instead of walking
        # them again (a long agent history would otherwise spend its time budget on that).
        known: dict[int, int] = {}
        for value in variables.values():
            measure(value, self.limits, memo=known)
        self._clock.known = known
        try:
            parts, total = [], 0
            for chunk in template.generate(**variables):
                total += len(chunk)
                if total > limit:
                    raise LimitHit(f"rendered more than {limit:,} characters")
                self.tick()
                parts.append(chunk)
            return "".join(parts)
        finally:
            self._clock.known = None

    # -- time ----------------------------------------------------------------------------

    def tick(self) -> None:
        """Raise LimitHit once the current compile's or render's time budget is spent."""
        if time.monotonic() > getattr(self._clock, "deadline", math.inf):
            raise LimitHit(f"ran past its time budget of {self.limits.seconds:g} s")

    def paced(self, items: Any) -> _Paced:
        """A loop's iterable, checking the deadline as the loop goes (see the codegen)."""
        return _Paced(items, self.tick)

    def lipsum(self, n: Any = 5, html: Any = True, min: Any = 20, max: Any = 100) -> Any:  # noqa: A002
        """jinja's `lipsum` global: `n` paragraphs of fewer than `max` random words, refused
        past the size budget (a word is at most 12 characters, 16 with its punctuation)."""
        if isinstance(n, int) and n > 0:
            words = max if isinstance(max, int | float) and max > 0 else 0
            self._refuse_size(n * (words * 16 + 16), "asks lipsum for")
        return generate_lorem_ipsum(n, html, min, max)

    # -- size checks ---------------------------------------------------------------------

    def checked(self, value: Any) -> Any:
        """`value` unchanged if printing it stays within the size budget."""
        self.tick()
        kind = type(value)
        if kind is str:
            if len(value) > self.limits.max_size:
                self._refuse_size(len(value), "builds a value of")
        elif not (kind is int or kind is bool or kind is float or value is None):
            known = getattr(self._clock, "known", None)
            self._refuse_size(measure(value, self.limits, known), "builds a value of")
        return value

    def _refuse_size(self, size: int, what: str) -> None:
        if size > self.limits.max_size:
            raise LimitHit(
                f"{what} about {size:,} characters or items, over its limit of "
                f"{self.limits.max_size:,}"
            )

    def _refuse_int(self, value: Any, what: str) -> None:
        if isinstance(value, int) and abs(value) > self.limits.max_size:
            raise LimitHit(f"{what} {value:,}, over its limit of {self.limits.max_size:,}")

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        self.tick()
        limits = self.limits
        if operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
            if left.bit_length() * right > limits.max_int_bits:
                raise LimitHit(f"computes a power of over {limits.max_int_bits} bits")
        elif operator == "*":
            if isinstance(left, int) and isinstance(right, int):
                if left.bit_length() + right.bit_length() > limits.max_int_bits:
                    raise LimitHit(f"computes a product of over {limits.max_int_bits} bits")
            for seq, n in ((left, right), (right, left)):
                if isinstance(n, int) and isinstance(seq, str | list | tuple):
                    self._refuse_size(measure(seq, limits) * max(n, 0), "repeats a value into")
        elif operator == "+" and isinstance(left, str | list | tuple):
            self._refuse_size(measure(left, limits) + measure(right, limits), "concatenates into")
        elif operator == "%" and isinstance(left, str):
            self._refuse_size(self._percent_size(left, right), "formats a string into")
        return super().call_binop(context, operator, left, right)

    def _percent_size(self, fmt: str, args: Any) -> int:
        specs = re.findall(r"%[^a-zA-Z%]*", fmt)
        widths = sum(int(d) for spec in specs for d in _FORMAT_DIGITS.findall(spec))
        if any("*" in spec for spec in specs):
            ints = args if isinstance(args, tuple) else (args,)
            widths += sum(abs(a) for a in ints if isinstance(a, int))
        return len(fmt) + widths + measure(args, self.limits)

    def _format_size(self, fmt: str, args: tuple, kwargs: Mapping[str, Any]) -> int:
        try:
            specs = [spec or "" for _, _, spec, _ in string.Formatter().parse(fmt)]
        except ValueError:
            return len(fmt)  # str.format raises the same error itself
        widths = sum(int(d) for spec in specs for d in _FORMAT_DIGITS.findall(spec))
        nested = sum(abs(a) for a in (*args, *kwargs.values()) if isinstance(a, int))
        return len(fmt) + widths + nested + measure((args, dict(kwargs)), self.limits)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        __self.tick()
        method = getattr(__obj, "__wrapped__", __obj)  # str.format comes wrapped by the sandbox
        owner = getattr(method, "__self__", None)
        name = getattr(method, "__name__", "")
        if isinstance(owner, str | bytes | int):
            if name in _WIDTH_METHODS:
                for a in (*args, *kwargs.values()):
                    __self._refuse_int(a, f"calls {name} with")
                if name == "expandtabs" and isinstance(owner, str):
                    width = next(iter((*args, *kwargs.values())), 8)
                    size = len(owner) + owner.count("\t") * (width if isinstance(width, int) else 8)
                    __self._refuse_size(size, "expands tabs into")
            elif name in ("format", "format_map") and isinstance(owner, str):
                if name == "format_map":
                    mapping = args[0] if args and isinstance(args[0], Mapping) else {}
                    size = __self._format_size(owner, (), mapping)
                else:
                    size = __self._format_size(owner, args, kwargs)
                __self._refuse_size(size, "formats a string into")
            elif name == "join" and isinstance(owner, str) and args:
                items = list(args[0])
                __self._refuse_size(_join_size(owner, items, __self.limits), "joins into")
                args = (items, *args[1:])
            elif name == "replace" and isinstance(owner, str) and len(args) >= 2:
                count = args[2] if len(args) > 2 else kwargs.get("count")
                size = _replace_size(owner, args[0], args[1], count, __self.limits)
                __self._refuse_size(size, "replaces text into")
        return super().call(__context, __obj, *args, **kwargs)

    def getattr(self, obj: Any, attribute: str) -> Any:
        return self.checked(super().getattr(obj, attribute))

    def getitem(self, obj: Any, argument: Any) -> Any:
        return self.checked(super().getitem(obj, argument))

    def guard_arguments(self, func: Callable[..., Any], name: str) -> Callable[..., Any]:
        """The filter or test `func` behind the size check of each of its arguments: most
        print their value (`trim`, `upper`, `e`, `safe`, `urlize`, ...) or compare values
        (`eq`, `in`), which for a value of shared references grows without bound. jinja's
        context, eval context or environment, passed first to some, is not checked."""
        skip = int(hasattr(func, "jinja_pass_arg"))
        checked = self.checked

        @functools.wraps(func)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            for value in args[skip:]:
                checked(value)
            for value in kwargs.values():
                checked(value)
            return func(*args, **kwargs)

        return guarded

    def guard_filter(self, func: Callable[..., Any], name: str) -> Callable[..., Any]:
        """The filter `func` behind the size check registered for filter `name`, which
        estimates the output from the bound arguments (jinja's pass-context marker is kept
        by functools.wraps)."""
        check = _FILTER_CHECKS[name]
        try:
            signature = inspect.signature(func)  # of the sync filter, for an async variant
        except (TypeError, ValueError):  # a C function without one: its first argument only
            signature = inspect.signature(lambda value, *args, **kwargs: None)
        # An async variant of a filter without context gets jinja's eval context as a first
        # argument that its sync signature lacks: it is passed through, not bound.
        first = next(iter(signature.parameters), "")
        skip = int(hasattr(func, "jinja_pass_arg") and first not in ("eval_ctx", "environment"))

        @functools.wraps(func)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = signature.bind(*args[skip:], **kwargs)
            except TypeError:
                return func(*args, **kwargs)  # the filter reports its own misuse
            bound.apply_defaults()
            self._refuse_size(check(bound.arguments, self), f"asks the {name} filter for")
            return func(*args[:skip], *bound.args, **bound.kwargs)

        return guarded


def _join_size(sep: Any, items: list[Any], limits: TemplateLimits) -> int:
    total = measure(sep, limits) * max(len(items) - 1, 0)
    for item in items:
        total += measure(item, limits)
        if total > limits.max_size:
            break
    return total


def _replace_size(s: Any, old: Any, new: Any, count: Any, limits: TemplateLimits) -> int:
    """The length of `str(s).replace(old, new, count)`, at most (s may not be a str yet)."""
    size = len(s) if isinstance(s, str) else measure(s, limits)
    if not (isinstance(old, str) and isinstance(new, str)) or len(new) <= len(old):
        return size
    hits = s.count(old) if isinstance(s, str) and old else size + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    return size + hits * (len(new) - len(old))


def _materialize(arguments: dict[str, Any], key: str) -> list[Any]:
    items = list(arguments[key])
    arguments[key] = items  # the filter gets the same items, not a spent iterator
    return items


def _check_join(a: dict[str, Any], env: BoundedSandbox) -> int:
    return _join_size(a["d"], _materialize(a, "value"), env.limits)


def _lines(text: Any, size: int) -> int:
    """Lines of `text` (at most its size plus one when it is not a string yet)."""
    return text.count("\n") + 1 if isinstance(text, str) else size + 1


def _check_width(key: str, per_line: bool) -> Callable[[dict[str, Any], BoundedSandbox], int]:
    def check(a: dict[str, Any], env: BoundedSandbox) -> int:
        text = a.get("s", a.get("value"))
        size, width = measure(text, env.limits), a[key]
        width = measure(width, env.limits) if not isinstance(width, int) else max(width, 0)
        return size + (_lines(text, size) if per_line else 1) * width

    return check


def _check_wordwrap(a: dict[str, Any], env: BoundedSandbox) -> int:
    text, width, wrap = a["s"], a["width"], a["wrapstring"]
    size = measure(text, env.limits)
    breaks = size // max(width, 1) if isinstance(width, int) else size
    return size + (breaks + _lines(text, size)) * max(measure(wrap, env.limits), 1)


def _check_count(key: str) -> Callable[[dict[str, Any], BoundedSandbox], int]:
    def check(a: dict[str, Any], env: BoundedSandbox) -> int:
        n = a[key]
        return abs(n) if isinstance(n, int) else 0

    return check


def _check_sum(a: dict[str, Any], env: BoundedSandbox) -> int:
    if not isinstance(a["start"], int | float):
        raise LimitHit("sums non-numbers with the sum filter (only numbers are added here)")
    return 0


def _check_value(a: dict[str, Any], env: BoundedSandbox) -> int:
    return measure(a.get("value", a.get("s")), env.limits)


def _check_tojson(a: dict[str, Any], env: BoundedSandbox) -> int:
    indent = a.get("indent")
    if isinstance(indent, int) and indent > 64 or isinstance(indent, str) and len(indent) > 64:
        raise LimitHit("calls tojson with an indent over 64")
    separators = a.get("separators") or a.get("kw", {}).get("separators") or ()
    if sum(measure(x, env.limits) for x in separators) > 16:
        raise LimitHit("calls tojson with separators over 16 characters")
    # ensure_ascii writes a character outside ASCII as up to 12 (a surrogate pair of \\uXXXX)
    return measure(a["value"], env.limits) * (12 if a.get("ensure_ascii") else 2)


def _check_format(a: dict[str, Any], env: BoundedSandbox) -> int:
    args = a.get("kwargs") or a.get("args") or ()
    value = a["value"]
    if not isinstance(value, str):
        return measure(value, env.limits) + measure(args, env.limits)
    return env._percent_size(value, args)


def _check_replace(a: dict[str, Any], env: BoundedSandbox) -> int:
    return _replace_size(a["s"], a["old"], a["new"], a["count"], env.limits)


_FILTER_CHECKS: dict[str, Callable[[dict[str, Any], BoundedSandbox], int]] = {
    "join": _check_join,
    "center": _check_width("width", per_line=False),
    "indent": _check_width("width", per_line=True),
    "wordwrap": _check_wordwrap,
    "batch": _check_count("linecount"),
    "slice": _check_count("slices"),
    "sum": _check_sum,
    "string": _check_value,
    "pprint": _check_value,
    "format": _check_format,
    "replace": _check_replace,
    "tojson": _check_tojson,
}
