"""Walk a model's annotations along a JSON path: clean error locations, allowed and unknown keys.

The error messages (``fibgen.format.errors``) and the loaders (``fibgen.format.jsonio``) use
these; the models do not, so the messages can name the models without the models naming them.
"""

from __future__ import annotations

import typing
from typing import Annotated, Any, Union

from pydantic import BaseModel


def _unwrap(ann: Any) -> Any:
    while typing.get_origin(ann) is Annotated:
        ann = typing.get_args(ann)[0]
    return ann


def _tag_of(model: Any) -> Any:
    field = getattr(model, "model_fields", {}).get("type")
    return None if field is None else field.default


def _resolve(root: Any, loc: tuple[Any, ...]) -> tuple[tuple[Any, ...], Any]:
    ann: Any = root
    clean: list[Any] = []
    i = 0
    while i < len(loc):
        part = loc[i]
        ann = _unwrap(ann)
        origin = typing.get_origin(ann)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            field = ann.model_fields.get(part) if isinstance(part, str) else None
            if field is None:
                return tuple(clean) + tuple(loc[i:]), None
            clean.append(part)
            ann = field.annotation
        elif origin is dict:
            clean.append(part)
            ann = typing.get_args(ann)[1]
        elif origin in (list, tuple):
            clean.append(part)
            ann = typing.get_args(ann)[0]
        elif origin is Union:
            members = [_unwrap(m) for m in typing.get_args(ann) if m is not type(None)]
            tagged = {_tag_of(m): m for m in members}
            if part in tagged and None not in tagged:
                ann = tagged[part]
                i += 1
                continue
            if len(members) == 1:
                ann = members[0]
                continue
            return tuple(clean) + tuple(loc[i:]), None
        else:
            return tuple(clean) + tuple(loc[i:]), None
        i += 1
    ann = _unwrap(ann)
    if typing.get_origin(ann) is Union:
        members = [_unwrap(m) for m in typing.get_args(ann) if m is not type(None)]
        ann = members[0] if len(members) == 1 else None
    return tuple(clean), ann


def strip_union_tags(root: Any, loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """Drop the union-tag parts that pydantic adds to an error location."""
    return _resolve(root, loc)[0]


def allowed_keys_at(root: Any, loc: tuple[Any, ...]) -> list[str]:
    """The keys a JSON object at ``loc`` under model ``root`` may have."""
    ann = _resolve(root, loc)[1]
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return list(ann.model_fields)
    return []


def strip_unknown_keys(root: Any, obj: Any) -> tuple[Any, list[tuple[tuple[Any, ...], str]]]:
    """``obj`` without the keys that model ``root`` does not know; and each one's (loc, key).

    Walks the JSON value along the model's annotations; a tagged union picks its member by
    ``"type"``. Values that do not have the expected shape are left as they are, for the
    model's validation to report.
    """
    found: list[tuple[tuple[Any, ...], str]] = []
    return _strip(root, obj, (), found), found


def _strip(ann: Any, value: Any, loc: tuple[Any, ...], found: list) -> Any:
    ann = _unwrap(ann)
    origin = typing.get_origin(ann)
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        if not isinstance(value, dict):
            return value
        out = {}
        for key, item in value.items():
            field = ann.model_fields.get(key)
            if field is None:
                found.append((loc, key))
                continue
            out[key] = _strip(field.annotation, item, (*loc, key), found)
        return out
    if origin is dict and isinstance(value, dict):
        item_ann = typing.get_args(ann)[1]
        return {k: _strip(item_ann, v, (*loc, k), found) for k, v in value.items()}
    if origin in (list, tuple) and isinstance(value, list):
        item_ann = typing.get_args(ann)[0]
        return [_strip(item_ann, v, (*loc, i), found) for i, v in enumerate(value)]
    if origin is Union:
        members = [_unwrap(m) for m in typing.get_args(ann) if m is not type(None)]
        if len(members) == 1:
            return _strip(members[0], value, loc, found)
        tagged = {_tag_of(m): m for m in members}
        tag = value.get("type") if isinstance(value, dict) else None
        if None not in tagged and isinstance(tag, str) and tag in tagged:
            # The tag goes into the location, as pydantic puts it into its error locations.
            return _strip(tagged[tag], value, (*loc, tag), found)
    return value
