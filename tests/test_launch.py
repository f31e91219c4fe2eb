"""The fast launch of Triton kernels (fibgen/runtime/launch/fast.py, Note [triton launch]).

Two things are checked here on the CPU. First, that the cache key is at least as fine as
Triton's own specialization: every argument value that Triton tells apart gets a different
key, checked against ``native_specialize_impl`` itself. Second, the bookkeeping of the fast
path: which calls go through Triton, what a cached launch passes to the compiled kernel's
launcher. The launcher and Triton's compile need a GPU, so they are stood in for by a
recorder; the real launches, with every cached launch checked against Triton's binder
(``FIBGEN_CHECK_LAUNCH=1``), run on the GPU in ``benchmarks/launch.py``.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from triton.runtime.jit import JITFunction  # noqa: E402

from fibgen.runtime.launch import fast as launch  # noqa: E402


def _kernel(x_ptr, out_ptr, n, stride, scale, flag, BLOCK: tl.constexpr, EXTRA: tl.constexpr = 3):
    pass


def _jit(fn=_kernel, **kw):
    return JITFunction(fn, **kw)


def _specialization(param, value):
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.nvidia.compiler import CUDABackend

    return native_specialize_impl(
        CUDABackend,
        value,
        param.is_const,
        not param.do_not_specialize,
        not param.do_not_specialize_on_alignment,
    )


def _values():
    """Argument values of every kind Triton specializes on, near every boundary."""
    base = torch.empty(64, dtype=torch.float32)
    tensors = [base, base[1:], base[4:], base.to(torch.bfloat16), base.to(torch.bfloat16)[1:]]
    tensors += [base.to(torch.bfloat16)[8:], base.to(torch.int8)[3:], base.to(torch.int8)[16:]]
    ints = [0, 1, 2, 15, 16, 17, 32, -1, -16, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16]
    ints += [-(2**31), -(2**31) - 1, -(2**31) - 16, 2**40, 2**63 - 16, 2**63, 2**63 + 1, 2**64 - 16]
    return tensors + ints + [0.0, 1.0, 1.5, True, False, None]


@pytest.mark.parametrize("index", range(6))
def test_key_is_at_least_as_fine_as_triton(index):
    """Two values with the same key have the same Triton specialization, slot by slot."""
    fn = _jit()
    param = fn.params[index]
    seen: dict = {}
    plans = []  # kept alive: the key holds the plan, as the fast path's does
    checked = 0
    for first in _values():
        args = [0] * 6
        args[index] = first
        key_fn = launch._key_function(fn.params, 6, ("BLOCK",), tuple(args))
        assert key_fn is not None
        plans.append(key_fn)
        for value in _values():
            args[index] = value
            try:
                key = (key_fn, key_fn(-1, (), *args, BLOCK=16)[0])  # CPU tensors: device -1
            except Exception:
                continue  # another kind than the plan's: the call goes to a plan of its own
            spec = _specialization(param, value)
            assert seen.setdefault(key, spec) == spec, (first, value, key)
            checked += 1
    assert checked > 100


def test_key_respects_do_not_specialize():
    """Parameters that opt out of specialization still get a key at least as fine."""
    fn = _jit(do_not_specialize=["n"], do_not_specialize_on_alignment=["x_ptr"])
    x_param, n_param = fn.params[0], fn.params[2]
    assert n_param.do_not_specialize and x_param.do_not_specialize_on_alignment
    key_fn = launch._key_function(fn.params, 6, (), (torch.empty(4), 0, 5, 0, 0.0, True))
    seen: dict = {}
    for x, n in itertools.product(_values()[:8], [v for v in _values() if type(v) is int]):
        key = key_fn(-1, (), x, 0, n, 0, 0.0, True)[0]
        spec = (_specialization(x_param, x), _specialization(n_param, n))
        assert seen.setdefault(key, spec) == spec


def test_keys_of_runtime_keywords_are_not_made():
    fn = _jit()
    args = (torch.empty(4), torch.empty(4), 4, 1, 1.0, True)
    assert launch._key_function(fn.params, 5, ("flag", "BLOCK"), args[:5]) is None
    assert launch._key_function(fn.params, 6, ("BLOCK",), args) is not None
    assert launch._key_function(fn.params, 6, ("BLOCK", "_private"), args) is None
    assert launch._key_function(fn.params, 1, (), ((1, 2),)) is None  # a tuple argument


class _Recorder:
    """Stands in for Triton's compile-and-launch and for the compiled kernel's launcher."""

    def __init__(self):
        self.compiles = []
        self.launches = []

    def triton_run(self, *args, grid, warmup, **kwargs):
        self.compiles.append((args, grid, kwargs))
        return SimpleNamespace(
            run=lambda *a: self.launches.append(a), function="F", packed_metadata="M"
        )


@pytest.fixture
def fast(monkeypatch):
    fn = _jit()
    launch.accelerate(fn)
    run = launch.accelerated(fn)
    assert isinstance(run, launch.FastRun) and fn.run is run
    recorder = _Recorder()
    run.triton_run = recorder.triton_run
    run.device = lambda: -1  # the CPU tensors' device, as get_device() says
    run.stream = lambda device: 77
    return fn, run, recorder


def _args(offset=0, n=100):
    x = torch.empty(256, dtype=torch.bfloat16)[offset:]
    return (x, x, n, 4096, 0.5, True)


def test_second_call_launches_the_kept_kernel(fast):
    fn, run, rec = fast
    fn[(3,)](*_args(), BLOCK=64)
    assert len(rec.compiles) == 1 and rec.launches == []
    x, out, n, stride, scale, flag = args = _args()
    fn[(5, 2)](*args, BLOCK=64)
    assert len(rec.compiles) == 1 and run.launches == 1
    # grid, stream, function, metadata, no launch metadata or hooks, then every parameter
    # in order: the positional ones (tensors as their addresses, which Triton's launcher
    # takes as they are), the constexpr given by keyword, the default.
    ptrs = (x.data_ptr(), out.data_ptr())
    assert rec.launches == [
        (5, 2, 1, 77, "F", "M", None, None, None, *ptrs, 100, 4096, 0.5, True, 64, 3)
    ]


def test_what_triton_specializes_on_compiles_again(fast):
    fn, run, rec = fast
    fn[(1,)](*_args(), BLOCK=64)
    fn[(1,)](*_args(offset=1), BLOCK=64)  # misaligned pointer
    fn[(1,)](*_args(n=1), BLOCK=64)  # an int equal to 1
    fn[(1,)](*_args(n=16), BLOCK=64)  # a multiple of 16
    fn[(1,)](*_args(n=2**33), BLOCK=64)  # an i64
    fn[(1,)](*_args(), BLOCK=128)  # another constexpr
    fn[(1,)](*_args(), BLOCK=64, num_warps=8)  # another option
    x = torch.empty(256, dtype=torch.float16)
    fn[(1,)](x, x, 100, 4096, 0.5, True, BLOCK=64)  # another dtype
    assert len(rec.compiles) == 8 and rec.launches == []
    fn[(1,)](*_args(offset=3), BLOCK=64)  # misaligned as offset=1: the same kernel
    fn[(1,)](*_args(n=16), BLOCK=64)
    assert len(rec.compiles) == 8 and len(rec.launches) == 2


def test_other_kinds_of_arguments_get_plans_of_their_own(fast):
    fn, run, rec = fast
    fn[(1,)](*_args(), BLOCK=64)
    x = _args()[0]
    fn[(1,)](x, None, 100, 4096, 0.5, True, BLOCK=64)  # None where a tensor was
    fn[(1,)](x, None, 100, 4096, 0.5, True, BLOCK=64)
    fn[(1,)](x, x, 100, 4096, 1, True, BLOCK=64)  # an int where a float was
    fn[(1,)](x, x, 100, 4096, 1, True, BLOCK=64)
    assert len(rec.compiles) == 3 and len(rec.launches) == 2
    assert len(run.plans[(6, "BLOCK")]) == 3


def test_calls_the_key_does_not_cover_go_through_triton(fast, monkeypatch):
    fn, run, rec = fast
    x = _args()[0]
    for _ in range(2):
        fn[(1,)](x, x, 100, 4096, 0.5, flag=True, BLOCK=64)  # runtime argument by keyword
        fn[(1,)](x, x, 100, 4096, 0.5, True, BLOCK=[64])  # unhashable constexpr
        fn[(1,)](x, x, 100, 4096, 0.5, True, BLOCK=x)  # a tensor would be keyed by identity
    assert len(rec.compiles) == 6 and rec.launches == []
    fn[(1,)](*_args(), BLOCK=64)
    chain = run.runtime.launch_enter_hook
    assert type(chain).__name__ == "HookChain" and not chain.calls  # Triton's empty default
    chain.add(_hook)
    try:
        fn[(1,)](*_args(), BLOCK=64)  # a profiler's hook must see the launch
    finally:
        chain.remove(_hook)
    monkeypatch.setattr(run.runtime, "launch_exit_hook", _hook)
    fn[(1,)](*_args(), BLOCK=64)
    assert len(rec.compiles) == 9 and rec.launches == []
    monkeypatch.undo()
    fn[(1,)](*_args(), BLOCK=64)
    assert len(rec.launches) == 1


def _hook(*args):
    pass


def test_callable_grid_sees_every_parameter(fast):
    fn, run, rec = fast
    seen = []

    def grid(meta):
        seen.append(dict(meta))
        return (meta["n"] // meta["BLOCK"],)

    fn[grid](*_args(), BLOCK=10)
    fn[grid](*_args(), BLOCK=10)
    assert rec.launches[0][:3] == (10, 1, 1)
    assert seen[-1]["EXTRA"] == 3 and seen[-1]["n"] == 100 and seen[-1]["scale"] == 0.5


def test_changed_global_is_reported_as_triton_does(fast):
    fn, run, rec = fast
    scope = {"G": 1}
    fn.used_global_vals = {("G", id(scope)): (1, scope)}
    fn[(1,)](*_args(), BLOCK=64)
    fn[(1,)](*_args(), BLOCK=64)
    scope["G"] = 2
    with pytest.raises(RuntimeError, match="Global variable G has changed"):
        fn[(1,)](*_args(), BLOCK=64)


def test_restore_and_switch(monkeypatch, tmp_path):
    fn = _jit()
    assert launch.accelerate(fn) is fn and launch.accelerated(fn) is not None
    launch.accelerate(fn)  # twice changes nothing
    launch.restore(fn)
    assert launch.accelerated(fn) is None and "run" not in fn.__dict__
    monkeypatch.setenv("FIBGEN_TRITON_LAUNCH", "triton")
    module = SimpleNamespace(k=fn)
    assert launch.accelerate_modules([module], fn.fn.__module__) == 0
    monkeypatch.delenv("FIBGEN_TRITON_LAUNCH")
    assert launch.accelerate_modules([module], "elsewhere") == 0  # not the package's own
    assert launch.accelerate_modules([module], fn.fn.__module__) == 1
    assert launch.accelerated(fn) is not None


def test_interpreted_kernels_are_left_alone():
    from triton.runtime.interpreter import InterpretedFunction

    fn = InterpretedFunction(_kernel)
    assert launch.accelerate(fn) is fn and launch.accelerated(fn) is None


def test_solution_loader_accelerates_the_kernels_a_solution_defines(tmp_path):
    """A Triton solution's own kernels are accelerated when it is loaded; torch's are not."""
    from fibgen.format.models import Solution
    from fibgen.runtime.solutions import loading as solutions

    source = """
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction


