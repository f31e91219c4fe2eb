"""Which calls and tensors tracing keeps: the dump and dedup policies, as arguments or as
the environment spells them."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Union

import torch

DumpPolicy = Union[str, Sequence[str]]
DedupKey = Callable[[str, Mapping[str, int], Mapping[str, Any]], Hashable]
DedupPolicy = Union[str, tuple[str, int], DedupKey]

_INT_DTYPES = frozenset(
    (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool)
)


class TracingConfigError(ValueError):
    """A tracing option that cannot be used; the message says which and why."""


def dump_rule_of(dump: DumpPolicy) -> Callable[[str, torch.Tensor], bool] | None:
    """Which tensors to dump: a predicate over (input name, tensor); None dumps nothing."""
    if isinstance(dump, str):
        if dump == "none":
            return None
        if dump == "all":
            return lambda name, t: True
        if dump == "int":
            # Index tensors (indptr, indices) and flags: random data would make them invalid.
            return lambda name, t: t.dtype in _INT_DTYPES
        raise TracingConfigError(
            f"dump={dump!r}: use 'none', 'all', 'int' or a list of input names"
        )
    names = frozenset(dump)
    if not all(isinstance(n, str) and n for n in names):
        raise TracingConfigError(f"dump={dump!r}: a list of input names must hold names only")
    return DumpByName(names)


class DumpByName:
    """The dump rule of a list of input names, which remembers the input names it was asked
    about: a name no recorded call's input had dumped nothing, and is said so when tracing
    stops (``unmatched``)."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names
        self.asked: set[str] = set()

    def __call__(self, name: str, tensor: torch.Tensor) -> bool:
        self.asked.add(name)
        return name in self.names

    def unmatched(self) -> list[str] | None:
        """The names no recorded call's input had; None when no call was recorded."""
        return sorted(self.names - self.asked) if self.asked else None


def dedup_rule(dedup: DedupPolicy) -> Callable[[str, dict[str, Any], dict[str, Any]], bool]:
    """A predicate (definition, axes, inputs) → keep; it keeps state per definition."""
    seen: dict[tuple[str, Hashable], int] = {}

    def first(limit: int, key: Callable[[str, dict, dict], Hashable]) -> Callable[..., bool]:
        def keep(name: str, axes: dict[str, Any], inputs: dict[str, Any]) -> bool:
            k = (name, key(name, axes, inputs))
            n = seen.get(k, 0)
            if n >= limit:
                return False
            seen[k] = n + 1
            return True

        return keep

    def positive(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TracingConfigError(f"dedup={dedup!r}: the count must be a positive integer")
        return value

    if callable(dedup):
        return first(1, dedup)
    if dedup == "all":
        return lambda name, axes, inputs: True
    if dedup == "axes":
        return first(1, lambda name, axes, inputs: tuple(axes.items()))
    if isinstance(dedup, tuple) and len(dedup) == 2 and dedup[0] == "first":
        return first(positive(dedup[1]), lambda name, axes, inputs: None)
    if isinstance(dedup, tuple) and len(dedup) == 2 and dedup[0] == "axes":
        return first(positive(dedup[1]), lambda name, axes, inputs: tuple(axes.items()))
    raise TracingConfigError(
        f"dedup={dedup!r}: use 'all', 'axes', ('first', k), ('axes', k) or a function "
        "(definition, axes, inputs) -> key that keeps the first record per key"
    )


def parse_dump(text: str) -> DumpPolicy:
    text = text.strip()
    if text in ("", "none", "all", "int"):
        return text or "none"
    return [n.strip() for n in text.split(",") if n.strip()]


def parse_dedup(text: str) -> DedupPolicy:
    text = text.strip()
    kind, _, count = text.partition(":")
    if count:
        try:
            return (kind, int(count))
        except ValueError:
            raise TracingConfigError(
                f"FIBGEN_TRACE_DEDUP={text!r}: the count after ':' must be an integer"
            ) from None
    return text or "all"
