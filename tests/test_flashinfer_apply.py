"""Trace Apply over the real FlashInfer 0.7.2 package, on the CPU.

The catalogue's `api`/`plan` lines are compared with the installed package's signatures;
every API of the catalogue is patched and restored, and passes every parameter of its real
signature through unchanged; a live signature that differs is left unpatched with one
warning; and the rules of the definitions are held on calls of FlashInfer's own norm
functions and of its paged decode wrapper (see ``_flashinfer_cpu`` for how they run here).
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import math
import textwrap
import warnings

import pytest
import torch

from _shared import catalogue_module, require_module

require_module("flashinfer", "flashinfer-python 0.7.2.post1 is not installed (see .ci/run)")

import _flashinfer_cpu as cpu  # noqa: E402
import _routable_calls as routable  # noqa: E402
import flashinfer  # noqa: E402
import fibgen.runtime as rt  # noqa: E402
from fibgen.runtime.routing import patching  # noqa: E402
from fibgen.runtime.routing.state import OUTCOMES  # noqa: E402

from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# Slow as a whole: hundreds of calls through the real FlashInfer's API.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:fibgen. .* never matched:RuntimeWarning"),
]


@functools.cache
def _module():
    return catalogue_module()


def _families():
    return [f for f in _module().families() if f.api is not None]


def _live(path: str):
    located = patching._locate(path)
    assert located is not None, f"{path} does not exist in flashinfer {flashinfer.__version__}"
    return getattr(*located)


def _signature(params) -> inspect.Signature:
    kinds = {
        "positional": inspect.Parameter.POSITIONAL_OR_KEYWORD,
        "keyword_only": inspect.Parameter.KEYWORD_ONLY,
        "var_positional": inspect.Parameter.VAR_POSITIONAL,
        "var_keyword": inspect.Parameter.VAR_KEYWORD,
    }
    out = []
    for p in params:
        default = inspect.Parameter.empty
        if p.default is not None:
            try:
                default = eval(p.default, {})
            except Exception:
                default = patching.ApiDefault(p.default)
        out.append(inspect.Parameter(p.name, kinds[p.kind], default=default))
    return inspect.Signature(out)


@pytest.fixture(autouse=True)
def _off():
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rt.disable_apply()


# ---------------------------------------------------------------------------------------
# Signatures
# ---------------------------------------------------------------------------------------


def test_every_api_and_plan_line_is_the_installed_signature():
    checked = []
    for fam in _families():
        for sig in (fam.api, fam.plan):
            if sig is None:
                continue
            live = _live(sig.path)
            assert inspect.isfunction(live), f"{sig.path} is a {type(live).__name__}"
            problems = patching.signature_differences(
                inspect.signature(live), _signature(sig.params)
            )
            assert not problems, f"{fam.name}: {sig.path}: {problems}"
            checked.append(sig.path)
        for rule in fam.rules:
            if rule.kind != "keywords":
                continue
            have = _keywords_taken(_live(rule.path))
            want = [(p.name, eval(p.default, {})) for p in rule.params]
            assert have == want, f"{fam.name}: keywords of {rule.path}"
    assert len(set(checked)) >= 24


def _keywords_taken(function) -> list[tuple[str, object]]:
    """The keywords ``function`` takes through its ``**kwargs``, with their defaults: each
    ``kwargs.pop("k", default)`` of its source in order where it reads them so (FlashInfer's
    masked grouped GEMM takes its tiler so), else its keyword-only parameters."""
    real = inspect.signature(function).parameters.values()
    star = next((p.name for p in real if p.kind is p.VAR_KEYWORD), None)
    popped = []
    if star is not None:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "pop"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == star
                and len(node.args) == 2
            ):
                key, default = node.args
                popped.append((node.lineno, ast.literal_eval(key), ast.literal_eval(default)))
    if popped:
        return [(key, default) for _, key, default in sorted(popped)]
    return [(p.name, p.default) for p in real if p.kind is p.KEYWORD_ONLY]


def test_the_cpu_twins_keep_the_real_signatures():
    for name, twin in cpu.TWINS.items():
        real = getattr(flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper, name)
        assert not patching.signature_differences(
            inspect.signature(real), inspect.signature(twin)
        ), name


# ---------------------------------------------------------------------------------------
# Patching
# ---------------------------------------------------------------------------------------


def _paths():
    return sorted({f.api.path for f in _families()})


def test_enable_patches_every_api_and_its_aliases_and_disable_restores_them():
    before = {path: _live(path) for path in _paths()}
    decode = flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper
    assert decode.begin_forward is decode.plan
    plan_before = decode.plan
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no API of the catalogue is left unpatched
        warnings.filterwarnings("ignore", "fibgen: enable_apply.{}.: no solution given")
        rt.enable_apply({}, strict=True)  # strict: every path, even with nothing to route
    for path, original in before.items():
        assert _live(path) is not original, f"{path} is not patched"
    assert flashinfer.rmsnorm is flashinfer.norm.rmsnorm is not before["flashinfer.norm.rmsnorm"]
    # begin_forward is plan under another name: a run after it must see that plan.
    assert decode.begin_forward is decode.plan is not plan_before
    rt.disable_apply()
    for path, original in before.items():
        assert _live(path) is original
    assert flashinfer.rmsnorm is before["flashinfer.norm.rmsnorm"]
    assert decode.begin_forward is decode.plan is plan_before


def test_a_changed_signature_is_left_unpatched_with_one_warning(monkeypatch):
    def rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None, new_flag=False):  # noqa: A002
        return "the original"

    monkeypatch.setattr(flashinfer.norm, "rmsnorm", rmsnorm)
    with pytest.warns(RuntimeWarning) as caught:
        rt.enable_apply({"rmsnorm_h4096": lambda hidden_states, weight: hidden_states})
    messages = [str(w.message) for w in caught if "flashinfer.norm.rmsnorm" in str(w.message)]
    assert len(messages) == 1
    assert "new: new_flag" in messages[0] and "rmsnorm_h128" in messages[0]
    assert flashinfer.norm.rmsnorm is rmsnorm
    x, w = torch.randn(2, 4096, dtype=torch.bfloat16), torch.randn(4096, dtype=torch.bfloat16)
    assert flashinfer.norm.rmsnorm(x, w) == "the original"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", "fibgen: enable_apply.{}.: no solution given")
        rt.enable_apply({}, strict=True)  # the same problem again: warned once per process


def test_the_warning_names_the_definitions_of_every_family_of_the_path(monkeypatch):
    decode = flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper
    path = "flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.run"

    def run(self, q, paged_kv_cache, *args, new_flag=False, **kwargs):
        return "the original"

    monkeypatch.setattr(decode, "run", run)
    with pytest.warns(RuntimeWarning) as caught:
        rt.enable_apply({}, strict=True)
    (message,) = [str(w.message) for w in caught if path in str(w.message)]
    families = [f for f in _families() if f.api.path == path]
    names = [n for f in families for n in _names_of(f)]
    assert len(families) >= 3 and len(names) >= 17
    assert all(n in message for n in names), [n for n in names if n not in message]
    assert "more" not in message


def test_an_api_with_nothing_to_route_is_left_unpatched():
    # Note [idle paths]: its calls reach FlashInfer at no cost.
    norm, silu = flashinfer.norm.rmsnorm, flashinfer.activation.silu_and_mul
    with rt.enable_apply({"rmsnorm_h4096": lambda hidden_states, weight: hidden_states}):
        assert flashinfer.norm.rmsnorm is not norm
        assert flashinfer.activation.silu_and_mul is silu
    # A name no family knows may be one a name rule spells: every path stays patched.
    with rt.enable_apply({"silu_and_mul_h999_bf16": lambda input: input}):
        assert flashinfer.norm.rmsnorm is not norm
        assert flashinfer.activation.silu_and_mul is not silu
    # Strict mode patches every path: a call nothing serves must raise.
    with rt.enable_apply({}, strict=True):
        assert flashinfer.activation.silu_and_mul is not silu
    assert flashinfer.activation.silu_and_mul is silu


def test_a_missing_target_is_left_unpatched_with_one_warning(monkeypatch):
    monkeypatch.delattr(flashinfer.activation, "gelu_and_mul")
    with pytest.warns(RuntimeWarning, match="flashinfer.activation.gelu_and_mul does not exist"):
        rt.enable_apply({}, strict=True)


def _sample(p: inspect.Parameter, i: int):
    # Distinct values, so that a parameter passed to the wrong place shows.
    if p.kind is p.VAR_POSITIONAL:
        return (f"extra{i}",)
    if p.kind is p.VAR_KEYWORD:
        return {f"extra_keyword{i}": i}
    return f"value-of-{p.name}"


def _recorder(real, calls):
    sig = inspect.signature(real)

    def original(*args, **kwargs):
        calls.append(sig.bind(*args, **kwargs).arguments)
        return "original"

    original.__signature__ = sig
    return original


@pytest.mark.parametrize("path", _paths())
def test_a_patched_api_passes_every_parameter_of_its_real_signature(path, monkeypatch):
    # Whatever a call gives, a patched API hands it to the original unchanged, when nothing
    # is registered and when a solution is (its values fail the definition's checks).
    owner, attr = patching._locate(path)
    real = getattr(owner, attr)
    calls: list = []
    monkeypatch.setattr(owner, attr, _recorder(real, calls))
    fam = next(f for f in _families() if f.api.path == path)
    plan_calls: list = []
    if fam.plan is not None:
        powner, pattr = patching._locate(fam.plan.path)
        real_plan = getattr(powner, pattr)
        monkeypatch.setattr(powner, pattr, _recorder(real_plan, plan_calls))
    for mapping in ({}, {name: (lambda **kw: None) for name in _names_of(fam)}):
        calls.clear()
        rt.enable_apply(mapping)
        patched = getattr(owner, attr)
        assert patched is not real
        instance = object.__new__(owner) if fam.plan is not None else None
        args, kwargs = _every_parameter(real, instance)
        if instance is not None:
            # A plan first, given every parameter too, so that the run is one fibgen may
            # route; the plan reaches the original unchanged.
            plan_args, plan_kwargs = _every_parameter(real_plan, instance, "plan-")
            getattr(powner, pattr)(*plan_args, **plan_kwargs)
            assert plan_calls == [
                inspect.signature(real_plan).bind(*plan_args, **plan_kwargs).arguments
            ]
            plan_calls.clear()
        expected = inspect.signature(real).bind(*args, **kwargs).arguments
        assert patched(*args, **kwargs) == "original"
        assert calls == [expected]


def _every_parameter(real, instance, prefix=""):
    """Arguments for every parameter of ``real``: one extra positional, one extra keyword."""
    args, kwargs = [], {}
    for i, p in enumerate(inspect.signature(real).parameters.values()):
        value = _sample(p, i)
        if isinstance(value, str):
            value = prefix + value
        if p.name == "self":
            args.append(instance)
        elif p.kind is p.VAR_POSITIONAL:
            args.extend(value)
        elif p.kind is p.VAR_KEYWORD:
            kwargs.update(value)
        elif p.kind is p.KEYWORD_ONLY:
            kwargs[p.name] = value
        else:
            args.append(value)
    return args, kwargs


def _names_of(fam):
    return [d.name for d in _module().definitions if d.family == fam.name]


# ---------------------------------------------------------------------------------------
# Every parameter given, on the routed path
# ---------------------------------------------------------------------------------------


@functools.cache
def _catalogue():
    return routable.Catalogue(_module())


def _zeros_solution(name, seen):
    """A solution of the definition that returns zeros of its outputs' shapes and dtypes."""
    d = _catalogue().defs[name]
    consts = dict(d.consts)

    def solution(**inputs):
        seen.append(inputs)
        axes = dict(consts)
        for t in d.inputs:
            value = inputs.get(t.name)
            if t.shape is not None and isinstance(value, torch.Tensor):
                axes.update(zip(t.shape, value.shape))
        # A var axis bound by the scalar input of its name (`var scalar`) is its value.
        axes.update((a.name, int(inputs[a.name])) for a in d.axes if a.scalar)
        device = next(v.device for v in inputs.values() if isinstance(v, torch.Tensor))
        # Zero bytes of an FP4 output (torch fills no float4_e2m1fn_x2 tensor): two +0 codes.
        outputs = tuple(
            torch.zeros(
                [axes[a] for a in t.shape],
                dtype=torch.uint8 if "float4" in t.dtype else routable.torch_dtype(t.dtype),
                device=device,
            ).view(routable.torch_dtype(t.dtype))
            for t in d.outputs
        )
        return outputs[0] if len(outputs) == 1 else outputs

    return solution


