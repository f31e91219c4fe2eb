"""The GPU conformance suite, on the CPU: its coverage, and what it expects of routing.

``benchmarks/flashinfer_conformance.py`` runs on an H100. Here it is imported with its
cases' tensors on the CPU: every API of the catalogue has cases, the paged decode, paged
and ragged prefill and MLA wrappers and the single-request decode and prefill have a case for
every parameter their rules hold, and
the wrapper cases, run with FlashInfer's wrappers replaced by stand-ins that keep their
signatures, are routed or refused exactly as the suite expects of the real package.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from _shared import require_module

require_module("flashinfer", "flashinfer-python 0.7.2.post1 is not installed (see .ci/run)")

import _flashinfer_cpu as cpu  # noqa: E402
import flashinfer  # noqa: E402

import fibgen.runtime as rt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WRAPPERS = {
    "flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.run": "gqa_paged_decode_h32_kv8_d128_ps64",
    "flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper.run": (
        "gqa_paged_prefill_causal_h32_kv8_d128_ps64"
    ),
    "flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper.run": (
        "gqa_ragged_prefill_causal_h32_kv8_d128"
    ),
    "flashinfer.mla.BatchMLAPagedAttentionWrapper.run": "mla_paged_decode_h16_ckv512_kpe64_ps64",
    "flashinfer.decode.single_decode_with_kv_cache": "single_decode_h32_kv8_d128",
    "flashinfer.prefill.single_prefill_with_kv_cache": "single_prefill_h32_kv8_d128",
}
# Slow as a whole: the conformance suite's calls through the real FlashInfer.
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::RuntimeWarning")]


@functools.cache
def suite():
    os.environ["FIBGEN_CONFORMANCE_DEVICE"] = "cpu"
    try:
        spec = importlib.util.spec_from_file_location(
            "flashinfer_conformance", ROOT / "benchmarks" / "flashinfer_conformance.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules["flashinfer_conformance"] = module
        spec.loader.exec_module(module)
    finally:
        del os.environ["FIBGEN_CONFORMANCE_DEVICE"]
    return module


@functools.cache
def cases(group):
    return tuple(suite().GROUPS[group]())


def test_every_api_of_the_catalogue_has_cases_or_says_why_not():
    s = suite()
    apis = {f.api.path for f in s.FAMILIES.values() if f.api is not None}
    covered = {c.api for group in s.GROUPS for c in cases(group)}
    pending = s._pending()
    assert apis <= covered | set(pending), sorted(apis - covered - set(pending))
    assert not covered & set(pending)
    assert all(why for why in pending.values())
    # The names of kernels that run only on Blackwell each name some API of the catalogue.
    finals = {name for api in apis for name in s._kernel_name(api)}
    assert s._SM100_ONLY <= finals, sorted(s._SM100_ONLY - finals)
    assert {"gdn", "moe"} <= set(s.GROUPS)


@pytest.mark.parametrize("api", sorted(WRAPPERS))
def test_every_ruled_parameter_of_the_wrappers_has_a_case(api):
    s = suite()
    name = WRAPPERS[api]
    given = {p for group in s.GROUPS for c in cases(group) if c.api == api for p in c.params}
    wanted = s.ruled_parameters(s.CATALOGUE[name][1].name)
    assert wanted <= given, sorted(wanted - given)


def test_a_case_not_run_is_not_counted_as_passed(capsys):
    s = suite()
    outcomes = [s.Outcome("a"), s.Outcome("b", not_run="FlashInfer raised X")]
    s._table("some.api", outcomes)
    assert s._finish({}, 0, 1, None) == 0
    out = capsys.readouterr().out
    assert "not run 1" in out and "not run (1): FlashInfer raised X" in out
    assert "0 failure(s), 1 case(s) not run" in out


def test_the_suite_lists_its_cases_and_helps_on_a_cpu(capsys, monkeypatch):
    s = suite()
    monkeypatch.setattr(sys, "argv", ["flashinfer_conformance.py", "--list", "--only", "moe"])
    assert s.main() == 0
    out = capsys.readouterr().out
    assert "falls back by use_shuffled_weight" in out and "moe:" in out
    monkeypatch.setattr(sys, "argv", ["flashinfer_conformance.py", "--only", "nothing"])
    assert s.main() == 2
    monkeypatch.setattr(sys, "argv", ["flashinfer_conformance.py", "--list"])
    assert s.main() == 0
    out = capsys.readouterr().out
    assert "not yet run on a GPU" not in out  # every API with cases has run on one
    assert "no case: flashinfer.pod.PODWithPagedKVCacheWrapper.run" not in out
    # Every API marked as not yet run has cases, so the mark can be taken off only by a run.
    apis = {c.api for group in s.GROUPS.values() for c in group()}
    assert s.NOT_YET_ON_A_GPU <= apis


def test_the_suite_says_what_it_needs_where_flashinfer_is_not_installed(capsys, monkeypatch):
    import importlib.util

    s = suite()
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "flashinfer" else real(name, *a),
    )
    monkeypatch.setattr(sys, "argv", ["flashinfer_conformance.py", "--list"])
    assert s.main() == 2
    assert "needs flashinfer-python 0.7.2" in capsys.readouterr().err


def test_cases_selects_by_label_and_refuses_a_pattern_that_selects_nothing(capsys, monkeypatch):
    s = suite()
    monkeypatch.setattr(s, "CASE_FILTER", None)  # main() sets it; put back after the test
    argv = ["flashinfer_conformance.py", "--list", "--only", "attention_more", "xqa"]
    monkeypatch.setattr(sys, "argv", argv + ["--cases", "^pod_run.*HND"])
    assert s.main() == 0
    listed = [
        line
        for line in capsys.readouterr().out.splitlines()
        if ": falls" in line or ": routed" in line
    ]
    assert listed == ["attention_more: pod_run_h32_kv8_d128_ps16 kv_layout_p=HND: routed"]
    monkeypatch.setattr(sys, "argv", argv + ["--cases", "no_such_case"])
    assert s.main() == 2
    assert "matches no case of attention_more, xqa" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", argv + ["--cases", "pod_run("])
    assert s.main() == 2
    assert "is not a regular expression" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------
# Routing as the suite expects it, with stand-ins for the wrappers
# ---------------------------------------------------------------------------------------


def _mla_stand_in(monkeypatch):
    cls = flashinfer.mla.BatchMLAPagedAttentionWrapper

    def init(self, float_workspace_buffer, *args, **kwargs):
        pass

    def plan(self, *args, **kwargs):
        self._input_contract = object()  # a new one per plan, as FlashInfer's

    def run(self, *args, **kwargs):
        q = kwargs.get("q_nope")
        return torch.zeros_like(q) if q is not None else torch.zeros(1)

    for name, body in (("__init__", init), ("plan", plan), ("run", run)):
        monkeypatch.setattr(cls, name, cpu._keeping_signature(getattr(cls, name), body))


def _more_stand_ins(monkeypatch):
    """The block-sparse, cascade, BatchAttention and POD wrappers under their signatures:
    the constructor keeps the layout, plan assigns what FlashInfer's plan assigns (Note
    [plan state]), run returns zeros."""
    import flashinfer.attention
    import flashinfer.cascade
    import flashinfer.pod
    import flashinfer.sparse

    def init(self, *args, **kwargs):
        given = [a for a in (*args, *kwargs.values()) if a in ("NHD", "HND")]
        self._kv_layout = given[0] if given else "NHD"

    def plan(self, *args, **kwargs):
        self._pos_encoding_mode = kwargs.get("pos_encoding_mode", "NONE")
        self._plan_info = object()

    def run(self, q, *args, **kwargs):
        return torch.zeros_like(q)

    for cls in (
        flashinfer.sparse.BlockSparseAttentionWrapper,
        flashinfer.sparse.VariableBlockSparseAttentionWrapper,
        flashinfer.cascade.MultiLevelCascadeAttentionWrapper,
        flashinfer.attention.BatchAttention,
        flashinfer.pod.PODWithPagedKVCacheWrapper,
        flashinfer.pod.BatchPODWithPagedKVCacheWrapper,
    ):
        for name, body in (("__init__", init), ("plan", plan), ("run", run)):
            monkeypatch.setattr(cls, name, cpu._keeping_signature(getattr(cls, name), body))


@pytest.mark.parametrize(
    "group",
    [
        "decode",
        "prefill",
        "ragged",
        "mla",
        "single",
        "merge",
        "rope_fly",
        "rope",
        "page",
        "rope_fp8",
        "basic_more",
        "norm_quant",
        "mhc",
        "attention_more",
        "xqa",
        "fmha_v2",
        "cudnn",
        "gdn_prefill",
        "cutlass_moe",
    ],
)
def test_the_wrapper_cases_route_or_fall_back_as_the_suite_expects(group, monkeypatch):
    cpu.decode_wrapper_on_cpu(monkeypatch)
    cpu.prefill_wrappers_that_record(monkeypatch)
    _mla_stand_in(monkeypatch)
    _more_stand_ins(monkeypatch)
    wrong, unrunnable = [], []
    for case in cases(group):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rt.enable_apply(case.solutions)
        try:
            case.call()
        except Exception as exc:  # a stand-in cannot compute what FlashInfer would
            error = f"{type(exc).__name__}: {exc}"
        else:
            error = None
        counts = rt.stats().get(case.api, {})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rt.disable_apply()
        routed = counts.get("hit", 0) == 1
        rules = counts.get("rules", {})
        if not counts:
            unrunnable.append((case.label, error))
        elif case.expect is None and not routed:
            wrong.append((case.label, "not routed", counts, error))
        elif case.expect is not None and (routed or list(rules) != [case.expect]):
            wrong.append((case.label, f"expected {case.expect}", rules, error))
    assert not wrong, wrong
    assert not unrunnable, unrunnable


def _api_case(results, expect="eps"):
    """A case of rmsnorm's API whose FlashInfer stand-in returns ``results`` in turn."""
    m = suite()
    calls = iter(results)
    return m.Case(
        api="flashinfer.norm.rmsnorm",
        label="stand-in",
        call=lambda: (next(calls),),
        solutions={"rmsnorm_h4096": lambda hidden_states, weight: hidden_states},
        expect=expect,
    )


