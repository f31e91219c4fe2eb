"""The first routed call of a solution checks that it leaves its inputs as they were.

Note [first-call input check]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A solution computes its outputs; it may not write its inputs. Bench catches one that does
(its inputs are compared after each run: INCORRECT_NUMERICAL, "inputs mutated"), but a
solution registered by hand, or a dataset's winner whose workloads never exposed it, would
otherwise corrupt the caller's tensors on every routed call. So the first call of each
(definition, solution) route runs through a probe: it copies the call's input tensors,
calls the solution, and compares. Unchanged: the route is replaced by the plain one, and
later calls pay nothing. Changed: the inputs are written back from the copies, the call
raises a SolutionError naming them (counted as an ``error``, warned once, raised in strict
mode), it falls back to the original API on the restored inputs, and later calls of that
route fall back, each counted as an ``error``.

What is not checked: inputs that share memory with an output (a destination-passing call may
be handed its input as the output buffer), a route that writes the API's buffers in place
(an ``inplace=True`` route, whose effects include writing inputs), and inputs whose copies
would exceed ``BUDGET`` bytes together (a paged KV cache of a serving engine), taken largest
first. ``FIBGEN_INPUT_CHECK=0`` turns the probe off.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

# Bytes of input copies one probe may make (the largest inputs are left unchecked first).
BUDGET = 1 << 30


def enabled() -> bool:
    return os.environ.get("FIBGEN_INPUT_CHECK", "1").strip() != "0"


def _storages(values: Sequence[Any]) -> set[int]:
    return {
        v.untyped_storage().data_ptr()
        for v in values
        if isinstance(v, torch.Tensor) and v.device.type != "meta"
    }


def snapshot(
    kwargs: dict[str, Any], inputs: Sequence[str], outputs: Sequence[str]
) -> dict[str, torch.Tensor]:
    """Copies of the input tensors a probe checks (Note [first-call input check])."""
    written = _storages([kwargs.get(o) for o in outputs])
    candidates = [
        (n, v)
        for n in inputs
        if isinstance(v := kwargs.get(n), torch.Tensor)
        and v.layout is torch.strided
        and v.device.type != "meta"
        and v.untyped_storage().data_ptr() not in written
    ]
    copies: dict[str, torch.Tensor] = {}
    left = BUDGET
    for n, v in sorted(candidates, key=lambda item: item[1].nbytes):
        if v.nbytes > left:
            break
        left -= v.nbytes
        copies[n] = v.detach().clone()
    return copies


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """One row of bytes per element, whatever the layout (an expanded view has stride 0)."""
    size = t.element_size()
    return t.detach().contiguous().reshape(-1).view(torch.uint8).reshape(-1, size)


def _same(old: torch.Tensor, new: torch.Tensor) -> bool:
    """Whether two tensors of ``_bytes`` hold the same bytes: the usual answer, found by
    comparing whole words (counting the elements that differ takes several times longer)."""
    a, b = old.reshape(-1), new.reshape(-1)
    if a.numel() % 8 == 0:
        try:
            a, b = a.view(torch.int64), b.view(torch.int64)
        except RuntimeError:  # not aligned to a word: byte by byte
            pass
    return torch.equal(a, b)


def differences(before: dict[str, Any], after: dict[str, Any]) -> dict[str, str]:
    """The tensors of ``before`` that ``after`` holds changed, each with a phrase saying how.

    Byte for byte, so that every dtype compares (FP4 has no elementwise equality in torch)
    and a NaN left where it was is no change. Bench judges a solution's call with it (Note
    [mutated inputs] in fibgen/bench/worker.py), apply its first routed call.
    """
    changed = {}
    for name, was in before.items():
        now = after.get(name)
        if not isinstance(was, torch.Tensor) or not isinstance(now, torch.Tensor):
            continue
        if tuple(now.shape) != tuple(was.shape) or now.dtype != was.dtype:
            changed[name] = (
                f"{name!r} is now {list(now.shape)} {now.dtype}, was {list(was.shape)} "
                f"{was.dtype}"
            )
            continue
        old, new = _bytes(was), _bytes(now.to(was.device))
        if _same(old, new):
            continue
        differ = int((old != new).any(-1).sum())
        if differ:
            changed[name] = f"{name!r} ({differ} of {was.numel()} elements differ)"
    return changed


def changed(kwargs: dict[str, Any], copies: dict[str, torch.Tensor]) -> dict[str, str]:
    """The inputs that differ from their copies (with how), written back from them."""
    found = differences(copies, kwargs)
    with torch.no_grad():
        for n in found:
            if kwargs[n].shape == copies[n].shape:
                kwargs[n].copy_(copies[n])
    return found


def probe(
    fn: Callable[..., Any],
    inputs: Sequence[str],
    outputs: Sequence[str],
    passed: Callable[[], None],
    failed: Callable[[list[str]], BaseException],
) -> Callable[..., Any]:
    """``fn``, whose first call runs under the check: ``passed()`` when it left its inputs
    alone, else the exception ``failed(phrases)`` gives is raised (a phrase per changed
    input, saying how), the inputs written back.

    Later calls go straight to ``fn``: a route that wraps the probe (tracing's) keeps it.
    """
    done = False

    order = (*inputs, *outputs)

    def first_call(*args: Any, **kwargs: Any) -> Any:
        # The dispatchers call by keyword; value-style `apply` positionally, in this order.
        nonlocal done
        if done:
            return fn(*args, **kwargs)
        named = {**dict(zip(order, args)), **kwargs}
        copies = snapshot(named, inputs, outputs)
        try:
            result = fn(*args, **kwargs)
        finally:
            found = changed(named, copies)  # written back, whether it returned or raised
        if found:
            raise failed(list(found.values()))
        done = True
        passed()
        return result

    first_call.__wrapped__ = fn  # type: ignore[attr-defined]
    return first_call
