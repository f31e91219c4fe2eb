"""The error type of the format layer, and the wording of pydantic's validation errors.

Pydantic's own messages speak about Python types ("Input should be a valid integer"). A
dataset curator edits JSON, so every problem is rewritten here as ``where: what is wrong``
with JSON spellings (``null``, ``true``) and, for unknown keys, the keys that are allowed.
"""

from __future__ import annotations

import json
import os
import typing
from typing import Any, Union

from fibgen.format.schema_walk import allowed_keys_at, strip_union_tags

if typing.TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError

# The error type that the models' cross-field checks raise. Its ``ctx["problems"]`` carries
# every problem found, so one load reports all of them rather than only the first.
PROBLEMS_ERROR_TYPE = "fibgen_problems"


class FormatError(ValueError):
    """A file of the dataset that cannot be read: ``path:line:col: message``."""

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]"],
        message: str,
        line: int | None = None,
        col: int | None = None,
    ) -> None:
        self.path = str(path)
        self.message = message
        self.line = line
        self.col = col
        super().__init__(self.__str__())

    def __str__(self) -> str:
        where = self.path
        if self.line is not None:
            where += f":{self.line}"
            if self.col is not None:
                where += f":{self.col}"
        return f"{where}: {self.message}"

    def __reduce__(self) -> tuple[Any, ...]:
        # The default reduce passes only ``args`` (the rendered text) back to __init__.
        return (type(self), (self.path, self.message, self.line, self.col))


class NotJSONError(FormatError):
    """A JSONL line that is not JSON, or not UTF-8: torn by a writer stopped mid-line
    (Note [torn lines] in fibgen/format/dataset/writers.py), or damaged otherwise."""


class FormatWarning(UserWarning):
    """A dataset file that loads, with something ignored: ``path:line: message``."""

    def __init__(
        self, path: Union[str, "os.PathLike[str]"], message: str, line: int | None = None
    ) -> None:
        self.path = str(path)
        self.message = message
        self.line = line
        super().__init__(self.__str__())

    def __str__(self) -> str:
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        return f"{where}: {self.message}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.message, self.line))


def format_loc(loc: tuple[Union[str, int], ...]) -> str:
    """Render a pydantic error location as a JSON path such as ``inputs.q.shape[1]``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "[key]":
            out += " (key)"
        elif part.isidentifier():
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part, ensure_ascii=False)}]"
    return out or "(top level)"


def _json_value(value: Any, limit: int = 60) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


_EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "tuple_type": "a list",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "none_required": "null",
}


def _strip_union_tags(loc: tuple[Any, ...], root: type[BaseModel] | None) -> tuple[Any, ...]:
    # Pydantic puts the tag of a discriminated union into the location
    # (``axes.M.const.value``); a curator never wrote that part, so drop it.
    if root is None:
        return loc
    return strip_union_tags(root, loc)


def _allowed_keys(root: type[BaseModel] | None, loc: tuple[Any, ...]) -> list[str]:
    if root is None:
        return []
    return allowed_keys_at(root, loc)


def validation_messages(exc: ValidationError, root: type[BaseModel] | None = None) -> list[str]:
    """Rewrite every error of a pydantic ValidationError as ``where: what is wrong``."""
    messages: list[str] = []
    for err in exc.errors(include_url=False):
        raw_loc = tuple(err.get("loc", ()))
        kind = err["type"]
        ctx = err.get("ctx") or {}
        value = err.get("input")
        if kind == PROBLEMS_ERROR_TYPE:
            prefix = format_loc(_strip_union_tags(raw_loc, root)) if raw_loc else ""
            for problem in ctx.get("problems", ()):
                messages.append(f"{prefix}.{problem}" if prefix else problem)
            continue
        loc = _strip_union_tags(raw_loc, root)
        if kind in ("missing", "extra_forbidden") and loc:
            parent, key = loc[:-1], loc[-1]
            where = format_loc(parent) if parent else "(top level)"
            if kind == "missing":
                messages.append(f"{where}: missing required key {json.dumps(key)}")
            else:
                allowed = _allowed_keys(root, raw_loc[:-1])
                hint = f" (allowed keys: {', '.join(allowed)})" if allowed else ""
                messages.append(f"{where}: unknown key {json.dumps(key)}{hint}")
            continue
        if len(loc) >= 2 and loc[-1] == "[key]":
            # A bad key of a map: name the map, then the key.
            where = f"{format_loc(loc[:-2])}: key {_json_value(loc[-2])}"
        else:
            where = format_loc(loc)
        if kind == "value_error":
            text = str(ctx.get("error", err["msg"]))
            messages.append(f"{where}: {text}")
        elif kind in ("literal_error", "enum"):
            expected = ctx.get("expected", "")
            messages.append(f"{where}: {_json_value(value)} is not allowed; expected {expected}")
        elif kind == "union_tag_invalid":
            key = str(ctx.get("discriminator", "type")).strip("'")
            messages.append(
                f"{where}: {json.dumps(key)} is {_json_value(ctx.get('tag'))}; expected one of "
                f"{ctx.get('expected_tags')}"
            )
        elif kind == "union_tag_not_found":
            key = str(ctx.get("discriminator", "type")).strip("'")
            messages.append(f"{where}: missing required key {json.dumps(key)}")
        elif kind == "string_too_short":
            messages.append(f"{where}: must not be an empty string")
        elif kind == "too_short":
            messages.append(f"{where}: must not be empty")
        elif kind in ("greater_than_equal", "greater_than", "less_than", "less_than_equal"):
            sign = {
                "greater_than_equal": ">=",
                "greater_than": ">",
                "less_than": "<",
                "less_than_equal": "<=",
            }[kind]
            bound = next(iter(ctx.values()), "?")
            messages.append(f"{where}: must be {sign} {bound}, got {_json_value(value)}")
        elif kind in _EXPECTED:
            messages.append(
                f"{where}: expected {_EXPECTED[kind]}, got {_describe_type(value)} "
                f"{_json_value(value)}"
            )
        else:
            messages.append(f"{where}: {err['msg']}")
    return messages


def unknown_key_messages(
    root: type[BaseModel], found: list[tuple[tuple[Any, ...], str]]
) -> list[str]:
    """``where: unknown key "k" ignored (allowed keys: ...)`` for each key found."""
    messages = []
    for loc, key in found:
        where = format_loc(_strip_union_tags(loc, root)) if loc else "(top level)"
        allowed = _allowed_keys(root, loc)
        hint = f" (allowed keys: {', '.join(allowed)})" if allowed else ""
        messages.append(f"{where}: unknown key {json.dumps(key)} ignored{hint}")
    return messages


def join_messages(messages: list[str]) -> str:
    """Join several problems of one file into a single FormatError message."""
    if len(messages) == 1:
        return messages[0]
    return f"{len(messages)} problems:\n" + "\n".join(f"  - {m}" for m in messages)