def test_a_result_flashinfer_itself_does_not_reproduce_is_not_run(monkeypatch):
    m = suite()
    fixed, other = torch.zeros(4), torch.ones(4)
    monkeypatch.setattr(m, "_apply_on", lambda case: ((other,), None, {"counts": {}}))
    monkeypatch.setattr(m, "_routing", lambda outcome, counts: setattr(outcome, "rule", "eps"))
    # FlashInfer gives `fixed`, then (asked again) `other`: not comparable, not a failure.
    outcome = m.run_case(_api_case([fixed, other]))
    assert outcome.failure is None and "differs between two identical calls" in outcome.not_run
    # FlashInfer gives `fixed` both times while apply on gave `other`: a failure.
    outcome = m.run_case(_api_case([fixed, fixed]))
    assert outcome.not_run is None and outcome.failure.startswith("result 0 differs")


def test_a_call_flashinfer_refuses_must_still_fall_back_by_the_rule_the_case_names(monkeypatch):
    m = suite()

    def refused(case):
        raise ValueError("FlashInfer refuses this call")

    case = _api_case([], expect="eps")
    case.call = lambda: refused(case)
    for counted, failure in (({"eps": 1}, None), ({"weight": 1}, "expected a fallback by eps")):
        counts = {"hit": 0, "rules": counted}
        error = "ValueError: FlashInfer refuses this call"
        monkeypatch.setattr(m, "_apply_on", lambda case: (None, error, {"counts": counts}))
        outcome = m.run_case(case)
        assert "FlashInfer raised ValueError" in outcome.not_run
        if failure is None:
            assert outcome.failure is None
        else:
            assert outcome.failure.startswith(failure), outcome.failure


