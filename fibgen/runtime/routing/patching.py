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
            warnings.warn(
                f"fibgen: cannot import {'.'.join(parts[:i])} to patch {path}: {exc}",
                stacklevel=2,
            )
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


def patch(
    path: str, wrapper: Callable[..., Any], done: list[Patch], aliases: Aliases | None = None
) -> Callable[..., Any] | None:
    """Put ``wrapper`` at ``path`` and at every alias of it; return what was there.
    ``aliases``: the index of the package's bindings to use (default: the process's `INDEX`)."""
    located = _locate(path)
    if located is None:
        return None
    owner, attr = located
    if isinstance(owner, type):
        raw = owner.__dict__.get(attr)
        if isinstance(raw, classmethod):
            warnings.warn(f"fibgen: {path} is a classmethod; it is not patched", stacklevel=2)
            return None
        if isinstance(raw, staticmethod):
            new = staticmethod(wrapper)
            done.append(Patch(owner, attr, raw, new))
            setattr(owner, attr, new)
            return raw.__func__
    old = getattr(owner, attr)
    if not isinstance(owner, type):
        # Every binding of ``old`` in the package's modules, the path's own among them.
        index = INDEX if aliases is None else aliases
        index.replace(path.split(".")[0], old, wrapper, done, at=(owner, attr))
        if vars(owner).get(attr) is not wrapper:  # an owner outside the package's modules
            done.append(Patch(owner, attr, vars(owner).get(attr, INHERITED), wrapper))
            setattr(owner, attr, wrapper)
            index.note(owner, attr, wrapper)
        return old
    done.append(Patch(owner, attr, vars(owner).get(attr, INHERITED), wrapper))
    setattr(owner, attr, wrapper)
    # Methods bound under a second name (``begin_forward = plan``) are the same call.
    for alias, value in list(vars(owner).items()):
        if value is old and alias != attr:
            done.append(Patch(owner, alias, value, wrapper))
            setattr(owner, alias, wrapper)
    return old


# Note [plan state]
# A wrapper's run() computes with what the last plan() left on the wrapper, not with what
# fibgen captured. The two part when that state changes behind fibgen's back: a plan()
# through a method bound before apply was enabled (``plan = w.plan`` cached by an engine),
# or the deprecated ``forward(q, kv, logits_soft_cap=30.0, ...)``, which sets
# ``_logits_soft_cap``, ``_sm_scale``, ``_window_left`` (and ``_causal``) and calls run().
# Routing such a run with the captured plan would be a silent wrong result.
#
# So each captured plan carries a stamp of the wrapper's state, and a run is routed only
# while the stamp still stands: one attribute read and an identity test per run. The stamp
# is an attribute that, in FlashInfer 0.7.2, every successful plan() assigns on every
# backend path and every forward()/forward_return_lse() assigns too:
#
# - the paged decode, paged prefill and ragged prefill wrappers: ``_pos_encoding_mode``,
#   a str (``"NONE"``), which their run() reads by value. Right after a plan fibgen saw,
#   the value is replaced by an equal str that is a distinct object (`fresh_state`), so
#   that any later assignment, even of "NONE" again, replaces that very object.
#   ``_plan_info`` would not do: the trtllm-gen, cudnn and cutile backends set it to None
#   (or leave it), and forward() does not touch it.
# - the MLA wrapper: ``_input_contract``, a new object built by every plan(); it has no
#   forward().
# - the two POD wrappers: ``_pos_encoding_mode``, as the decode wrapper; they have no
#   forward().
# - BatchAttention: ``_plan_info``, a new object from every plan() (the kernel's schedule);
#   it has no forward().
# - BlockSparseAttentionWrapper: ``_pos_encoding_mode``, as the decode wrapper; its forward()
#   assigns it too. Its cake and VSA backends return from plan() before assigning it, so a
#   wrapper of those backends never has the stamp and its runs are not routed. The same
#   holds for VariableBlockSparseAttentionWrapper.
# - the PrimTS decode, MLA decode and block-sparse (contiguous and paged) wrappers:
#   ``_plan_state``, the new record every successful plan() publishes (a failed re-plan
#   leaves the previous one); no forward().
# - BatchPrefillCuteDSLWrapper: ``_mask_spec``, a new MaskSpec built by every plan() that
#   gets past its checks; no forward().
# - BatchMLADecodeCuteDSLWrapper: ``_variant``, a new StandardAttention built by every plan()
#   given no variant (the only plans routed); no forward().
# - MultiLevelCascadeAttentionWrapper has none: its plan() assigns nothing on the wrapper but
#   plans the per-level prefill wrappers it holds, and its ``forward`` is its ``run``.
#
# A wrapper without an entry here (a stand-in in tests, an API outside FlashInfer) is
# routed on the plan fibgen saw, with no stamp. ``run_return_lse`` is a partialmethod of
# the original run, so it never reaches fibgen and computes with the wrapper's own state.
PLAN_STATE = {
    "flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.plan": "_pos_encoding_mode",
    "flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper.plan": "_pos_encoding_mode",
    "flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper.plan": "_pos_encoding_mode",
    "flashinfer.mla.BatchMLAPagedAttentionWrapper.plan": "_input_contract",
    "flashinfer.pod.PODWithPagedKVCacheWrapper.plan": "_pos_encoding_mode",
    "flashinfer.pod.BatchPODWithPagedKVCacheWrapper.plan": "_pos_encoding_mode",
    "flashinfer.attention.BatchAttention.plan": "_plan_info",
    "flashinfer.sparse.BlockSparseAttentionWrapper.plan": "_pos_encoding_mode",
    "flashinfer.sparse.VariableBlockSparseAttentionWrapper.plan": "_pos_encoding_mode",
    "flashinfer.attention.prims_ts.decode.BatchDecodePagedTSWrapper.plan": "_plan_state",
    "flashinfer.attention.prims_ts.mla_decode.BatchMLADecodePagedTSWrapper.plan": "_plan_state",
    "flashinfer.attention.prims_ts.block_sparse.BlockSparseTSWrapper.plan": "_plan_state",
    "flashinfer.attention.prims_ts.block_sparse.BlockSparsePagedTSWrapper.plan": "_plan_state",
    "flashinfer.cute_dsl.attention.wrappers.batch_prefill.BatchPrefillCuteDSLWrapper.plan": (
        "_mask_spec"
    ),
    "flashinfer.cute_dsl.attention.wrappers.batch_mla.BatchMLADecodeCuteDSLWrapper.plan": "_variant",
}