def _given(real, args, kwargs) -> dict:
    """The arguments of a call as the real signature binds them; every parameter given."""
    sig = inspect.signature(real)
    bound = sig.bind(*args, **kwargs).arguments
    for p in sig.parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            assert not bound.get(p.name), f"{p.name} must stay empty to be routed"
        elif p.kind is not p.VAR_KEYWORD:
            assert p.name in bound, f"{real.__qualname__}: {p.name} is not given"
    return bound


def _planner(real, calls, path):
    """A stand-in for a wrapper's plan: records, and sets the state FlashInfer's plan sets."""
    sig = inspect.signature(real)
    attr = patching.PLAN_STATE.get(path)

    def plan(*args, **kwargs):
        calls.append(sig.bind(*args, **kwargs).arguments)
        if attr is not None:
            setattr(args[0], attr, "NONE" if attr == "_pos_encoding_mode" else object())

    plan.__signature__ = sig
    return plan


@pytest.mark.parametrize("path", _paths())
def test_a_call_that_gives_every_parameter_at_accepted_values_is_routed(path, monkeypatch):
    # The routed path with every parameter of the real run and plan given (the keywords of
    # a plan's **kwargs too): a patched API never raises where the original would not, and
    # strict mode raises if the call is not served by its solution.
    call = routable.ROUTABLE[path](_catalogue())
    owner, attr = patching._locate(path)
    real = getattr(owner, attr)
    calls: list = []
    monkeypatch.setattr(owner, attr, _recorder(real, calls))
    fam = next(f for f in _families() if f.api.path == path)
    args = call.args
    if fam.plan is not None:
        powner, pattr = patching._locate(fam.plan.path)
        real_plan, plan_calls = getattr(powner, pattr), []
        monkeypatch.setattr(powner, pattr, _planner(real_plan, plan_calls, fam.plan.path))
        instance = object.__new__(owner)
        vars(instance).update(call.state)
        plan_args, plan_kwargs = call.plan
        given = _given(real_plan, (instance, *plan_args), plan_kwargs)
        keywords = [r for r in fam.rules if getattr(r, "target", None) == "plan.kwargs"]
        for rule in keywords:
            assert set(given["kwargs"]) == {p.name for p in rule.params}
        args = (instance, *args)
    _given(real, args, call.kwargs)
    seen: list = []
    rt.enable_apply({call.name: _zeros_solution(call.name, seen)}, strict=True)
    if fam.plan is not None:
        getattr(powner, pattr)(instance, *plan_args, **plan_kwargs)
        assert len(plan_calls) == 1
    getattr(owner, attr)(*args, **call.kwargs)
    counts = rt.stats()[path]
    assert len(seen) == 1 and not calls, counts
    assert counts["hit"] == 1 and sum(counts[o] for o in OUTCOMES) == 1, counts


