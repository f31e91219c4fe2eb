"""The check of a value-returning solution's output (Note [result check] in
fibgen/runtime/checking/result_check.py): the Python check and the native one agree on every case, and
a dispatcher on the native check falls back on a wrong output as it does on the Python one. The
native reads of an input's shape and dtype give what Python's give (Note [native reads]), and
the native counter counts."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch

import fibgen.runtime as rt
from fake_flashinfer.catalogue import generated_package
from fibgen.runtime.checking import result_check

from _shared import REQUIRE_OPTIONAL

generated_package()

from fake_kernels import rmsnorm  # noqa: E402  (generated just above)

from fibgen.runtime.routing.state import STATE  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:fibgen. .* never matched:RuntimeWarning")


@pytest.fixture(scope="module")
def native():
    """The native check, built once (the build is cached per machine)."""
    try:
        return result_check.build()
    except Exception as exc:
        if REQUIRE_OPTIONAL:
            raise
        pytest.skip(f"the extension module does not build here: {exc}")


@pytest.fixture(params=["python", "native"])
def same(request):
    return (
        result_check.same_python if request.param == "python" else request.getfixturevalue("native")
    )


X = torch.randn(2, 3)

CASES = [
    # (output, dtype, shape, like, expected)
    (X, torch.float32, X.shape, X, True),
    (X, torch.float32, (2, 3), X, True),
    (X, torch.float32, 2, X, True),  # an int: the number of dimensions
    (X, torch.float64, X.shape, X, False),
    (X, torch.float32, (3, 2), X, False),
    (X, torch.float32, (2, 3, 1), X, False),
    (X, torch.float32, 3, X, False),
    (X.unsqueeze(0), torch.float32, (2, 3), X, False),
    (torch.empty(2, 3, device="meta"), torch.float32, (2, 3), X, False),
    (X, torch.float32, (2, 3), torch.empty(1, device="meta"), False),
    (None, torch.float32, (2, 3), X, False),
    ([X], torch.float32, (2, 3), X, False),
    ((X,), torch.float32, (2, 3), X, False),
    (X.t().contiguous().t(), torch.float32, (2, 3), X, True),  # strides are not checked
]


if torch.cuda.is_available():
    G = X.cuda()
    CASES += [
        (G, torch.float32, (2, 3), G, True),
        (G, torch.float32, (2, 3), X, False),
        (X, torch.float32, (2, 3), G, False),
    ]


@pytest.mark.parametrize("out, dtype, shape, like, expected", CASES)
def test_the_check_says_whether_an_output_is_the_declared_one(
    same, out, dtype, shape, like, expected
):
    assert same(out, dtype, shape, like) is expected


def test_the_native_check_refuses_a_wrong_call_with_a_type_error(native):
    with pytest.raises(TypeError, match="takes 4 arguments"):
        native(X, torch.float32, X.shape)
    # Sizes that are not ints, a dtype that is not one: not the declared output.
    assert native(X, torch.float32, ("2", 3), X) is False
    assert native(X, "float32", X.shape, X) is False


@pytest.fixture(scope="module")
def native_module(native):
    """The extension module that holds the native check."""
    from fibgen.runtime.launch.native import build_native

    return build_native()


class _Recorded(torch.Tensor):
    """A subclass whose __torch_function__ sees every attribute read."""

    seen: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.seen.append(getattr(func, "__name__", str(func)))
        return super().__torch_function__(func, types, args, kwargs or {})


class _Mode(torch.overrides.TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


class _ShapeLike:
    shape = (2, 3)
    dtype = "float32"


READ_CASES = [
    X,
    torch.tensor(3.0),
    torch.empty(0, 5, dtype=torch.bfloat16),
    torch.nn.Parameter(torch.randn(4, 2)),
    torch.empty(2, 3, device="meta"),
    X.t(),
    _ShapeLike(),
]


@pytest.mark.parametrize("value", READ_CASES, ids=lambda v: type(v).__name__)
def test_the_native_reads_give_what_python_reads(native_module, value):
    shape = native_module.shape_of(value)
    assert shape == value.shape and tuple(shape) == tuple(value.shape)
    assert native_module.dtype_of(value) is value.dtype
    assert result_check.shape_python(value) == value.shape
    assert result_check.dtype_python(value) is value.dtype


def test_the_native_reads_fail_where_python_reads_fail(native_module):
    for read in (native_module.shape_of, native_module.dtype_of):
        with pytest.raises(AttributeError):
            read(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nested = torch.nested.nested_tensor([torch.randn(2), torch.randn(3)])
    with pytest.raises(RuntimeError):
        nested.shape
    with pytest.raises(RuntimeError):
        native_module.shape_of(nested)


def test_the_native_reads_go_through_torch_function_as_python_reads_do(native_module):
    sub = X.as_subclass(_Recorded)
    _Recorded.seen.clear()
    assert native_module.shape_of(sub) == (2, 3)
    assert native_module.dtype_of(sub) is torch.float32
    assert _Recorded.seen == ["__get__", "__get__"]
    with _Mode() as mode:
        assert native_module.shape_of(X) == (2, 3)
        assert native_module.dtype_of(X) is torch.float32
    assert mode.seen == ["__get__", "__get__"]


def test_the_native_counter_counts_and_is_read_as_the_python_one(native_module):
    from fibgen.runtime import counters

    tally = native_module.Tally()
    tick = counters.ticker(tally)
    for _ in range(5):
        assert tick() is None
    assert counters.read(tally) == 5
    with pytest.raises(TypeError):
        tally(1)
    python = counters.new()  # an itertools.count, or a Tally once the extension is in use
    counters.ticker(python)()
    assert counters.read(python) == 1


@pytest.fixture
def on_native(native):
    """Every dispatcher on the native check, as after a background build; then back."""
    STATE.use_native_check(native)
    yield native
    STATE.use_native_check(result_check.same_python)


@pytest.mark.parametrize(
    "make, ok",
    [
        (lambda x: x * 2, True),
        (lambda x: x.double(), False),
        (lambda x: x[:, :8], False),
        (lambda x: torch.empty_like(x, device="meta"), False),
        (lambda x: None, False),
    ],
)
def test_a_dispatcher_on_the_native_check_serves_or_falls_back_as_on_python(on_native, make, ok):
    x, w = torch.randn(1, 4096), torch.randn(4096)
    assert rmsnorm._api.same is on_native
    with rt.enable_apply({"rmsnorm_h4096": lambda hidden_states, weight: make(hidden_states)}):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = rmsnorm.rmsnorm(x, w)
        counts = rt.stats()["fake_flashinfer.norm.rmsnorm"]
    rt.disable_apply()
    if ok:
        assert counts["hit"] == 1 and torch.equal(got, x * 2)
    else:
        assert counts["error"] == 1 and counts["hit"] == 0
        assert not torch.equal(got, x * 2)


@pytest.mark.slow
def test_a_value_returning_hit_builds_the_check_in_the_background_and_switches_to_it(
    tmp_path, native
):
    # In a fresh process with the native check allowed (the test suite turns it off): the
    # first value-returning hit starts the build, and once it is done every dispatcher,
    # those imported before and those imported after, checks natively.
    script = """
