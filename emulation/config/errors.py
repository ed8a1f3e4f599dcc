"""Pydantic's validation errors of a config, worded in one line: the field's dotted path, the value given
and what is allowed (for a key it does not know: the keys allowed at that level)."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

import annotated_types
from pydantic import ValidationError

_BOUNDS = (
    (annotated_types.Gt, "gt", "(", "> "),
    (annotated_types.Ge, "ge", "[", ">= "),
    (annotated_types.Lt, "lt", ")", "< "),
    (annotated_types.Le, "le", "]", "<= "),
)
_BOUND_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}
_UNKNOWN_KEY = {"unexpected_keyword_argument", "extra_forbidden"}


def fields_at(root: type, parts: list[str]) -> list[str] | None:
    """Field names of the section of `root` reached by `parts`, or None when `parts` ends at a leaf.

    Raises KeyError naming the first part that is not a field.
    """
    cls: Any = root
    for part in parts:
        if not dataclasses.is_dataclass(cls):
            return None
        hints = typing.get_type_hints(cls)
        if part not in hints:
            raise KeyError(part)
        cls = hints[part]
    return [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else None


def describe(root: type, error: ValidationError) -> str:
    """The first error of validating `root`, in one line; a key it does not know first (the fields a
    misspelt key leaves missing are errors too)."""
    errors = error.errors()
    err = next((e for e in errors if e["type"] in _UNKNOWN_KEY), errors[0])
    key, annotation, section = _field(root, err["loc"])
    if err["type"] in _UNKNOWN_KEY:
        where = key.rpartition(".")[0] or "the top level"
        allowed = ", ".join(f.name for f in dataclasses.fields(section))
        return f"config: {key!r} is not a field; allowed at {where}: {allowed}"
    if err["type"] in _BOUND_ERRORS:
        return f"{key}={err['input']!r}: must be {_allowed(annotation)}"
    if err["type"] == "missing":
        return f"config: {key}: missing; a value is required"
    if err["type"] == "value_error":
        return f"{key}={err['input']!r}: {err['ctx']['error']}"
    if annotation is not None and isinstance(err.get("input"), str | int | float | bool):
        return f"config: {key}={err['input']!r}: must be {_expected(annotation)}"
    return f"config: {key}={err.get('input')!r}: {err['msg']}"


def _field(root: type, loc: tuple[int | str, ...]) -> tuple[str, Any, Any]:
    """The dotted key (`faults.link_slowdowns[0].start_s`) that `loc` points at, its annotation and the
    section holding it; the tags pydantic adds for a union's members are left out."""
    key = ""
    annotation: Any = root
    section: Any = root
    for part in loc:
        inner = _members(annotation)
        if isinstance(part, int):
            annotation = next(typing.get_args(m)[0] for m in inner if typing.get_origin(m) is tuple)
            key += f"[{part}]"
            continue
        holder = next((m for m in inner if dataclasses.is_dataclass(m)), None)
        if holder is None:
            continue  # a union member's tag
        section = holder
        annotation = typing.get_type_hints(holder, include_extras=True).get(part)
        key += f".{part}" if key else part
    return key, annotation, section


def _members(annotation: Any) -> list[Any]:
    """The types `annotation` may hold: a union's members, without their `Annotated` wrappers."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in _members(arg)]
    return [annotation]


_TYPE_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _expected(annotation: Any) -> str:
    """What a value of `annotation` must be, in words: `a number > 0 or 'auto'`, `'forced' or 'greedy'`."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return " or ".join(_expected(arg) for arg in typing.get_args(annotation))
    if typing.get_origin(annotation) is typing.Annotated:
        inner = typing.get_args(annotation)[0]
        return f"{_expected(inner)} {_allowed(annotation)}".removesuffix(" or null")
    if annotation in _TYPE_WORDS:
        return _TYPE_WORDS[annotation]
    return _allowed(annotation)


def _allowed(annotation: Any) -> str:
    """What a bounded field allows: `> 0`, `in (0, 1]`, `>= 1 or null`, `> 0 or 'auto'`."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return " or ".join(_allowed(arg) for arg in typing.get_args(annotation))
    if annotation is type(None):
        return "null"
    if typing.get_origin(annotation) is typing.Literal:
        return " or ".join(repr(v) for v in typing.get_args(annotation))
    if typing.get_origin(annotation) is not typing.Annotated:
        return typing.cast(str, getattr(annotation, "__name__", str(annotation)))
    inner, *extras = typing.get_args(annotation)
    metadata = [m for extra in extras for m in getattr(extra, "metadata", [extra])]
    bounds = [
        (mark, sign, getattr(m, attr))
        for cls, attr, mark, sign in _BOUNDS
        for m in metadata
        if isinstance(m, cls)
    ]
    if len(bounds) == 2:
        (low_mark, _, low), (high_mark, _, high) = bounds
        text = f"in {low_mark}{low}, {high}{high_mark}"
    else:
        text = " and ".join(f"{sign}{value}" for _, sign, value in bounds)
    nulls = [m for m in _members(inner) if m is type(None)]
    return f"{text} or null" if nulls else text