# ---------------------------------------------------------------------------------------
# Rules, on FlashInfer's own norm functions
# ---------------------------------------------------------------------------------------


def _bf16(*shape):
    return torch.randn(*shape).to(torch.bfloat16)


def _norm_solution(seen):
    def solution(hidden_states, weight):
        seen.append(1)
        return cpu.rms(hidden_states, weight, 1e-5)

    return solution


def test_eps_must_be_the_definitions(monkeypatch):
    cpu.norm_kernels_on_cpu(monkeypatch)
    x, w, seen = _bf16(4, 4096), _bf16(4096), []
    with rt.enable_apply({"rmsnorm_h4096": _norm_solution(seen)}):
        routed = flashinfer.norm.rmsnorm(x, w, eps=1e-5)  # Llama-3.1-8B's epsilon
        other = flashinfer.norm.rmsnorm(x, w, eps=0.5)
        default = flashinfer.rmsnorm(x, w)  # FlashInfer's default 1e-6 is not the model's
    assert len(seen) == 1
    assert torch.equal(routed, cpu.rms(x, w, 1e-5))
    assert torch.equal(other, cpu.rms(x, w, 0.5))
    assert torch.equal(default, cpu.rms(x, w, 1e-6))
    counts = rt.stats()["flashinfer.norm.rmsnorm"]
    assert (counts["hit"], counts["fallback_guard"]) == (1, 2)
    assert counts["rules"] == {"eps": 2}


def test_the_eps_of_each_instance_is_its_own(monkeypatch):
    cpu.norm_kernels_on_cpu(monkeypatch)
    seen = []
    x, w = _bf16(2, 2048), _bf16(2048)
    with rt.enable_apply({"rmsnorm_h2048": _norm_solution(seen)}):
        flashinfer.norm.rmsnorm(x, w, eps=1e-5)  # not Qwen3's
        flashinfer.norm.rmsnorm(x, w, eps=1e-6)
    assert len(seen) == 1


def test_an_ignored_parameter_never_breaks_a_call(monkeypatch):
    cpu.norm_kernels_on_cpu(monkeypatch)
    x, w, seen = _bf16(4, 4096), _bf16(4096), []
    out = torch.empty_like(x)
    with rt.enable_apply({"rmsnorm_h4096": _norm_solution(seen)}):
        assert flashinfer.norm.rmsnorm(x, w, 1e-5, out, enable_pdl=False) is out
        flashinfer.norm.rmsnorm(x, w, eps=1e-5, enable_pdl=True)
    assert len(seen) == 2 and torch.equal(out, cpu.rms(x, w, 1e-5))


@pytest.mark.parametrize(
    ("x", "rule"),
    [
        (torch.randn(4, 4096), "tensor:hidden_states"),  # float32 into a bf16 definition
        (torch.randn(4, 4096).half(), "tensor:hidden_states"),
        (torch.randn(2, 3, 4096).to(torch.bfloat16), "tensor:hidden_states"),  # 3-D
    ],
)
def test_inputs_the_definition_does_not_declare_fall_back(monkeypatch, x, rule):
    cpu.norm_kernels_on_cpu(monkeypatch)
    seen, w = [], torch.randn(4096).to(x.dtype)
    with rt.enable_apply({"rmsnorm_h4096": _norm_solution(seen)}):
        result = flashinfer.norm.rmsnorm(x, w, eps=1e-5)
    assert not seen and torch.equal(result, cpu.rms(x, w, 1e-5))
    assert rt.stats()["flashinfer.norm.rmsnorm"]["rules"] == {rule: 1}