# The stamp of an attribute that was missing at plan time: no later read is this object,
# so the runs after such a plan are not routed.
_ABSENT = object()
_ref = weakref.ref


class PlanStore:
    """A family's captured plans per wrapper instance (weakly held), with their stamps.

    ``get`` gives the plan only while the wrapper's state is the one it was captured with
    (Note [plan state]); ``state`` says why a run has no plan. Generated dispatchers call
    ``get(self)`` on every run and ``store[self] = plan`` from ``_capture``.
    """

    __slots__ = ("data", "attr", "_remove", "__weakref__")

    def __init__(self, plan_path: str | None = None) -> None:
        self.data: dict[weakref.ref, tuple[Any, Any]] = {}
        self.attr = PLAN_STATE.get(plan_path) if plan_path is not None else None
        selfref = _ref(self)

        def remove(key: weakref.ref, selfref: weakref.ref = selfref) -> None:
            store = selfref()
            if store is not None:
                store.data.pop(key, None)

        self._remove = remove

    def get(self, instance: Any, default: Any = None) -> Any:
        entry = self.data.get(_ref(instance))
        if entry is None:
            return default
        attr = self.attr
        if attr is not None and getattr(instance, attr, None) is not entry[1]:
            return default
        return entry[0]

    def __getitem__(self, instance: Any) -> Any:
        return self.data[_ref(instance)][0]

    def __setitem__(self, instance: Any, plan: Any) -> None:
        stamp = getattr(instance, self.attr, _ABSENT) if self.attr is not None else None
        self.data[_ref(instance, self._remove)] = (plan, stamp)

    def __contains__(self, instance: Any) -> bool:
        try:
            return _ref(instance) in self.data
        except TypeError:
            return False

    def __len__(self) -> int:
        return len(self.data)

    def pop(self, instance: Any, default: Any = None) -> Any:
        entry = self.data.pop(_ref(instance), None)
        return default if entry is None else entry[0]

    def clear(self) -> None:
        self.data.clear()

    def state(self, instance: Any) -> str:
        """Why ``get`` has no plan for a wrapper: "plan:unseen" or "plan:changed"."""
        if instance in self and self.get(instance) is None:
            return "plan:changed"
        return "plan:unseen"


