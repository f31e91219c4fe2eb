"""Replaying a solution's launches (fibgen/runtime/launch/replay.py, Note [launch replay]).

On the CPU the compiled kernel's launcher is stood in for by a function that does the
kernel's work on the tensors whose addresses it is given, so that a replayed launch computes
for real: a replay that passed a wrong address, a stale scalar or a missing launch gives a
wrong result here. The real launches run on the GPU in ``benchmarks/launch.py``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from torch.utils._python_dispatch import _disable_current_modes  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from fibgen.runtime.launch import fast as launch  # noqa: E402
from fibgen.runtime.launch import replay  # noqa: E402

from _shared import REQUIRE_OPTIONAL  # noqa: E402

STREAM = 77


@pytest.fixture(scope="session")
def native():
    """The C++ table's module, built once (the build is cached per machine)."""
    try:
        return replay.build_native()
    except Exception as exc:
        if REQUIRE_OPTIONAL:
            raise
        pytest.skip(f"the C++ table does not build here: {exc}")


@pytest.fixture(params=["python", "native"])
def wrap(request, monkeypatch):
    """``replay.wrap`` keeping its layouts in the Python or the C++ table."""
    monkeypatch.setenv("FIBGEN_REPLAY", "python")  # no background build meanwhile
    module = request.getfixturevalue("native") if request.param == "native" else None

    def wrap(fn, names, scalars=()):
        names = tuple(names)
        replayer = replay.Replayer(fn, names, tuple(n not in scalars for n in names))
        if module is not None:
            replayer.use(module.Table(replay.stream_of, ()))
        return replayer.call

    return wrap


def _scale_kernel(x_ptr, w_ptr, out_ptr, n, h, scale, BLOCK: tl.constexpr):
    pass


class Memory:
    """The tensors a fake launcher may address, by address."""

    def __init__(self):
        self.tensors = {}

    def __call__(self, *tensors):
        for t in tensors:
            self.tensors[t.data_ptr()] = t
        return tensors[0] if len(tensors) == 1 else tensors


@pytest.fixture
def kernel(monkeypatch):
    """A kernel that computes ``out = x * w * scale`` (rows of ``h``) when launched."""
    memory = Memory()
    fn = JITFunction(_scale_kernel)
    launch.accelerate(fn)
    run = launch.accelerated(fn)
    launches = []

    def launcher(g0, g1, g2, stream, function, metadata, a, b, c, x, w, out, n, h, scale, block):
        launches.append((g0, n, h, scale))
        x, w, out = memory.tensors[x], memory.tensors[w], memory.tensors[out]
        # A real launcher runs no torch operation: the kernel's work is hidden from the
        # recording's dispatch mode as a GPU kernel's is.
        with _disable_current_modes():
            out.copy_(x * w * scale)

    def triton_run(*args, grid, warmup, **kwargs):
        x, w, out, n, h, scale = args
        out.copy_(x * w * scale)  # the compiling call launches too
        return SimpleNamespace(run=launcher, function="F", packed_metadata="M")

    run.triton_run = triton_run
    run.device = lambda: -1  # CPU tensors
    run.stream = lambda device: STREAM
    monkeypatch.setattr(replay, "stream_of", lambda device: STREAM)
    monkeypatch.setattr(replay, "device_now", lambda: -1)  # also where a GPU is present
    snapshot = replay._snapshot

    def snapshot_in_memory(values):
        # The copies that verification replays on are addresses the launcher must know.
        copies = snapshot(values)
        memory(*[c for c in copies or () if isinstance(c, torch.Tensor)])
        return copies

    monkeypatch.setattr(replay, "_snapshot", snapshot_in_memory)
    return SimpleNamespace(fn=fn, memory=memory, launches=launches)


def _solution(kernel, calls, scale=2.0):
    def run(x, w, out):
        calls.append(1)
        kernel.fn[(x.shape[0],)](x, w, out, x.shape[0], x.shape[1], scale, BLOCK=16)

    return run


def _inputs(memory, rows=3, h=8, dtype=torch.float32):
    x = torch.randn(rows, h, dtype=dtype)
    w = torch.randn(h, dtype=dtype)
    out = torch.empty(rows, h, dtype=dtype)
    return memory(x, w, out)