def test_strict_mode_raises_with_the_rule_and_the_value(monkeypatch):
    cpu.norm_kernels_on_cpu(monkeypatch)
    x, w = _bf16(4, 4096), _bf16(4096)
    with rt.enable_apply({"rmsnorm_h4096": _norm_solution([])}, strict=True):
        with pytest.raises(rt.FallbackError, match=r"rmsnorm_h4096.*rule on eps \(eps=0\.5\)"):
            flashinfer.norm.rmsnorm(x, w, eps=0.5)


def test_strict_mode_from_the_environment(monkeypatch):
    cpu.norm_kernels_on_cpu(monkeypatch)
    monkeypatch.setenv("FIBGEN_APPLY_STRICT", "1")
    with rt.enable_apply({}):
        with pytest.raises(rt.FallbackError, match="no solution is registered"):
            flashinfer.norm.rmsnorm(_bf16(1, 4096), _bf16(4096), eps=1e-5)


def test_fused_add_rmsnorm_routed_leaves_what_flashinfer_leaves(monkeypatch):
    cpu.norm_kernels_on_cpu(monkeypatch)
    x, r, w = _bf16(3, 4096), _bf16(3, 4096), _bf16(4096)
    x2, r2 = x.clone(), r.clone()
    flashinfer.norm.fused_add_rmsnorm(x2, r2, w, 1e-5)  # FlashInfer's own, apply off

    def solution(hidden_states, residual, weight):
        return cpu.rms(hidden_states + residual, weight, 1e-5)

    with rt.enable_apply({"fused_add_rmsnorm_h4096": solution}):
        assert flashinfer.norm.fused_add_rmsnorm(x, r, w, eps=1e-5, enable_pdl=True) is None
    assert rt.stats()["flashinfer.norm.fused_add_rmsnorm"]["hit"] == 1
    assert torch.equal(r, r2)
    assert (x.float() - x2.float()).abs().max() <= 0.02


def test_an_inplace_solution_does_the_apis_writes_itself(monkeypatch):
    # Note [in-place solutions]: a destination-passing solution that takes `inplace` is
    # handed FlashInfer's own buffers, and the dispatcher neither computes the effect nor
    # copies back. Without it (bench, flashinfer-bench), it computes the definition.
    cpu.norm_kernels_on_cpu(monkeypatch)
    x, r, w = _bf16(3, 4096), _bf16(3, 4096), _bf16(4096)
    x2, r2 = x.clone(), r.clone()
    flashinfer.norm.fused_add_rmsnorm(x2, r2, w, 1e-5)  # FlashInfer's own, apply off
    calls = []

    def solution(hidden_states, residual, weight, output, inplace=False):
        calls.append((output is hidden_states, inplace))
        total = hidden_states + residual
        output.copy_(cpu.rms(total, weight, 1e-5))
        if inplace:
            residual.copy_(total)

    with rt.enable_apply({"fused_add_rmsnorm_h4096": solution}):
        copies = []
        monkeypatch.setattr(torch.Tensor, "copy_", _counting(torch.Tensor.copy_, copies))
        assert flashinfer.norm.fused_add_rmsnorm(x, r, w, eps=1e-5) is None
        monkeypatch.undo()
    assert calls == [(True, True)]
    assert len(copies) == 2  # the solution's own two writes, none by the dispatcher
    assert torch.equal(r, r2) and torch.equal(x, x2)
    out = torch.empty_like(x)
    solution(x2, r2, w, out)  # as bench calls it: the definition, inputs left alone
    assert calls[-1] == (False, False) and torch.equal(r2, r)


def _counting(method, calls):
    def counted(self, *args, **kwargs):
        calls.append(self)
        return method(self, *args, **kwargs)

    return counted


# ---------------------------------------------------------------------------------------
# Rules, on the paged decode wrapper
# ---------------------------------------------------------------------------------------


def _decode(monkeypatch, layout="NHD"):
    cls = cpu.decode_wrapper_on_cpu(monkeypatch)
    return cls(torch.empty(8, dtype=torch.uint8), kv_layout=layout)


def _plan(wrapper, case, page_size, **kwargs):
    wrapper.plan(
        case["indptr"],
        case["indices"],
        case["last"],
        32,
        8,
        128,
        page_size,
        q_data_type=torch.bfloat16,
        **kwargs,
    )


def _general(seen):
    def solution(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale):
        seen.append({"last": kv_last_page_len, "sm_scale": sm_scale, "k": k_cache})
        return _reference("gqa_paged_decode_h32_kv8_d128_ps64")(
            q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale
        )

    return solution


@functools.cache
def _reference(name):
    (d,) = [d for d in _module().definitions if d.name == name]
    namespace: dict = {}
    exec(d.reference, namespace)
    return namespace["run"]


def test_plan_time_rules_fall_back_and_count_the_rule(monkeypatch):
    wrapper, case, seen = _decode(monkeypatch), cpu.decode_case(), []
    name = "gqa_paged_decode_h32_kv8_d128_ps16"
    with rt.enable_apply({name: _general(seen)}):
        _plan(wrapper, case, 16, logits_soft_cap=30.0)
        capped = wrapper.run(case["q"], (case["k"], case["v"]))
        _plan(wrapper, case, 16)
        plain = wrapper.run(case["q"], (case["k"], case["v"]))
    assert len(seen) == 1
    counts = rt.stats()["flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.run"]
    assert counts["rules"] == {"plan.logits_soft_cap": 1} and counts["hit"] == 1
    # The fallback is FlashInfer's computation, soft cap included; the hit agrees with it.
    wrapper2 = type(wrapper)(torch.empty(8), kv_layout="NHD")
    _plan(wrapper2, case, 16, logits_soft_cap=30.0)
    assert torch.equal(capped, wrapper2.run(case["q"], (case["k"], case["v"])))
    _plan(wrapper2, case, 16)
    assert (
        plain.float() - wrapper2.run(case["q"], (case["k"], case["v"])).float()
    ).abs().max() < 0.02


