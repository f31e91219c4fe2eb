"""Replayed launches of the shipped Triton solutions on a GPU (Note [launch replay]).

``test_replay.py`` checks the bookkeeping on the CPU with a stand-in launcher; here the
launches are Triton's compiled kernels, routed through the generated dispatchers. Every
routed call, replayed or not, must give exactly what the solution called directly gives, as
batch sizes, alignment, aliasing (the in-place fused_add_rmsnorm) and CUDA-graph capture vary.
Skipped without a CUDA GPU.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton")

import fibgen.runtime as rt  # noqa: E402
from fibgen.format.models import Solution  # noqa: E402
from fibgen.runtime.launch import fast as launch  # noqa: E402
from fibgen.runtime.solutions import loading as solutions  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
HIDDEN, EPS = 4096, 1e-5


def _solution(name: str) -> Solution:
    (path,) = sorted((ROOT / "solutions").rglob(f"{name}.json"))
    return Solution.model_validate(json.loads(path.read_text(encoding="utf-8")))


@pytest.fixture
def routed():
    from fibgen_kernels.fused_add_rmsnorm import fused_add_rmsnorm
    from fibgen_kernels.rmsnorm import rmsnorm

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rt.enable_apply(
            {
                "rmsnorm_h4096": _solution("triton_rmsnorm_h4096"),
                "fused_add_rmsnorm_h4096": _solution("triton_fused_add_rmsnorm_h4096"),
            },
            strict=True,
        )
    yield rmsnorm, fused_add_rmsnorm
    rt.disable_apply()


def _direct(name):
    """The solution's entry, loaded as the dispatcher loads it but without replay."""
    return solutions._import_solution(solutions.Entry("d", name, solution=_solution(name)))


def _launches() -> int:
    return sum(
        r.launches
        for m in list(__import__("sys").modules.values())
        if getattr(m, "__name__", "").startswith("_fibgen_solution_")
        for v in list(vars(m).values())
        if (r := launch.accelerated(v)) is not None
    )


def test_replayed_rmsnorm_equals_the_solution(routed):
    rmsnorm, _ = routed
    direct = _direct("triton_rmsnorm_h4096")
    gen = torch.Generator(device="cuda").manual_seed(1)
    w = torch.randn(HIDDEN, device="cuda", generator=gen).bfloat16()
    for rows in (1, 7, 64, 1, 1024, 7, 65536 // 16):
        for offset in (0, 0, 0, 0, 0, 8, 3):  # element offsets: 16-byte aligned or not
            base = torch.randn(rows * HIDDEN + offset, device="cuda", generator=gen).bfloat16()
            x = base[offset:].view(rows, HIDDEN)
            expected = torch.empty_like(x)
            direct(x, w, expected)
            got = rmsnorm(x, w, EPS)
            assert torch.equal(got, expected), (rows, offset)
    before = _launches()
    x = torch.randn(7, HIDDEN, device="cuda").bfloat16()
    for _ in range(10):
        rmsnorm(x, w, EPS)
    assert _launches() == before, "a settled layout went through the solution's launches"


def test_replayed_in_place_fused_add_rmsnorm(routed):
    _, fused = routed
    direct = _direct("triton_fused_add_rmsnorm_h4096")
    gen = torch.Generator(device="cuda").manual_seed(2)
    w = torch.randn(HIDDEN, device="cuda", generator=gen).bfloat16()
    for rows in (1, 3, 1, 3, 1, 3, 128, 128, 128, 128):
        x = torch.randn(rows, HIDDEN, device="cuda", generator=gen).bfloat16()
        r = torch.randn(rows, HIDDEN, device="cuda", generator=gen).bfloat16()
        x2, r2 = x.clone(), r.clone()
        direct(x2, r2, w, x2, inplace=True)
        fused(x, r, w, EPS)
        assert torch.equal(x, x2) and torch.equal(r, r2), rows


def test_replay_inside_a_cuda_graph(routed):
    rmsnorm, _ = routed
    w = torch.randn(HIDDEN, device="cuda").bfloat16()
    x = torch.randn(5, HIDDEN, device="cuda").bfloat16()
    for _ in range(4):  # settle the layout first
        rmsnorm(x, w, EPS)
    out = torch.empty_like(x)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        rmsnorm(x, w, EPS, out=out)
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        rmsnorm(x, w, EPS, out=out)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        expected = torch.empty_like(x)
        _direct("triton_rmsnorm_h4096")(x, w, expected)
        assert torch.equal(out, expected)
