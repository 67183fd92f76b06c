"""The speed level's sequential stopping rule (graders/run/timing.py), on readings given rather than timed."""
import math
from types import SimpleNamespace

import pytest

from graders.run import timing
from graders.run.timing import MAX_ROUNDS, MIN_ROUNDS, clear_verdict, measure_speedup

THRESHOLD = (2.0, math.inf)   # a speed level: at least 2x
AGREEMENT = (2.0, 3.0)        # kata 10: the grader's reading within a band around the learner's


@pytest.mark.parametrize("ratios, accept, clear", [
    ([3.0, 3.1, 2.9], THRESHOLD, True),          # a clear pass
    ([1.0, 1.02, 0.98], THRESHOLD, True),        # a clear no-op
    ([3.0, 3.1], THRESHOLD, False),              # too few rounds to tell
    ([2.05, 2.3, 2.4], THRESHOLD, False),        # a round within 5% of the threshold
    ([1.95, 1.0, 1.0], THRESHOLD, False),        # likewise, from below
    ([3.0, 1.0, 3.0], THRESHOLD, False),         # rounds on both sides
    ([2.4, 2.5, 2.6], AGREEMENT, True),          # clearly inside the band
    ([3.3, 3.5, 3.2], AGREEMENT, True),          # clearly above it
    ([2.4, 2.9, 2.6], AGREEMENT, False),         # within 5% of its upper bound
    ([2.5, 2.5, 2.5], None, False),              # no verdict to take: every round is timed
])
def test_clear_verdict(ratios, accept, clear):
    assert clear_verdict(ratios, accept) is clear


class FakeTimer:
    """The Timer measure_speedup uses, reading a scripted time per call of each side: no clock involved."""
    readings: dict = {}

    def __init__(self, stmt, globals, num_threads):
        self.side = globals["fn"]

    calls = 1

    def choose_calls(self, seconds):
        pass

    def block(self):  # a reading of a second or more: one block of each side fills a round
        return FakeTimer.readings[self.side].pop(0)