def _body(x_ptr, BLOCK: tl.constexpr):
    pass


kernel = JITFunction(_body)


def run(x):
    return x
"""
    solution = Solution.model_validate(
        {
            "name": "launch_probe",
            "definition": "d",
            "author": "t",
            "spec": {
                "language": "triton",
                "target_hardware": ["H100"],
                "entry_point": "main.py::run",
                "dependencies": [],
                "destination_passing_style": False,
            },
            "sources": [{"path": "main.py", "content": source}],
        }
    )
    entry = solutions.Entry("d", "solution 'launch_probe'", solution=solution)
    fn = solutions._import_solution(entry)
    import sys

    module = sys.modules[fn.__module__]
    assert launch.accelerated(module.kernel) is not None


def test_a_tensor_on_another_device_goes_through_triton(fast):
    # Triton's launcher checks each address (cuPointerGetAttribute); the cached launch
    # passes addresses, so it takes only tensors of the current device.
    fn, run, rec = fast
    run.device = lambda: 0
    for _ in range(2):
        fn[(1,)](*_args(), BLOCK=64)
    assert len(rec.compiles) == 2 and rec.launches == []


class CudaLauncher:
    """The shape of Triton 3.6's launcher: a C function, called by a Python __call__."""

    def __init__(self, scratch=0):
        self.calls, self.global_scratch_size, self.profile_scratch_size = [], scratch, 0
        self.launch_cooperative_grid, self.launch_pdl = False, True
        self.launch = lambda *a: self.calls.append(("direct", a))

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):
        self.calls.append(("python", (gridX, gridY, gridZ, stream, function, *args)))


def test_the_launchers_c_function_is_called_as_its_python_call_would(fast):
    fn, run, rec = fast
    launcher = CudaLauncher()
    kernel = SimpleNamespace(run=launcher, function="F", packed_metadata="M")
    run.triton_run = lambda *a, **k: kernel
    fn[(1,)](*_args(), BLOCK=64)
    x, out, n, stride, scale, flag = args = _args()
    fn[(3,)](*args, BLOCK=64)
    ptrs = (x.data_ptr(), out.data_ptr())
    # CudaLauncher.__call__ adds the cooperative-grid and PDL flags and the two scratch
    # buffers (None without scratch) before what JITFunction.run passes it.
    assert launcher.calls == [
        (
            "direct",
            (3, 1, 1, 77, "F", False, True, None, None, "M", None, None, None)
            + (*ptrs, 100, 4096, 0.5, True, 64, 3),
        )
    ]
    assert launch._direct_launcher(CudaLauncher(scratch=64)) is None  # allocates per launch
