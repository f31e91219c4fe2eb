"""Session-wide test settings for tests/ and generated/tests/."""

import os
import re
from pathlib import Path

import pytest
import torch

# Without a GPU, Triton kernels run under Triton's interpreter. The choice is made when a
# kernel is decorated, so it must hold from the start of the session: a kernel module imported
# by one test before another test set it would otherwise mix compiled and interpreted kernels.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Note [one thread per worker]: each test worker gets its share of the cores for torch's
# intra-op threads, and the processes its tests start inherit it. At torch's default, every
# worker ran a thread per core: two workers on two cores kept four OpenMP threads spinning for
# two cores, and the generated tests took 221 s instead of 112 s (three times the CPU time).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _THREADS = max(1, len(os.sched_getaffinity(0)) // _WORKERS)
    torch.set_num_threads(_THREADS)
    os.environ["OMP_NUM_THREADS"] = str(_THREADS)

# The native result check (Note [result check] in fibgen/runtime/checking/result_check.py) is built in
# the background on the first value-returning hit of a process. Tests that point
# FIBGEN_CACHE_DIR at a temporary folder would each build it again; its own tests build it.
os.environ.setdefault("FIBGEN_NATIVE", "0")

# The files that take 15 s or more of one worker, longest first (`--junitxml` of the whole
# suite, test times summed per file, 2026-11-28). Workers take files in collection order
# (`--dist loadfile` with `--no-loadscope-reorder` in pyproject.toml: by default xdist orders
# files by their number of tests, which put the Ray file, ten tests and five minutes, last),
# so these go first: started last, one of them kept a worker busy for minutes after the other
# had finished everything else, while the cores idled. Order only; every test runs.
_LONG_FIRST = (
    "tests/test_bench_ray.py",
    "tests/test_catalogue_refs.py",
    "tests/test_docs.py",
    "tests/test_build.py",
    "tests/test_scaffold.py",
    "generated/tests/test_gemm.py",
    "tests/test_flashinfer_apply.py",
    "tests/test_builders.py",
    "tests/test_bench_isolation.py",
    "tests/test_cli_errors.py",
    "tests/test_packaging.py",
    "tests/test_loop.py",
    "tests/test_bench_triton.py",
    "tests/test_runtime_solutions.py",
    "tests/test_catalogue_gemm.py",
    "tests/test_flashinfer_bench_dataset.py",
    "tests/test_workloads.py",
    "tests/test_cuda_target.py",
    "tests/test_bench_paths.py",
    "tests/test_tracing.py",
    "tests/test_catalogue_attn_b.py",
    "tests/test_fuzz.py",
    "tests/test_bench_hardening.py",
    "generated/tests/test_gemm_bf16.py",
    "tests/test_expressions.py",
    "tests/test_bench_lifetime.py",
    "generated/tests/test_gdn_chunk_prefill.py",
    "tests/test_confined_paths.py",
    "tests/test_packages_of_one_api.py",
    "tests/test_fi_resolve.py",
    "tests/test_tests_target.py",
    "tests/test_reentry.py",
    "tests/test_tvm_ffi.py",
    "generated/tests/test_gemm_fp4.py",
    "tests/test_bench.py",
    "tests/test_layering.py",
    "generated/tests/test_moe_fp4_block_scale_llama4_routing.py",
    "tests/test_flashinfer_conformance.py",
)


# The generated tests of these families stay in the fast lane (`pytest -m "not slow"`): a norm,
# a rope, an attention, a GEMM and a sampler, a few seconds together. Those of every other
# family are marked slow here, as their files are generated and say nothing of speed.
_FAST_GENERATED = (
    "gemma_rmsnorm",
    "apply_rope_with_cos_sin_cache",
    "single_decode",
    "bmm_bf16",
    "sampling_from_probs",
)
_GENERATED_TESTS = "generated/tests/"


def _generated_and_slow(path: str) -> bool:
    """Whether ``path``, relative to the checkout, is a generated test file marked slow."""
    return path.startswith(_GENERATED_TESTS) and path not in {
        f"{_GENERATED_TESTS}test_{family}.py" for family in _FAST_GENERATED
    }


# First, so that the marks are there when `-m` deselects.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    rank = {path: i for i, path in enumerate(_LONG_FIRST)}
    for item in items:
        if _generated_and_slow(item.nodeid.split("::", 1)[0]):
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


_ROOT = Path(__file__).resolve().parent
# A test file slow as a whole says so first in its module-level marks.
_SLOW_FILE = re.compile(r"^pytestmark = (\[\s*)?pytest\.mark\.slow\b", re.M)


def _fast_lane(config) -> bool:
    return " ".join(config.getoption("markexpr").split()) == "not slow"


@pytest.hookimpl(optionalhook=True)  # xdist's hook
def pytest_xdist_auto_num_workers(config):
    # The fast lane runs in one process: its tests take less CPU than each worker spends
    # starting (torch, FlashInfer, collection), so a second worker made it slower on two busy
    # cores. None leaves the count to xdist.
    return 0 if _fast_lane(config) else None


def pytest_ignore_collect(collection_path, config):
    # Under `-m "not slow"` a file slow as a whole would only be imported for all of its tests
    # to be deselected. Not importing it saves seconds (test_flashinfer_apply.py compiles the
    # whole catalogue to parametrize its tests; others import torch._dynamo).
    if not _fast_lane(config):
        return None
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    try:
        path = collection_path.resolve().relative_to(_ROOT).as_posix()
    except ValueError:
        return None
    if _generated_and_slow(path):
        return True
    if _SLOW_FILE.search(collection_path.read_text(encoding="utf-8")):
        return True
    return None
