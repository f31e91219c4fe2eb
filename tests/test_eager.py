"""The eager-loop timer: per-call cost with a round's fixed part taken out.

Timed on a fake device: its clock moves only when a call or a synchronize says it took time,
so every figure is exact and none depends on how busy the machine running the tests is.
"""

import pytest

import fibgen.bench.eager as eager


class FakeDevice:
    """A clock that calls and synchronizes advance by what they are said to cost."""

    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def call(self, us: float):
        """A call that costs ``us`` microseconds."""

        def run() -> None:
            self.now += us * 1e-6

        return run

    def calls(self, costs_us: list[float]):
        """A call that costs each of ``costs_us`` in turn, then the last one again."""
        left = list(costs_us)

        def run() -> None:
            self.now += (left.pop(0) if len(left) > 1 else left[0]) * 1e-6

        return run


@pytest.fixture
def device(monkeypatch):
    """A fake device whose synchronize costs nothing."""
    fake = FakeDevice()
    monkeypatch.setattr(eager, "_clock", fake.clock)
    return fake


@pytest.fixture
def slow_sync(device, monkeypatch):
    """A fake device whose synchronize costs 2 ms, as a round's start and end cost on a GPU
    host."""
    monkeypatch.setattr(eager, "_sync", lambda _: device.call(2000))
    return device


def test_a_rounds_fixed_cost_is_not_charged_to_its_calls(slow_sync):
    cost = eager.eager_costs(slow_sync.call(100), device="cpu", rounds=5)
    # Divided by its calls, a round of 4 calls would read 600 µs per call: the ending sync
    # is in every timing, the starting one in none.
    assert cost.per_call == pytest.approx(100)
    assert cost.fixed == pytest.approx(2000)
    assert cost.average == pytest.approx((3 * 4 * 100 + 2 * 2000) / (3 * 4))
    assert eager.time_eager(slow_sync.call(100), device="cpu", rounds=5) == pytest.approx(100)


def test_calls_longer_than_a_round_are_measured_the_same_way(slow_sync):
    seen = []
    slow = slow_sync.call(8000)
    cost = eager.eager_costs(lambda: seen.append(slow()), device="cpu", rounds=3)
    assert cost.per_call == pytest.approx(8000)
    assert cost.fixed == pytest.approx(2000)
    # Slower than a round: a timed first call, 2 warmup calls, a probe of 2, then one call
    # and two per round.
    assert len(seen) == 1 + 2 + 2 + 3 * (1 + 2)


def test_a_round_is_about_round_ms_long(device):
    seen = []
    call = device.call(12)
    eager.eager_costs(lambda: seen.append(call()), device="cpu", rounds=1, warmup=0)
    # A timed first call, a probe of 10, then ROUND_MS (5 ms) of 12 µs calls and twice as many.
    assert eager.ROUND_MS == 5.0
    assert len(seen) == 1 + 10 + 416 + 2 * 416


def test_longer_rounds_time_more_calls_of_a_slow_step(device):
    seen = []
    step = device.call(650)  # a decode step of an eager engine on a slow host
    costs = eager.eager_rounds(
        {"step": lambda: seen.append(step())}, device="cpu", rounds=2, round_ms=26.3
    )
    # A timed first call, 20 warmup calls, a probe of 10, then per round 26.3 ms of 650 µs
    # steps (40) and twice as many: where 5 ms rounds would time 7 and 14.
    assert len(seen) == 1 + 20 + 10 + 2 * (40 + 80)
    assert [c.per_call for c in costs["step"]] == [pytest.approx(650)] * 2


def test_tiny_calls_stop_at_max_calls(device):
    seen = []
    call = device.call(0.001)
    eager.eager_costs(lambda: seen.append(call()), device="cpu", rounds=1, warmup=0)
    assert len(seen) == 1 + 10 + 3 * eager.MAX_CALLS


def test_noise_larger_than_the_calls_gives_the_plain_average(device):
    # Each round's longer timing comes out shorter than its shorter one (a host that sped up
    # mid-round): no per-call figure can be taken from the difference.
    # A timed first call, then 2 calls of 9 µs and 4 of 1 µs.
    costs = [5.0] + [9.0] * 2 + [1.0] * 4
    cost = eager.eager_costs(device.calls(costs), device="cpu", rounds=1, warmup=0, calls=2)
    assert tuple(cost) == (pytest.approx((18 + 4) / 6), 0.0, pytest.approx((18 + 4) / 6))


def test_an_explicit_call_count_is_kept(device):
    seen = []
    call = device.call(3)
    cost = eager.eager_costs(lambda: seen.append(call()), device="cpu", rounds=2, warmup=0, calls=7)
    # One timed first call, then per round 7 and 14 calls.
    assert len(seen) == 1 + 2 * (7 + 14)
    assert cost.per_call == pytest.approx(3)


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
    costs = eager.eager_rounds(
        {"slow": slow_sync.call(150), "fast": slow_sync.call(50)}, device="cpu", rounds=3
    )
    for slow, fast in zip(costs["slow"], costs["fast"]):
        assert (slow.per_call, fast.per_call) == (pytest.approx(150), pytest.approx(50))
        assert slow.fixed == fast.fixed == pytest.approx(2000)