def test_run_keywords_the_definition_ignores_never_break_a_call(monkeypatch):
    wrapper, case, seen = _decode(monkeypatch), cpu.decode_case(), []
    with rt.enable_apply({"gqa_paged_decode_h32_kv8_d128_ps16": _general(seen)}):
        _plan(wrapper, case, 16)
        out = wrapper.run(case["q"], (case["k"], case["v"]), enable_pdl=False)
        both = wrapper.run(case["q"], (case["k"], case["v"]), return_lse=True, enable_pdl=True)
        scaled = wrapper.run(case["q"], (case["k"], case["v"]), q_scale=2.0)
    assert len(seen) == 2 and isinstance(both, tuple) and out.shape == case["q"].shape
    counts = rt.stats()["flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.run"]
    assert counts["rules"] == {"q_scale": 1}
    assert scaled.shape == case["q"].shape


def test_sm_scale_none_is_resolved_before_the_solution_sees_it(monkeypatch):
    wrapper, case, seen = _decode(monkeypatch), cpu.decode_case(), []
    with rt.enable_apply({"gqa_paged_decode_h32_kv8_d128_ps16": _general(seen)}):
        _plan(wrapper, case, 16, sm_scale=None)
        wrapper.run(case["q"], (case["k"], case["v"]))
        _plan(wrapper, case, 16, sm_scale=0.1)
        wrapper.run(case["q"], (case["k"], case["v"]))
    assert seen[0]["sm_scale"] == 1 / math.sqrt(128) and seen[1]["sm_scale"] == 0.1


def test_partial_last_pages_reach_the_family_that_reads_them(monkeypatch):
    # gqa_paged_decode_full_pages comes first for this API; it claims only plans whose pages
    # are all full, and a solution written for the general family is not called without
    # kv_last_page_len.
    wrapper, seen = _decode(monkeypatch), []
    with rt.enable_apply({"gqa_paged_decode_h32_kv8_d128_ps16": _general(seen)}):
        for full in (False, True):
            case = cpu.decode_case(full=full, seed=int(full))
            _plan(wrapper, case, 16)
            wrapper.run(case["q"], (case["k"], case["v"]))
            assert torch.equal(seen[-1]["last"], case["last"])
    assert len(seen) == 2
    counts = rt.stats()["flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.run"]
    assert counts["hit"] == 2 and counts["error"] == 0


def test_a_full_pages_solution_gets_only_full_pages(monkeypatch):
    wrapper, seen = _decode(monkeypatch), []

    def full_pages(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):
        seen.append(1)
        return q.clone(), torch.zeros(q.shape[:2])

    with rt.enable_apply({"gqa_paged_decode_h32_kv8_d128_ps16": full_pages}):
        for full in (True, False):
            case = cpu.decode_case(full=full, seed=3)
            _plan(wrapper, case, 16)
            wrapper.run(case["q"], (case["k"], case["v"]))
    assert seen == [1]


def test_begin_forward_is_seen_as_plan(monkeypatch):
    wrapper, case, seen = _decode(monkeypatch), cpu.decode_case(), []
    with rt.enable_apply({"gqa_paged_decode_h32_kv8_d128_ps16": _general(seen)}):
        wrapper.begin_forward(
            case["indptr"],
            case["indices"],
            case["last"],
            32,
            8,
            128,
            16,
            q_data_type="bfloat16",
        )
        wrapper.run(case["q"], (case["k"], case["v"]))
    assert len(seen) == 1


def test_a_run_whose_plan_fibgen_did_not_see_is_not_routed(monkeypatch):
    wrapper, case, seen = _decode(monkeypatch), cpu.decode_case(), []
    _plan(wrapper, case, 16)  # before apply is on
    with rt.enable_apply({"gqa_paged_decode_h32_kv8_d128_ps16": _general(seen)}):
        result = wrapper.run(case["q"], (case["k"], case["v"]))
    assert not seen and cpu.CALLS == ["plan", "run"]
    assert result.shape == case["q"].shape
    counts = rt.stats()["flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.run"]
    assert counts["fallback_guard"] == 1 and counts["rules"] == {"plan:unseen": 1}


def _flashinfers(wrapper, case, page_size=16, **plan_kwargs):
    """What FlashInfer (the twin) computes for a fresh wrapper planned with these values."""
    other = type(wrapper)(torch.empty(8, dtype=torch.uint8), kv_layout="NHD")
    _plan(other, case, page_size, **plan_kwargs)
    return other.run(case["q"], (case["k"], case["v"]))


def test_a_replan_through_a_method_bound_before_enable_is_not_routed(monkeypatch):
    # An engine that keeps `w.plan` from before apply was on re-plans behind fibgen's back:
    # the run after it must compute with that plan (soft cap 30), not the one fibgen saw.
    wrapper, case, seen = _decode(monkeypatch), cpu.decode_case(), []
    early_plan = wrapper.plan
    with rt.enable_apply({"gqa_paged_decode_h32_kv8_d128_ps16": _general(seen)}):
        _plan(wrapper, case, 16)
        wrapper.run(case["q"], (case["k"], case["v"]))
        _plan(early_plan.__self__, case, 16)  # through the patched plan again: seen
        early_plan(
            case["indptr"], case["indices"], case["last"], 32, 8, 128, 16,
            q_data_type=torch.bfloat16, logits_soft_cap=30.0,
        )  # fmt: skip
        capped = wrapper.run(case["q"], (case["k"], case["v"]))
        again = wrapper.run(case["q"], (case["k"], case["v"]))
        _plan(wrapper, case, 16)  # a plan fibgen sees routes again
        wrapper.run(case["q"], (case["k"], case["v"]))
    assert len(seen) == 2
    counts = rt.stats()["flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.run"]
    assert counts["hit"] == 2 and counts["rules"] == {"plan:changed": 2}
    expected = _flashinfers(wrapper, case, logits_soft_cap=30.0)
    assert torch.equal(capped, expected) and torch.equal(again, expected)