import importlib, sys, torch
import fibgen.runtime as rt
from fibgen.runtime.launch import replay
from fibgen.runtime.checking import result_check
from fake_flashinfer.catalogue import generated_package
generated_package()
from fake_kernels import rmsnorm
assert rmsnorm._api.same is result_check.same_python
x, w = torch.randn(1, 2048), torch.randn(2048)
with rt.enable_apply({"rmsnorm_h2048": lambda hidden_states, weight: hidden_states * 2}):
    assert torch.equal(rmsnorm.rmsnorm(x, w), x * 2)
    replay.wait_native()
    assert result_check.current() is not result_check.same_python
    assert rmsnorm._api.same is result_check.current()
    assert rmsnorm._same is result_check.current()
    assert rmsnorm._shape_of is not result_check.shape_python
    assert rmsnorm._dtype_of is not result_check.dtype_python
    assert torch.equal(rmsnorm.rmsnorm(x, w), x * 2)
    assert rt.stats()["fake_flashinfer.norm.rmsnorm"]["hit"] == 2
    # The native reads keep the input rules: another dtype, another rank are refused.
    rmsnorm.rmsnorm(x.half(), w.half())
    rmsnorm.rmsnorm(x[0], w)
    counts = rt.stats()["fake_flashinfer.norm.rmsnorm"]
    assert counts["hit"] == 2 and counts["fallback_guard"] == 2, counts
from fake_kernels import relu
assert relu._api.same is result_check.current()
print("ok")
"""
    env = {**os.environ, "FIBGEN_NATIVE": "1"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_with_native_code_turned_off_the_python_check_stays(monkeypatch):
    monkeypatch.setenv("FIBGEN_NATIVE", "0")
    assert not result_check.enabled()