# ---------------------------------------------------------------------------------------
# The SM90 weight interleave built alone (--interleave-alone)
# ---------------------------------------------------------------------------------------


def test_interleave_alone_points_flashinfer_at_its_module_and_back(monkeypatch):
    import flashinfer.fused_moe.core as core

    s = suite()
    whole = core.get_cutlass_fused_moe_module
    built = object()
    monkeypatch.setattr(s, "_interleave_module", [built])
    monkeypatch.setattr(s, "INTERLEAVE_ALONE", False)
    with s._interleave_kernels():
        assert core.get_cutlass_fused_moe_module is whole
    assert not any("built alone" in c.label for c in s._moe_routing_cases())
    monkeypatch.setattr(s, "INTERLEAVE_ALONE", True)
    with s._interleave_kernels():
        assert core.get_cutlass_fused_moe_module("90") is built
    assert core.get_cutlass_fused_moe_module is whole
    labels = [c.label for c in s._moe_routing_cases() if "built alone" in c.label]
    # the three weight interleaves and Humming's interleaved layout; not the logical one
    assert len(labels) == 4 and not any("logical" in label for label in labels)
    with pytest.raises(RuntimeError, match="inside"):
        with s._interleave_kernels():
            raise RuntimeError("inside")
    assert core.get_cutlass_fused_moe_module is whole