def test_a_replan_fibgen_did_not_see_raises_in_strict_mode(monkeypatch):
    wrapper, case = _decode(monkeypatch), cpu.decode_case()
    early_plan = wrapper.plan
    with rt.enable_apply({"gqa_paged_decode_h32_kv8_d128_ps16": _general([])}, strict=True):
        _plan(wrapper, case, 16)
        early_plan(case["indptr"], case["indices"], case["last"], 32, 8, 128, 16)
        with pytest.raises(rt.FallbackError, match="plan state changed after the plan"):
            wrapper.run(case["q"], (case["k"], case["v"]))
        other = type(wrapper)(torch.empty(8), kv_layout="NHD")
        with pytest.raises(rt.FallbackError, match="saw no plan"):
            other.run(case["q"], (case["k"], case["v"]))


@pytest.mark.parametrize("method", ["forward", "forward_return_lse"])
def test_the_deprecated_forward_of_the_decode_wrapper_is_not_routed(monkeypatch, method):
    # FlashInfer's own forward sets _logits_soft_cap, _window_left and _sm_scale on the
    # wrapper and calls run: that run must compute with them.
    wrapper, case, seen = _decode(monkeypatch), cpu.decode_case(), []
    asked = {"logits_soft_cap": 30.0, "window_left": 8, "sm_scale": 0.01}
    with rt.enable_apply({"gqa_paged_decode_h32_kv8_d128_ps16": _general(seen)}):
        _plan(wrapper, case, 16)
        result = getattr(wrapper, method)(case["q"], (case["k"], case["v"]), **asked)
        after = wrapper.run(case["q"], (case["k"], case["v"]))  # forward's state stays
    assert not seen
    counts = rt.stats()["flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.run"]
    assert counts["hit"] == 0 and counts["rules"] == {"plan:changed": 2}
    expected = _flashinfers(wrapper, case, **asked)
    assert not torch.equal(expected, _flashinfers(wrapper, case))
    assert torch.equal(result[0] if method == "forward_return_lse" else result, expected)
    assert torch.equal(after, expected)


@pytest.mark.parametrize(
    "cls, run_args",
    [
        ("BatchPrefillWithPagedKVCacheWrapper", "paged"),
        ("BatchPrefillWithRaggedKVCacheWrapper", "ragged"),
    ],
)
def test_the_deprecated_forward_of_the_prefill_wrappers_is_not_routed(monkeypatch, cls, run_args):
    cpu.prefill_wrappers_that_record(monkeypatch)
    wrapper = getattr(flashinfer.prefill, cls)(torch.empty(8))
    qo = torch.tensor([0, 2, 7, 9], dtype=torch.int32)
    q = torch.randn(9, 32, 128, dtype=torch.bfloat16)
    seen = []

    def solution(**inputs):
        seen.append(1)
        return torch.zeros_like(inputs["q"]), torch.zeros(inputs["q"].shape[:2])

    if run_args == "paged":
        k = torch.randn(6, 64, 8, 128, dtype=torch.bfloat16)
        args = (q, (k, k))
        plan_args = (qo, torch.tensor([0, 1, 3, 4], dtype=torch.int32))
        plan_args += (
            torch.arange(4, dtype=torch.int32),
            torch.tensor([5, 64, 9], dtype=torch.int32),
        )
        plan_args += (32, 8, 128, 64)
        name = "gqa_paged_prefill_causal_h32_kv8_d128_ps64"
    else:
        k = torch.randn(12, 8, 128, dtype=torch.bfloat16)
        args = (q, k, k)
        plan_args = (qo, torch.tensor([0, 3, 9, 12], dtype=torch.int32), 32, 8, 128)
        name = "gqa_ragged_prefill_causal_h32_kv8_d128"
    label = f"flashinfer.prefill.{cls}.run"
    with rt.enable_apply({name: _accepting_any(seen)}):
        wrapper.plan(*plan_args, causal=True, q_data_type=torch.bfloat16)
        wrapper.run(*args)
        assert len(seen) == 1, rt.stats()
        wrapper.forward(*args, causal=True, sm_scale=0.01)
        wrapper.forward_return_lse(*args, causal=False)
    assert len(seen) == 1
    assert rt.stats()[label]["rules"] == {"plan:changed": 1}


def _accepting_any(seen):
    def solution(q, **inputs):
        seen.append(1)
        return torch.zeros_like(q), torch.zeros(q.shape[:2])

    return solution


# Wrappers whose plan() leaves nothing on the wrapper to stamp (Note [plan state]).
UNSTAMPED = {
    "flashinfer.cascade.MultiLevelCascadeAttentionWrapper.plan": "plans the wrappers it holds",
}


def test_every_wrapper_of_the_catalogue_has_a_plan_state_its_plan_and_forward_assign():
    # Note [plan state]: the attribute stamped must be assigned by every plan() and by every
    # method that changes what run() computes (forward, forward_return_lse).

    paths = {f.plan.path for f in _families() if f.plan is not None} - set(UNSTAMPED)
    assert paths <= set(patching.PLAN_STATE), paths - set(patching.PLAN_STATE)
    for path in UNSTAMPED:
        owner, _ = patching._locate(path)
        # No stamp: nothing but plan() may change what run() computes.
        assert vars(owner).get("forward") in (None, vars(owner)["run"]), path
        assert "forward_return_lse" not in vars(owner), path
    for path in paths:
        attr = patching.PLAN_STATE[path]
        owner, _ = patching._locate(path)

        def assigns(method: str) -> bool:
            fn = inspect.unwrap(getattr(owner, method))
            tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
            return any(
                isinstance(t, ast.Attribute) and t.attr == attr
                for node in ast.walk(tree)
                if isinstance(node, (ast.Assign, ast.AnnAssign))
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            )

        planners = [m for m in ("plan", "_plan_impl") if m in vars(owner)]
        assert any(assigns(m) for m in planners), f"{path}: no plan assigns {attr}"
        for method in ("forward", "forward_return_lse"):
            if method in vars(owner):
                assert assigns(method), f"{owner.__name__}.{method} does not assign {attr}"


