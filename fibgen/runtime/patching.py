"""Replace an API at a dotted path (and its module-level aliases) and put it back."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# ``Patch.old`` of an attribute that the owner only inherited: restoring deletes it.
INHERITED = object()


@dataclass(frozen=True)
class Patch:
    """One attribute replaced: restoring sets ``owner.attr`` back to ``old``."""

    owner: Any
    attr: str
    old: Any


def _locate(path: str) -> tuple[Any, str] | None:
    """The object holding the last part of ``path``, and that part; None when unreachable."""
    parts = path.split(".")
    # Look before importing: an API whose package is not installed is simply not patched.
    if parts[0] not in sys.modules:
        try:
            if importlib.util.find_spec(parts[0]) is None:
                return None
        except (ImportError, ValueError):
            return None
    for i in range(len(parts) - 1, 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        except Exception as exc:
            warnings.warn(f"fibgen: cannot import {'.'.join(parts[:i])} to patch {path}: {exc}")
            return None
        try:
            for part in parts[i:-1]:
                owner = getattr(owner, part)
        except AttributeError:
            return None
        return (owner, parts[-1]) if hasattr(owner, parts[-1]) else None
    return None


def original(path: str) -> Callable[..., Any] | None:
    """The callable at ``path`` as it is now, or None when it cannot be reached."""
    located = _locate(path)
    if located is None:
        return None
    owner, attr = located
    return getattr(owner, attr)


def patch(path: str, wrapper: Callable[..., Any], done: list[Patch]) -> Callable[..., Any] | None:
    """Put ``wrapper`` at ``path`` and at every alias of it; return what was there."""
    located = _locate(path)
    if located is None:
        return None
    owner, attr = located
    if isinstance(owner, type):
        raw = owner.__dict__.get(attr)
        if isinstance(raw, classmethod):
            warnings.warn(f"fibgen: {path} is a classmethod; it is not patched")
            return None
        if isinstance(raw, staticmethod):
            done.append(Patch(owner, attr, raw))
            setattr(owner, attr, staticmethod(wrapper))
            return raw.__func__
    old = getattr(owner, attr)
    done.append(Patch(owner, attr, vars(owner).get(attr, INHERITED)))
    setattr(owner, attr, wrapper)
    if not isinstance(owner, type):
        _patch_aliases(path.split(".")[0], old, wrapper, done)
    return old


def _patch_aliases(top: str, old: Any, wrapper: Callable[..., Any], done: list[Patch]) -> None:
    # Re-exports such as ``flashinfer.rmsnorm`` are bound at import time to the function
    # object itself, so every module of the package holding that object is patched too.
    prefix = top + "."
    for name, module in list(sys.modules.items()):
        if module is None or (name != top and not name.startswith(prefix)):
            continue
        namespace = getattr(module, "__dict__", {})
        for attr in [a for a, v in namespace.items() if v is old]:
            done.append(Patch(module, attr, old))
            setattr(module, attr, wrapper)


class ApiDefault:
    """A parameter default that is an expression of the API's own module (an enum member).

    A generated wrapper cannot evaluate ``ActivationType.Swiglu.value`` without importing the
    API; it carries this placeholder, and `adopt_defaults` replaces it by the original's value
    when the API is found.
    """

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def adopt_defaults(wrapper: Callable[..., Any], found: Callable[..., Any]) -> None:
    """Give ``wrapper`` the original's values for its placeholder defaults."""
    import inspect

    code = getattr(wrapper, "__code__", None)
    if code is None:
        return
    try:
        real = {
            n: p.default
            for n, p in inspect.signature(found).parameters.items()
            if p.default is not inspect.Parameter.empty
        }
    except (TypeError, ValueError):  # a builtin without a signature: keep the placeholders
        return
    defaults = list(wrapper.__defaults__ or ())
    positional = code.co_varnames[: code.co_argcount]
    first = len(positional) - len(defaults)
    for i, value in enumerate(defaults):
        if isinstance(value, ApiDefault) and positional[first + i] in real:
            defaults[i] = real[positional[first + i]]
    wrapper.__defaults__ = tuple(defaults) or None
    kw = dict(wrapper.__kwdefaults__ or {})
    for name, value in kw.items():
        if isinstance(value, ApiDefault) and name in real:
            kw[name] = real[name]
    wrapper.__kwdefaults__ = kw or None


def restore(done: list[Patch]) -> None:
    """Undo patches, last first, and empty the list."""
    while done:
        p = done.pop()
        if p.old is INHERITED:
            delattr(p.owner, p.attr)
        else:
            setattr(p.owner, p.attr, p.old)