def fresh_state(instance: Any, attr: str | None) -> None:
    """Make the stamp attribute of a wrapper an object no other assignment can produce.

    A str is replaced by an equal str built anew (two non-empty halves joined always make a
    new object): the wrapper reads the same value, and the next plan()/forward() that
    assigns the attribute, with whatever value, breaks the stamp (Note [plan state]).
    """
    if attr is None:
        return
    value = getattr(instance, attr, None)
    if type(value) is str and len(value) >= 2:
        try:
            setattr(instance, attr, value[:1] + value[1:])
        except (AttributeError, TypeError):
            pass


def patch_plan(
    path: str,
    hooks: Sequence[tuple[PlanStore, Callable[..., Any]]],
    done: list[Patch],
) -> Callable[..., Any] | None:
    """Replace a wrapper's ``plan`` by one that runs it, then lets every family keep its plan.

    Each hook is (store, capture): the store of a family's plans per wrapper, and the
    generated ``_capture`` that fills it. A plan that raises leaves no plan kept, so the
    runs after it are not routed; so does a hook that raises. Each plan kept carries the
    stamp of the wrapper state it was made with (Note [plan state]).
    """
    located = _locate(path)
    if located is None:
        return None
    owner, attr = located
    original_plan = getattr(owner, attr)
    state = PLAN_STATE.get(path)

    @functools.wraps(original_plan)
    def plan(*args: Any, **kwargs: Any) -> Any:
        instance = args[0] if args else kwargs.get("self")
        for store, _ in hooks:
            try:
                store.pop(instance, None)
            except TypeError:  # an instance that cannot be weakly referenced
                pass
        result = original_plan(*args, **kwargs)
        fresh_state(instance, state)
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


class Aliases:
    """Where each object is bound in the modules of a package, to patch its re-exports.

    Re-exports such as ``flashinfer.rmsnorm`` are bound at import time to the function object
    itself, so every module of the package holding that object is patched too. Looking for
    it in every namespace of the package, once per API, cost enable_apply about 1.5 s for
    FlashInfer's 124 patched functions (hundreds of modules, each patch a scan of them all);
    an index of the namespaces answers each API at once. One index serves the whole process
    (`INDEX`): reading FlashInfer's namespaces again took 0.2 s or more of every enable.

    Modules imported since the last look (patching one API imports its module) are read
    before each answer, and every binding is checked to still hold the object before it is
    replaced. The index is trusted for an object only while it knows the path being patched
    as a binding of it: an object bound since the namespaces were read (a stand-in put in
    FlashInfer's place, perhaps at several names) is not, and the package is read again.
    """

    def __init__(self) -> None:
        # id(object) -> {(id(module), attr): (module, attr)}
        self._where: dict[int, dict[tuple[int, str], tuple[Any, str]]] = {}
        self._read: dict[str, Any] = {}  # module name -> the module object read under it
        self._looked: dict[str, int] = {}  # per package: len(sys.modules) at the last look

    def _look(self, top: str, again: bool = False) -> None:
        if not again and self._looked.get(top) == len(sys.modules):
            return
        self._looked[top] = len(sys.modules)
        prefix = top + "."
        for name, module in list(sys.modules.items()):
            if module is None or (not again and self._read.get(name) is module):
                continue
            if name != top and not name.startswith(prefix):
                continue
            self._read[name] = module
            for attr, value in list(getattr(module, "__dict__", {}).items()):
                if not isinstance(value, types.ModuleType):
                    self.note(module, attr, value)

    def replace(
        self,
        top: str,
        old: Any,
        wrapper: Callable[..., Any],
        done: list[Patch],
        at: tuple[Any, str] | None = None,
    ) -> None:
        """Bind ``wrapper`` wherever a module of package ``top`` binds ``old``.

        ``at``: the module and name ``old`` was found at; the package is read again when the
        index does not know that binding of ``old``."""
        self._look(top)
        if at is not None and (id(at[0]), at[1]) not in self._where.get(id(old), {}):
            self._look(top, again=True)
        for module, attr in list(self._where.get(id(old), {}).values()):
            if getattr(module, "__dict__", {}).get(attr) is old:
                done.append(Patch(module, attr, old, wrapper))
                setattr(module, attr, wrapper)
                self.note(module, attr, wrapper)

    def note(self, module: Any, attr: str, value: Any) -> None:
        """``module.attr`` is ``value`` now (a patch made elsewhere)."""
        self._where.setdefault(id(value), {})[(id(module), attr)] = (module, attr)


# The index of every package's bindings, kept for the life of the process (see Aliases).
INDEX = Aliases()


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