@pytest.mark.parametrize("candidate_times, accept, rounds", [
    ([1.0] * MAX_ROUNDS, THRESHOLD, MIN_ROUNDS),          # 3x every round: clear after the minimum
    ([1.45] * MAX_ROUNDS, THRESHOLD, MAX_ROUNDS),         # 2.07x: within 5% of 2x, so every round
    ([1.0, 1.0, 1.45, 1.0, 1.0, 1.0, 1.0], THRESHOLD, MAX_ROUNDS),  # one doubtful round keeps it going
    ([1.0] * MAX_ROUNDS, None, MAX_ROUNDS),               # no verdict given
])
def test_measure_speedup_stops_once_the_verdict_is_clear(monkeypatch, candidate_times, accept, rounds):
    previous = timing.run_alone_with(None)  # no clock is read: nothing to run alone
    try:
        speed = scripted_measurement(monkeypatch, candidate_times, accept)
    finally:
        timing.run_alone_with(previous)
    assert speed.rounds == rounds
    assert speed.median == pytest.approx(3.0 / sorted(candidate_times[:rounds])[rounds // 2])


def scripted_measurement(monkeypatch, candidate_times, accept):
    """measure_speedup where the baseline reads 3.0 s a round and the candidate `candidate_times`."""
    def baseline(x):
        return x

    def candidate(x):
        return x

    FakeTimer.readings = {baseline: [3.0] * MAX_ROUNDS, candidate: list(candidate_times)}
    monkeypatch.setattr(timing, "block_timer", FakeTimer)
    return measure_speedup(baseline, candidate, (1.0,), accept=accept)


class ClockedTimer:
    """A Timer on a simulated clock: each call of a side costs that side's time, doubled while the clock is inside
    the machine's one slow stretch (another guest on the host, a reclaim): the first SLOW seconds."""
    SLOW = 0.3
    clock = 0.0
    cost: dict = {}

    def __init__(self, stmt, globals, num_threads):
        self.side = globals["fn"]

    def choose_calls(self, seconds):
        self.calls = max(1, round(seconds / ClockedTimer.cost[self.side]))

    def block(self):
        per_call = ClockedTimer.cost[self.side] * (2 if ClockedTimer.clock < ClockedTimer.SLOW else 1)
        ClockedTimer.clock += per_call * self.calls
        return per_call


def test_a_slow_stretch_of_the_machine_reaches_both_sides_of_a_round(monkeypatch):
    """Within a round the sides alternate block by block: a slow stretch longer than one side's share of the
    round (0.2 s) slows both sides' blocks alike, and each side's fastest block comes from after it. Timed one
    side after the other, the first round read the baseline entirely inside the stretch: 4x for a 2x pass."""
    def baseline(x):
        return x

    def candidate(x):
        return x

    ClockedTimer.clock, ClockedTimer.cost = 0.0, {baseline: 2e-3, candidate: 1e-3}
    monkeypatch.setattr(timing, "block_timer", ClockedTimer)
    previous = timing.run_alone_with(None)  # no clock is read: nothing to run alone
    try:
        speed = measure_speedup(baseline, candidate, (1.0,))
    finally:
        timing.run_alone_with(previous)
    assert (speed.low, speed.median, speed.high) == pytest.approx((2.0, 2.0, 2.0))


def test_timed_stretches_run_inside_what_was_registered():
    entered = []

    class Section:
        def __enter__(self):
            entered.append("in")

        def __exit__(self, *exc):
            entered.append("out")

    previous = timing.run_alone_with(Section)
    try:
        with timing.alone():
            entered.append("timing")
    finally:
        timing.run_alone_with(previous)
    assert entered == ["in", "timing", "out"]


def implausible_verdict(monkeypatch, readings: list[float]):
    """assert_speedup on a plain model, the clock replaced by `readings` (one median per measurement)."""
    import torch

    from graders.frame.levels import CheckFailed
    from graders.run.timing import Speedup, assert_speedup

    taken = []

    def measure(baseline, candidate, inputs, **options):
        taken.append(options)
        median = readings[len(taken) - 1]
        return Speedup(median, median, median, 1.0, 1.0 / median, 3)

    monkeypatch.setattr(timing, "measure_speedup", measure)
    ctx = SimpleNamespace(device=torch.device("cpu"), threads=1)
    try:
        return assert_speedup(ctx, lambda x: x + 1, lambda x: x + 1, lambda: (torch.randn(4),), {"cpu": 1.1},
                              what="the pass", hint="-"), taken
    except CheckFailed as failure:
        return failure, taken


def test_an_implausible_reading_is_timed_again_before_it_disqualifies(monkeypatch):
    """The ceiling here is 4.4x (4 x the 1.1x threshold). One implausible early-stopped reading then a
    plausible full one: the second is judged, the first kept beside it; implausible twice: disqualified,
    both readings and the machine's load in the sentence."""
    figures, taken = implausible_verdict(monkeypatch, [20.0, 1.5])
    assert figures["speedup"] == 1.5 and figures["first_speedup"] == 20.0 and "load_average" in figures
    assert taken[0]["accept"] == (1.1, math.inf) and "accept" not in taken[1]  # the second times every round
    failure, taken = implausible_verdict(monkeypatch, [20.0, 18.0])
    assert failure.figures["disqualified"] and failure.figures["first_speedup"] == 20.0 and len(taken) == 2
    assert "is 18.00x" in str(failure) and "read 20.00x" in str(failure) and "load average was" in str(failure)
    figures, taken = implausible_verdict(monkeypatch, [2.0])
    assert figures["speedup"] == 2.0 and "first_speedup" not in figures and len(taken) == 1


def test_the_times_a_speed_sentence_shows_are_the_ones_its_ratio_came_from():
    """Under load the reference's 03 failed L3 with "0.85x (baseline 0.87 ms, candidate 0.69 ms)": the median
    of the ratios beside each side's median time, which can contradict it. The times shown are the median
    round's; with an even number of rounds (stopped early) the lower middle round's."""
    from graders.run.timing import speedup_of

    base, cand = [1.0e-3, 1.0e-3, 3.0e-3], [2.0e-3, 0.5e-3, 1.5e-3]  # ratios 0.5, 2, 2; medians apart: 1 / 1.5
    reading = speedup_of(base, cand)
    assert reading.median == 2.0 and (reading.low, reading.high, reading.rounds) == (0.5, 2.0, 3)
    assert reading.baseline_ms / reading.candidate_ms == reading.median
    assert "the median round's baseline 1.00 ms, candidate 0.50 ms" in str(reading)
    even = speedup_of([1.0, 1.3, 1.1, 1.2], [1.0, 1.0, 1.0, 1.0])
    assert even.median == 1.1 and even.baseline_ms == 1100.0


def test_a_device_without_a_time_threshold_grades_the_byte_count_alone(monkeypatch):
    """Kata 13 had no CUDA threshold: on an H200 its speed level read "the check could not finish: KeyError:
    'cuda'" for every pass. A device missing from the thresholds is graded on the exact count where the kata has
    one (untimed, as kata 08's traffic count on CUDA), and says it cannot be graded where it has none."""
    import torch

    from graders.frame.levels import CheckFailed
    from graders.run.timing import assert_speedup

    monkeypatch.setattr(timing, "measure_speedup", lambda *a, **k: pytest.fail("timed without a threshold"))
    ctx = SimpleNamespace(device=torch.device("cuda"), threads=1)
    original = lambda x: ((x + 1) * 2).relu()  # noqa: E731 - three fresh tensors per call
    one_write = lambda x: torch.relu_(torch.add(x, 1).mul_(2))  # noqa: E731 - one
    inputs = lambda: (torch.randn(64),)  # noqa: E731
    figures = assert_speedup(ctx, original, one_write, inputs, {"cpu": 1.1}, what="the pass", hint="-",
                             max_bytes_fraction=0.5)
    assert figures["timed"] is False and figures["device"] == "cuda"
    assert figures["bytes_written_after"] * 3 == figures["bytes_written_before"]
    with pytest.raises(CheckFailed, match="writes 768 bytes of fresh tensors per call"):  # a no-op
        assert_speedup(ctx, original, original, inputs, {"cpu": 1.1}, what="the pass", hint="-",
                       max_bytes_fraction=0.5)
    with pytest.raises(CheckFailed, match="no speed threshold for cuda and no byte count: its speed level cannot "
                                          "be graded on this device"):
        assert_speedup(ctx, original, one_write, inputs, {"cpu": 1.1}, what="the pass", hint="-")
