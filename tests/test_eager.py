"""The eager-loop timer: per-call cost with a round's fixed part taken out."""

import time

import pytest

import fibgen.bench.eager as eager


def _busy(us: float):
    """A call that keeps the CPU busy for ``us`` microseconds."""

    def call():
        start = time.perf_counter()
        while time.perf_counter() - start < us * 1e-6:
            pass

    return call


@pytest.fixture
def slow_sync(monkeypatch):
    """A device whose synchronize costs 2 ms, as a round's start and end cost on a GPU host."""
    monkeypatch.setattr(eager, "_sync", lambda device: _busy(2000))


def test_a_rounds_fixed_cost_is_not_charged_to_its_calls(slow_sync):
    cost = eager.eager_costs(_busy(100), device="cpu", rounds=5)
    # Divided by its calls, a round of about 5 ms would read 140 µs per call.
    assert cost.per_call == pytest.approx(100, rel=0.15)
    assert cost.fixed == pytest.approx(2000, rel=0.25)
    assert eager.time_eager(_busy(100), device="cpu", rounds=5) == pytest.approx(100, rel=0.15)


def test_calls_longer_than_a_round_are_measured_the_same_way(slow_sync):
    cost = eager.eager_costs(_busy(8000), device="cpu", rounds=3)
    assert cost.per_call == pytest.approx(8000, rel=0.1)


def test_an_explicit_call_count_is_kept():
    seen = []
    cost = eager.eager_costs(lambda: seen.append(1), device="cpu", rounds=2, warmup=0, calls=7)
    # One timed first call, then per round 7 and 14 calls.
    assert len(seen) == 1 + 2 * (7 + 14)
    assert cost.per_call > 0


def test_rounds_take_turns_and_keep_each_rounds_figures():
    seen: list[str] = []
    fns = {name: (lambda name=name: seen.append(name)) for name in ("a", "b", "c")}
    costs = eager.eager_rounds(fns, device="cpu", rounds=4, warmup=0, calls=1)
    assert {name: len(rounds) for name, rounds in costs.items()} == {"a": 4, "b": 4, "c": 4}
    timed = seen[3:]  # after one first call each
    # Each round times every function (1 call, then 2), starting from the next one each round.
    starts = [timed[i] for i in range(0, len(timed), 9)]
    assert starts == ["a", "b", "c", "a"]
    assert timed[:9] == ["a"] * 3 + ["b"] * 3 + ["c"] * 3


def test_paired_rounds_see_the_cheaper_call(slow_sync):
    costs = eager.eager_rounds({"slow": _busy(150), "fast": _busy(50)}, device="cpu", rounds=3)
    for slow, fast in zip(costs["slow"], costs["fast"]):
        assert slow.per_call / fast.per_call == pytest.approx(3, rel=0.3)