def test_a_layout_seen_twice_is_replayed_on_new_tensors(kernel, wrap):
    calls = []
    call = wrap(_solution(kernel, calls), ("x", "w", "out"))
    for _ in range(3):  # compile, record, record and verify
        x, w, out = _inputs(kernel.memory)
        call(x=x, w=w, out=out)
        torch.testing.assert_close(out, x * w * 2.0)
    assert len(calls) == 3
    for _ in range(5):
        x, w, out = _inputs(kernel.memory)
        assert call(x=x, w=w, out=out) is None
        torch.testing.assert_close(out, x * w * 2.0)
    assert len(calls) == 3, "the solution's Python ran for a replayed layout"
    # 1 compiling call, 2 recorded launches, 1 verification, 5 replays
    assert len(kernel.launches) == 8


def test_each_part_of_the_layout_is_keyed(kernel, wrap):
    calls = []
    call = wrap(_solution(kernel, calls), ("x", "w", "out"))

    def settle(make):
        for _ in range(4):
            x, w, out = make()
            call(x=x, w=w, out=out)
            torch.testing.assert_close(out, x * w * 2.0)

    settle(lambda: _inputs(kernel.memory))
    # Another shape (Triton keys the row count too): compiled, then recorded twice.
    before = len(calls)
    settle(lambda: _inputs(kernel.memory, rows=5))
    assert len(calls) == before + 3

    def misaligned():
        base = torch.randn(3 * 8 + 1)
        x = base[1:].view(3, 8)  # an address 4 bytes past a 16-byte boundary
        w, out = torch.randn(8), torch.empty(3, 8)
        return kernel.memory(x, w, out)

    before = len(calls)
    settle(misaligned)
    assert len(calls) == before + 4, "a layout with a misaligned address is never replayed"

    def strided_weight():  # a layout Triton does not key: recorded twice, no compile
        x, out = torch.randn(3, 8), torch.empty(3, 8)
        w = torch.randn(16)[::2]
        return kernel.memory(x, w, out)

    before = len(calls)
    for _ in range(4):
        x, w, out = strided_weight()
        call(x=x, w=w, out=out)
        torch.testing.assert_close(out, x * w * 2.0)
    assert len(calls) == before + 4, "a non-contiguous tensor is never replayed"
    before = len(calls)
    x, w, out = _inputs(kernel.memory)
    call(x=x, w=w, out=out)
    torch.testing.assert_close(out, x * w * 2.0)
    assert len(calls) == before, "the first layout is still replayed"


def test_a_solution_that_runs_torch_operations_is_never_replayed(kernel, wrap):
    calls = []
    inner = _solution(kernel, calls)

    def run(x, w, out):
        inner(x, w, out)
        out.add_(1.0)  # work no launch shows

    call = wrap(run, ("x", "w", "out"))
    for _ in range(6):
        x, w, out = _inputs(kernel.memory)
        call(x=x, w=w, out=out)
        torch.testing.assert_close(out, x * w * 2.0 + 1.0)
    assert len(calls) == 6


def test_a_launch_on_a_temporary_is_never_replayed(kernel, wrap):
    calls = []

    def run(x, w, out):
        calls.append(1)
        tmp = kernel.memory(torch.empty_like(out))
        kernel.fn[(3,)](x, w, tmp, x.shape[0], x.shape[1], 2.0, BLOCK=16)
        out.copy_(tmp)

    call = wrap(run, ("x", "w", "out"))
    for _ in range(6):
        x, w, out = _inputs(kernel.memory)
        call(x=x, w=w, out=out)
        torch.testing.assert_close(out, x * w * 2.0)
    assert len(calls) == 6


def test_launches_that_change_from_call_to_call_are_never_replayed(kernel, wrap):
    calls = []
    scales = iter([2.0, 3.0] * 10)

    def run(x, w, out):
        calls.append(1)
        kernel.fn[(3,)](x, w, out, x.shape[0], x.shape[1], next(scales), BLOCK=16)

    call = wrap(run, ("x", "w", "out"))
    for i in range(8):
        x, w, out = _inputs(kernel.memory)
        call(x=x, w=w, out=out)
        torch.testing.assert_close(out, x * w * (2.0 if i % 2 == 0 else 3.0))
    assert len(calls) == 8


def test_work_outside_torch_and_the_launches_fails_verification(kernel, wrap):
    """A write that neither a launch nor a torch operation shows (through numpy here, as
    another library's kernel would be) makes the replayed bytes differ: never replayed."""
    calls = []
    inner = _solution(kernel, calls)

    def run(x, w, out):
        inner(x, w, out)
        out.numpy()[0, 0] += 1.0

    call = wrap(run, ("x", "w", "out"))
    for _ in range(6):
        x, w, out = _inputs(kernel.memory)
        call(x=x, w=w, out=out)
        expected = x * w * 2.0
        expected[0, 0] += 1.0
        torch.testing.assert_close(out, expected)
    assert len(calls) == 6