def _target_sm90(monkeypatch):
    """Builds for SM90 with no GPU to detect it from. FlashInfer keeps the architectures it
    detects in one shared set, refreshed in place from the environment; the set is swapped
    for this test's own so that later tests still see a machine without GPUs."""
    from flashinfer.jit import core

    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "9.0a")
    monkeypatch.setattr(core.current_compilation_context, "TARGET_CUDA_ARCHS", set())


def test_the_module_built_alone_exports_what_flashinfer_calls(monkeypatch):
    import inspect

    import flashinfer.fused_moe.prepare as prepare

    s = suite()
    called = "module.interleave_moe_weights_for_sm90_mixed_gemm("
    assert called in inspect.getsource(prepare.interleave_moe_weights_for_sm90_mixed_gemm)
    binding = (ROOT / "benchmarks" / "sm90_interleave.cu").read_text()
    assert "TVM_FFI_DLL_EXPORT_TYPED_FUNC(interleave_moe_weights_for_sm90_mixed_gemm," in binding
    _target_sm90(monkeypatch)
    spec = s._interleave_spec()
    assert [p.name for p in spec.sources] == ["moe_gemm_mixed_utils.cu", "sm90_interleave.cu"]
    assert all(p.is_file() for p in spec.sources)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="compiling CUDA needs nvcc")
def test_the_interleave_kernels_compile_alone_with_flashinfers_flags(tmp_path, monkeypatch):
    # FlashInfer's own build file for the module, objects only: linking needs the driver.
    _target_sm90(monkeypatch)
    spec = suite()._interleave_spec()
    monkeypatch.setattr(type(spec), "build_dir", property(lambda self: tmp_path))
    monkeypatch.setattr(type(spec), "ninja_path", property(lambda self: tmp_path / "build.ninja"))
    spec.write_ninja()
    targets = subprocess.run(
        ["ninja", "-C", str(tmp_path), "-t", "targets", "all"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    objects = [line.split(":")[0] for line in targets.splitlines() if ".o:" in line]
    assert len(objects) == 2, targets
    done = subprocess.run(["ninja", "-C", str(tmp_path), *objects], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:]
    assert all((tmp_path / o).stat().st_size > 0 for o in objects)


def test_the_cutlass_moe_narrowing_keeps_the_bfloat16_gemms_and_their_runner(tmp_path):
    # benchmarks/narrow_cutlass_moe.py, on a copy of the installed FlashInfer's two files.
    installed = Path(flashinfer.__file__).parent
    for part in ("jit/gemm/cutlass/generate_kernels.py", "jit/fused_moe.py"):
        (tmp_path / part).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(installed / part, tmp_path / part)
    script = [sys.executable, str(ROOT / "benchmarks" / "narrow_cutlass_moe.py"), str(tmp_path)]
    for dropped in (13, 0):  # a second edit changes nothing
        done = subprocess.run(script, capture_output=True, text=True, check=True)
        assert done.stdout.strip() == (
            f"narrowed: bfloat16 grouped GEMMs only; {dropped} MoE GEMM runners left out"
        )
    module = (tmp_path / "jit/fused_moe.py").read_text()
    assert module.count("moe_gemm_kernels_") == 1 and "moe_gemm_kernels_bf16_bf16.cu" in module
    generator = (tmp_path / "jit/gemm/cutlass/generate_kernels.py").read_text()
    assert "act == weight == DataType.bf16" in generator
    compile(module, "fused_moe.py", "exec")
    compile(generator, "generate_kernels.py", "exec")
    # The generator's operations the edit keeps: bfloat16 grouped GEMMs, SM90 and SM80.
    spec = importlib.util.spec_from_file_location(
        "flashinfer.jit.gemm.cutlass.narrowed", tmp_path / "jit/gemm/cutlass/generate_kernels.py"
    )
    narrowed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(narrowed)
    out = tmp_path / "generated"
    narrowed.generate_gemm_operations(out, "90;90-real")
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.generated.cu"))
    assert len(files) == 14 and all(f.startswith("gemm_grouped/") for f in files)
    text = "".join((out / f).read_text() for f in files)
    assert "__nv_bfloat16" in text and "__nv_fp8_e4m3" not in text and "half, half" not in text