def test_unknown_plan_keywords_and_deprecated_positionals_fall_back(monkeypatch):
    wrapper, case, seen = _decode(monkeypatch), cpu.decode_case(), []
    with rt.enable_apply({"gqa_paged_decode_h32_kv8_d128_ps16": _general(seen)}):
        _plan(wrapper, case, 16, some_future_option=1)
        wrapper.run(case["q"], (case["k"], case["v"]))
        wrapper.plan(case["indptr"], case["indices"], case["last"], 32, 8, 128, 16, "NONE")
        wrapper.run(case["q"], (case["k"], case["v"]))
    assert not seen
    counts = rt.stats()["flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.run"]
    assert counts["rules"] == {"plan.kwargs": 1, "plan.deprecated_positional_args": 1}


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("stacked", [False, True])
def test_kv_layouts_and_stacked_caches_reach_the_solution_as_nhd_views(
    monkeypatch, layout, stacked
):
    wrapper, case, seen = _decode(monkeypatch, layout), cpu.decode_case(), []
    k, v = case["k"], case["v"]
    if layout == "HND":
        k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    cache = torch.stack([k, v], dim=1) if stacked else (k, v)
    with rt.enable_apply({"gqa_paged_decode_h32_kv8_d128_ps16": _general(seen)}):
        _plan(wrapper, case, 16)
        routed = wrapper.run(case["q"], cache)
    rt.disable_apply()
    _plan(wrapper, case, 16)
    original = wrapper.run(case["q"], cache)
    assert len(seen) == 1 and torch.equal(seen[0]["k"], case["k"])
    assert (routed.float() - original.float()).abs().max() < 0.02


# ---------------------------------------------------------------------------------------
# Other rule kinds: keywords of a run, results as the API returns them
# ---------------------------------------------------------------------------------------


def test_sampled_ids_come_back_as_flashinfer_returns_them():
    def sampler(probs, top_k):
        return probs.argmax(-1)  # int64, as the definition declares

    probs = torch.softmax(torch.randn(4, 128256), -1)
    with rt.enable_apply({"top_k_sampling_from_probs_v128256": sampler}):
        ids = flashinfer.sampling.top_k_sampling_from_probs(probs, 5)
        with_tensor = flashinfer.sampling.top_k_sampling_from_probs(
            probs, torch.full((4,), 5, dtype=torch.int64)
        )
    assert ids.dtype == torch.int32 and torch.equal(ids.long(), probs.argmax(-1))
    assert with_tensor.dtype == torch.int32
    assert rt.stats()["flashinfer.sampling.top_k_sampling_from_probs"]["hit"] == 2


def test_rules_of_the_module_use_only_known_helpers():
    import fibgen.runtime.routing.rulefns as rulefns
    from fibgen.compiler.rules import RULE_HELPERS

    assert all(callable(getattr(rulefns, name)) for name in RULE_HELPERS)
    importlib.import_module("fibgen_kernels.gqa_paged_decode")


# ---------------------------------------------------------------------------------------
# Families of one API: the reason a call is not routed
# ---------------------------------------------------------------------------------------


def _never(*args, **kwargs):
    raise AssertionError("a refused call reached the solution")


@pytest.mark.parametrize(
    "plan_kwargs, rule",
    [({"causal": False}, "plan.causal"), ({"logits_soft_cap": 30.0}, "plan.logits_soft_cap")],
)
def test_a_rule_refusal_is_counted_as_the_rule_across_the_apis_families(
    monkeypatch, plan_kwargs, rule
):
    # Four families share the paged prefill wrapper; the call below is named by the first,
    # refused by its rule and then handed to three families without a solution for it.
    calls = cpu.prefill_wrappers_that_record(monkeypatch)
    wrapper = flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper(torch.empty(8))
    indptr = torch.tensor([0, 1, 3, 4], dtype=torch.int32)
    qo_indptr = torch.tensor([0, 2, 7, 9], dtype=torch.int32)
    last = torch.tensor([5, 64, 9], dtype=torch.int32)
    k = torch.randn(6, 64, 8, 128, dtype=torch.bfloat16)
    q = torch.randn(9, 32, 128, dtype=torch.bfloat16)
    kwargs = {"causal": True, "q_data_type": torch.bfloat16, **plan_kwargs}
    with rt.enable_apply({"gqa_paged_prefill_causal_h32_kv8_d128_ps64": _never}):
        wrapper.plan(
            qo_indptr, indptr, torch.arange(4, dtype=torch.int32), last, 32, 8, 128, 64, **kwargs
        )
        wrapper.run(q, (k, k))
        # The next call has no solution in any family: that is its reason, not the last
        # call's rule.
        wrapper.plan(
            qo_indptr, indptr, torch.arange(4, dtype=torch.int32), last, 32, 8, 64, 64, **kwargs
        )
        wrapper.run(q[..., :64], (k[..., :64], k[..., :64]))
    counts = rt.stats()["flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper.run"]
    assert counts["rules"] == {rule: 1}
    assert (counts["fallback_guard"], counts["fallback_no_candidate"], counts["hit"]) == (1, 1, 0)
    assert calls == ["plan", "run", "plan", "run"]


def test_a_ragged_refusal_is_counted_as_the_rule_not_as_the_mla_familys_miss(monkeypatch):
    cpu.prefill_wrappers_that_record(monkeypatch)
    wrapper = flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper(torch.empty(8))
    qo = torch.tensor([0, 2, 7, 9], dtype=torch.int32)
    kv = torch.tensor([0, 3, 9, 12], dtype=torch.int32)
    q, k = torch.randn(9, 32, 128, dtype=torch.bfloat16), torch.randn(
        12, 8, 128, dtype=torch.bfloat16
    )
    with rt.enable_apply({"gqa_ragged_prefill_causal_h32_kv8_d128": _never}):
        wrapper.plan(qo, kv, 32, 8, 128, causal=False, q_data_type=torch.bfloat16)
        wrapper.run(q, k, k)
    counts = rt.stats()["flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper.run"]
    assert counts["rules"] == {"plan.causal": 1} and counts["fallback_no_candidate"] == 0