def test_aliased_buffers_are_a_layout_of_their_own(kernel, wrap):
    calls = []
    call = wrap(_solution(kernel, calls), ("x", "w", "out"))
    for _ in range(4):
        x, w, out = _inputs(kernel.memory)
        call(x=x, w=w, out=out)
    for _ in range(4):  # in place: out is x
        x, w, _ = _inputs(kernel.memory)
        expected = x * w * 2.0
        call(x=x, w=w, out=x)
        torch.testing.assert_close(x, expected)
    x, w, out = _inputs(kernel.memory)
    x0 = x.clone()
    call(x=x, w=w, out=out)
    torch.testing.assert_close(out, x0 * w * 2.0)
    torch.testing.assert_close(x, x0)  # the separate-output layout did not write x
    assert len(calls) == 5  # compile, record, verify; record and verify in place


def test_scalars_and_inplace_are_part_of_the_layout(kernel, wrap):
    calls = []

    def run(x, w, scale, out, inplace=False):
        calls.append(1)
        target = x if inplace else out
        kernel.fn[(3,)](x, w, target, x.shape[0], x.shape[1], scale, BLOCK=16)

    call = wrap(run, ("x", "w", "scale", "out"), scalars={"scale"})
    for scale in (2.0, 2.0, 2.0, 2.0, 0.5, 0.5, 0.5, 0.5, 2.0):
        x, w, out = _inputs(kernel.memory)
        call(x=x, w=w, scale=scale, out=out)
        torch.testing.assert_close(out, x * w * scale)
    # 2.0: compile, record, verify; 0.5 (a float Triton does not key): record, verify.
    assert len(calls) == 5
    x, w, out = _inputs(kernel.memory)
    expected = x * w * 2.0
    call(x=x, w=w, scale=2.0, out=out, inplace=True)
    torch.testing.assert_close(x, expected)
    assert len(calls) == 6


def test_a_call_in_another_form_goes_to_the_solution(kernel, wrap):
    calls = []
    call = wrap(_solution(kernel, calls), ("x", "w", "out"))
    x, w, out = _inputs(kernel.memory)
    call(x, w, out)  # positional: keyed the same way
    assert call.__wrapped__ is not None and call.__name__ == "run"
    with pytest.raises(TypeError):
        call(x=x, w=w)


def test_what_is_not_wrapped(monkeypatch):
    def run(**kwargs):
        return None

    assert replay.wrap(run, ("x", "import")) is run
    assert replay.wrap(run, ("a b",)) is run
    assert replay.wrap(run, ("x",), scalars={"x"}) is run  # no tensor to key
    monkeypatch.setenv("FIBGEN_REPLAY", "off")
    assert replay.wrap(run, ("x", "out")) is run


def test_dtype_is_part_of_the_layout(kernel, wrap):
    calls = []
    call = wrap(_solution(kernel, calls), ("x", "w", "out"))
    for dtype in (torch.float32,) * 4 + (torch.float64,) * 4:
        x, w, out = _inputs(kernel.memory, dtype=dtype)
        call(x=x, w=w, out=out)
        torch.testing.assert_close(out, x * w * 2.0)
    # float32: compile, record, verify; float64 (Triton keys dtypes): the same again
    assert len(calls) == 6


def test_a_failing_replayed_launch_raises_as_the_launch_would(kernel, wrap):
    calls = []
    call = wrap(_solution(kernel, calls), ("x", "w", "out"))
    for _ in range(3):
        x, w, out = _inputs(kernel.memory)
        call(x=x, w=w, out=out)
    x, w, out = _inputs(kernel.memory)
    del kernel.memory.tensors[x.data_ptr()]  # the launcher cannot find it: it raises
    with pytest.raises(KeyError):
        call(x=x, w=w, out=out)
    assert len(calls) == 3


def test_a_failed_cpp_build_is_said_and_a_strict_wait_raises(monkeypatch):
    # Benchmarks of routed calls wait strictly: a failed build left replay on its Python
    # tables once, and a routed rmsnorm read 20.6 us against 11.2 without a word but a warning.
    def no_compiler():
        raise OSError("no C++ compiler found\nmore detail")

    monkeypatch.setattr(replay, "build_native", no_compiler)
    monkeypatch.setattr(replay, "_native_state", {})
    assert replay.native_problem() is None
    with pytest.warns(RuntimeWarning, match="did not build .OSError: no C.. compiler found.$"):
        replay._build_native()
    assert "OSError: no C++ compiler found" in replay.native_problem()
    replay.wait_native()  # not strict: waits and says nothing more
    with pytest.raises(RuntimeError, match="launch replay keeps its tables in Python"):
        replay.wait_native(strict=True)
