"""Replace an API at a dotted path (and its module-level aliases) and put it back."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import sys
import types
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# ``Patch.old`` of an attribute that the owner only inherited: restoring deletes it.
INHERITED = object()


@dataclass(frozen=True)
class Patch:
    """One attribute replaced by ``new``: restoring sets ``owner.attr`` back to ``old``."""

    owner: Any
    attr: str
    old: Any
    new: Any = None


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
            new = staticmethod(wrapper)
            done.append(Patch(owner, attr, raw, new))
            setattr(owner, attr, new)
            return raw.__func__
    old = getattr(owner, attr)
    done.append(Patch(owner, attr, vars(owner).get(attr, INHERITED), wrapper))
    setattr(owner, attr, wrapper)
    if isinstance(owner, type):
        # Methods bound under a second name (``begin_forward = plan``) are the same call.
        for alias, value in list(vars(owner).items()):
            if value is old and alias != attr:
                done.append(Patch(owner, alias, value, wrapper))
                setattr(owner, alias, wrapper)
    else:
        _patch_aliases(path.split(".")[0], old, wrapper, done)
    return old


def patch_plan(
    path: str,
    hooks: Sequence[tuple[weakref.WeakKeyDictionary, Callable[..., Any]]],
    done: list[Patch],
) -> Callable[..., Any] | None:
    """Replace a wrapper's ``plan`` by one that runs it, then lets every family keep its plan.

    Each hook is (store, capture): the store of a family's plans per wrapper, and the
    generated ``_capture`` that fills it. A plan that raises leaves no plan kept, so the
    runs after it are not routed; so does a hook that raises.
    """
    located = _locate(path)
    if located is None:
        return None
    owner, attr = located
    original_plan = getattr(owner, attr)

    @functools.wraps(original_plan)
    def plan(*args: Any, **kwargs: Any) -> Any:
        instance = args[0] if args else kwargs.get("self")
        for store, _ in hooks:
            try:
                store.pop(instance, None)
            except TypeError:  # an instance that cannot be weakly referenced
                pass
        result = original_plan(*args, **kwargs)
        for _, capture in hooks:
            try:
                capture(*args, **kwargs)
            except Exception:
                pass  # nothing kept: the runs after this plan take the original API
        return result

    return patch(path, plan, done)


def mismatch(path: str, function: Callable[..., Any]) -> str | None:
    """Why ``function`` cannot stand in for the API at ``path``; None when it can.

    Nothing to say when the API's package is not installed (then there is nothing to patch).
    The API's live signature must equal the generated one: names, kinds and defaults.
    """
    top = path.split(".")[0]
    try:
        installed = top in sys.modules or importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        installed = False
    if not installed:
        return None
    located = _locate(path)
    if located is None:
        return f"{path} does not exist in the installed {top} {_version(top)}"
    live = getattr(*located)
    if isinstance(live, types.ModuleType) or not callable(live):
        return f"{path} is a {type(live).__name__}, not a function"
    try:
        have, want = inspect.signature(live), inspect.signature(function)
    except (TypeError, ValueError):
        return None  # no signature to compare: trust the path
    problems = signature_differences(have, want)
    if problems:
        return f"the signature of {path} differs from the definition's: {'; '.join(problems)}"
    return None


def signature_differences(have: inspect.Signature, want: inspect.Signature) -> list[str]:
    """What differs between a live signature and a generated one (annotations aside)."""
    out = []
    live, gen = list(have.parameters.values()), list(want.parameters.values())
    gen_names = {p.name for p in gen}
    live_names = {p.name for p in live}
    missing = [p.name for p in gen if p.name not in live_names]
    extra = [p.name for p in live if p.name not in gen_names]
    if missing:
        out.append(f"gone: {', '.join(missing)}")
    if extra:
        out.append(f"new: {', '.join(extra)}")
    if missing or extra:
        return out
    for a, b in zip(live, gen):
        if a.name != b.name:
            out.append(f"order: {a.name} where the definition has {b.name}")
            break
        if a.kind != b.kind:
            out.append(f"{a.name} is {a.kind.description}, not {b.kind.description}")
        elif not _same_default(a.default, b.default):
            out.append(f"{a.name} defaults to {a.default!r}, not {b.default!r}")
    return out


def _same_default(a: Any, b: Any) -> bool:
    if isinstance(a, ApiDefault) or isinstance(b, ApiDefault):
        return True  # an expression of the API's module, filled in from the API itself
    if a is b:
        return True
    try:
        return bool(type(a) is type(b) and a == b) or (
            isinstance(a, (int, float)) and isinstance(b, (int, float)) and a == b
        )
    except Exception:
        return False


def _version(package: str) -> str:
    module = sys.modules.get(package)
    return getattr(module, "__version__", "") if module is not None else ""


def _patch_aliases(top: str, old: Any, wrapper: Callable[..., Any], done: list[Patch]) -> None:
    # Re-exports such as ``flashinfer.rmsnorm`` are bound at import time to the function
    # object itself, so every module of the package holding that object is patched too.
    prefix = top + "."
    for name, module in list(sys.modules.items()):
        if module is None or (name != top and not name.startswith(prefix)):
            continue
        namespace = getattr(module, "__dict__", {})
        for attr in [a for a, v in namespace.items() if v is old]:
            done.append(Patch(module, attr, old, wrapper))
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
    """Undo patches, last first, and empty the list.

    An attribute that something else replaced since it was patched is left as it is now:
    putting the old value back would undo that other change.
    """
    while done:
        p = done.pop()
        current = (
            vars(p.owner).get(p.attr, INHERITED)
            if isinstance(p.owner, type)
            else (getattr(p.owner, p.attr, INHERITED))
        )
        if current is not p.new:
            continue
        if p.old is INHERITED:
            delattr(p.owner, p.attr)
        else:
            setattr(p.owner, p.attr, p.old)