@pytest.mark.parametrize(
    "path",
    ["flashinfer.gdn_decode.gated_delta_rule_decode", "flashinfer.gdn_decode.gated_delta_rule_mtp"],
)
def test_a_routed_gdn_call_returns_what_flashinfer_returns(path, monkeypatch):
    # FlashInfer 0.7.2's gated_delta_rule_decode returns (output, state) and
    # gated_delta_rule_mtp (output, initial_state); `o, s = ...` must work routed too.
    call = routable.ROUTABLE[path](_catalogue())
    owner, attr = patching._locate(path)
    real = getattr(owner, attr)
    given = inspect.signature(real).bind(*call.args, **call.kwargs).arguments
    state = "state" if "state" in given else "initial_state"
    monkeypatch.setattr(owner, attr, _recorder(real, []))
    rt.enable_apply({call.name: _zeros_solution(call.name, [])}, strict=True)
    result = getattr(owner, attr)(*call.args, **call.kwargs)
    assert isinstance(result, tuple) and len(result) == 2
    # The caller's own tensors, as FlashInfer returns them: its output buffer and the state
    # the call updated in place (here with the solution's zeros).
    assert result[0] is given["output"] and result[1] is given[state]
    assert not result[1].any()
    # Without an output buffer, the output is a new tensor; the state is still the caller's.
    output, new_state = getattr(owner, attr)(*call.args, **{**call.kwargs, "output": None})
    assert output is not given["output"] and output.shape == given["output"].shape
    assert new_state is given[state]
    assert rt.stats()[path]["hit"] == 2


@pytest.mark.parametrize(
    "path, returned",
    [
        ("flashinfer.norm.rmsnorm", "out"),  # the output, in the caller's buffer
        ("flashinfer.norm.fused_add_rmsnorm", None),  # written into input and residual
        ("flashinfer.page.append_paged_kv_cache", None),  # written into the cache tuple
    ],
)
def test_a_family_without_returns_keeps_the_default_convention(path, returned, monkeypatch):
    call = routable.ROUTABLE[path](_catalogue())
    owner, attr = patching._locate(path)
    real = getattr(owner, attr)
    given = inspect.signature(real).bind(*call.args, **call.kwargs).arguments
    monkeypatch.setattr(owner, attr, _recorder(real, []))
    rt.enable_apply({call.name: _zeros_solution(call.name, [])}, strict=True)
    result = getattr(owner, attr)(*call.args, **call.kwargs)
    assert result is (None if returned is None else given[returned])
    assert rt.stats()[path]["hit"] == 1


def test_a_moe_call_of_another_top_k_is_not_routed_to_a_top_k_axis_definition(monkeypatch):
    # moe_fp8_block_scale_ds_routing_topk_axis holds top_k as a const axis that sizes no
    # input: a call asking for 4 experts a token must not reach the definition of 8.
    from flashinfer.tllm_enums import ActivationType, Fp8QuantizationType

    path = "flashinfer.fused_moe.trtllm_fp8_block_scale_moe"
    name = "moe_fp8_block_scale_ds_routing_topk8_ng1_kg1_e48_h7168_i2048"
    x, sizes = _catalogue().meta_inputs(name, seq_len=4)
    tensors = ("routing_logits", "routing_bias", "hidden_states", "hidden_states_scale")
    tensors += ("gemm1_weights", "gemm1_weights_scale", "gemm2_weights", "gemm2_weights_scale")
    kwargs = {"routing_method_type": 2, "fp8_quantization_type": Fp8QuantizationType.DeepSeekFp8}
    kwargs |= {"activation_type": ActivationType.Swiglu.value}
    kwargs |= {"output": torch.empty(4, sizes["hidden_size"], dtype=torch.bfloat16, device="meta")}
    owner, attr = patching._locate(path)
    calls: list = []
    monkeypatch.setattr(owner, attr, _recorder(getattr(owner, attr), calls))
    for top_k in (8, 4):
        args = tuple(x[k] for k in tensors) + (sizes["num_experts"], top_k, 1, 1)
        args += (sizes["intermediate_size"], 0, sizes["num_local_experts"], 2.5)
        seen: list = []
        rt.enable_apply({name: _zeros_solution(name, seen)})
        getattr(owner, attr)(*args, **kwargs)
        counts = rt.stats()[path]
        rt.disable_apply()
        if top_k == 8:
            assert len(seen) == 1 and counts["hit"] == 1 and not calls, counts
        else:
            assert not seen and counts["rules"] == {"top_k": 1} and len(calls) == 1, counts


def test_a_deepseek_routed_fp8_block_scale_call_without_scaling_or_bias_is_routed(monkeypatch):
    # FlashInfer reads routed_scaling_factor None as 1 (value_or(1.0)) and routing_bias None as
    # no bias: the definition is handed those values, not the None (which made it raise).
    path = "flashinfer.fused_moe.trtllm_fp8_block_scale_moe"
    call = routable.ROUTABLE[path](_catalogue())
    owner, attr = patching._locate(path)
    calls: list = []
    monkeypatch.setattr(owner, attr, _recorder(getattr(owner, attr), calls))
    num_experts = call.args[8]
    args = list(call.args)
    args[1], args[15] = None, None  # routing_bias, routed_scaling_factor
    seen: list = []
    rt.enable_apply({call.name: _zeros_solution(call.name, seen)}, strict=True)
    getattr(owner, attr)(*args, **call.kwargs)
    assert rt.stats()[path]["hit"] == 1 and not calls
    (inputs,) = seen
    assert float(inputs["routed_scaling_factor"]) == 1.0
    bias = inputs["routing_bias"]
    assert bias.shape == (num_experts,) and bias.dtype == torch.bfloat16
    assert bias.device == call.args[0].device


def test_an_fp8_per_tensor_moe_call_of_another_top_k_is_refused(monkeypatch):
    # The same for the per-tensor-scale MoE, whose definitions hold top_k as a const axis.
    path = "flashinfer.fused_moe.trtllm_fp8_per_tensor_scale_moe"
    call = routable.ROUTABLE[path](_catalogue())
    owner, attr = patching._locate(path)
    calls: list = []
    monkeypatch.setattr(owner, attr, _recorder(getattr(owner, attr), calls))
    assert call.args[9] == 8
    args = (*call.args[:9], 4, *call.args[10:])
    seen: list = []
    rt.enable_apply({call.name: _zeros_solution(call.name, seen)})
    getattr(owner, attr)(*args, **call.kwargs)
    counts = rt.stats()[path]
    assert not seen and counts["rules"] == {"top_k": 1} and len(calls) == 1, counts
