"""Speed: interleaved, single-threaded ratios with torch.utils.benchmark, plus a deterministic cost count.

May import: graders.frame, graders.run.numerics, graders.isolation.torch_private (the block timer).
"""
from __future__ import annotations

import math
import os
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Callable, ContextManager

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from graders.frame.levels import CheckFailed
from graders.isolation.torch_private import block_timer
from graders.run.numerics import assert_same_outputs


# A speedup this far above what the kata asks for, and above what the fresh-tensor bytes saved allow, comes from
# skipping work (cached outputs, a slowed-down baseline), not from a rewrite. The references reach at
# most 1.7x the threshold (kata READMEs), so an honest pass has a wide margin below the ceiling.
IMPLAUSIBLE_OVER_THRESHOLD = 4.0
IMPLAUSIBLE_OVER_FRESH_BYTES = 2.0  # times fresh_bytes_ratio (cost_figures), or the kata's own `ideal`
IMPLAUSIBLE_ALWAYS = 10.0  # whatever the bytes say: a candidate that writes no fresh tensor has an infinite ratio


@dataclass(frozen=True)
class Speedup:
    median: float       # the median round's baseline_time / candidate_time, each its best block
    low: float          # the worst round
    high: float         # the best round
    baseline_ms: float  # the median round's times: the ones its ratio, the verdict's, came from
    candidate_ms: float
    rounds: int

    def __str__(self) -> str:
        return (f"{self.median:.2f}x (rounds {self.low:.2f}x-{self.high:.2f}x; the median round's "
                f"baseline {self.baseline_ms:.2f} ms, candidate {self.candidate_ms:.2f} ms)")


def speedup_of(base_times: list[float], cand_times: list[float]) -> Speedup:
    """The reading of the rounds timed (seconds per call, round by round): the median round's ratio and the
    times it came from. Medians of each side's times taken apart can contradict it under load (a 0.85x
    verdict shown with "baseline 0.87 ms, candidate 0.69 ms"). With an even number of rounds (timing stopped
    early, every round clearly on one side of the verdict) the lower middle round is the median one."""
    ratios = [b / c for b, c in zip(base_times, cand_times)]
    middle = sorted(range(len(ratios)), key=ratios.__getitem__)[(len(ratios) - 1) // 2]
    return Speedup(ratios[middle], min(ratios), max(ratios), base_times[middle] * 1e3, cand_times[middle] * 1e3,
                   len(ratios))


# Where wall-clock readings decide a verdict, grading that shares the machine with other work (the project's
# own tests, on every core) can have the reading run alone: it registers how with run_alone_with, and
# every timed stretch runs inside alone().
_alone_section: Callable[[], ContextManager] | None = None


def run_alone_with(section: Callable[[], ContextManager] | None) -> Callable[[], ContextManager] | None:
    """From now on every timed stretch runs inside `section()` (None: as it comes); returns the one before."""
    global _alone_section
    previous, _alone_section = _alone_section, section
    return previous


@contextmanager
def alone():
    """The timed stretch inside: wall-clock readings that decide a verdict (see run_alone_with)."""
    with _alone_section() if _alone_section else nullcontext():
        yield


# Sequential stopping: after MIN_ROUNDS, timing stops as soon as every round so far lies clearly on one
# side of each bound of the verdict (a clear 3x pass or a clear 1.0x no-op needs 3 rounds instead of 7);
# a reading near a bound still gets all rounds and the median over them.
MIN_ROUNDS, MAX_ROUNDS, CLEAR_MARGIN = 3, 7, 0.05


def clear_verdict(ratios: list[float], accept: tuple[float, float] | None) -> bool:
    """Every round so far is clearly inside `accept` (the speedups that pass), or clearly outside it on
    one side: CLEAR_MARGIN away from both bounds in either case."""
    if accept is None or len(ratios) < MIN_ROUNDS:
        return False
    low, high = accept
    lowest, highest = min(ratios), max(ratios)
    inside = lowest >= low * (1 + CLEAR_MARGIN) and highest <= high * (1 - CLEAR_MARGIN)
    below, above = highest <= low * (1 - CLEAR_MARGIN), lowest >= high * (1 + CLEAR_MARGIN)
    return inside or below or above


# Within a round the two sides are timed block by block, alternately, each block about 1/BLOCKS_PER_ROUND of the
# round's time per side, and each side counts its fastest block. On a shared VM a slow stretch (another guest, a
# reclaim) lasts tenths of a second: timing each side in one stretch of a round let it fall on one side only (a
# reference read 0.97x-2.0x from round to round of one grading); alternating blocks spread it over both.
BLOCKS_PER_ROUND = 10


def measure_speedup(baseline: Callable, candidate: Callable, inputs: tuple, *, threads: int = 1,
                    rounds: int = MAX_ROUNDS, min_run_time: float = 0.2,
                    accept: tuple[float, float] | None = None) -> Speedup:
    """Time baseline and candidate in alternating order, round by round, and take the median ratio.

    Interleaving makes both see the same machine state (frequency, cache, other load), so the ratio
    is steady even when absolute times drift. Within a round each side counts its fastest block:
    other jobs only ever add time, so the best block is the steadiest estimate of the code's own cost
    (on a 2-core VM a no-op read 1.00x-1.07x with block medians, 1.00x-1.02x with the best).
    Given the range of speedups the verdict `accept`s ((threshold, inf) for a speed level), timing
    stops early once the verdict is clear (clear_verdict).
    """
    def timer(fn):
        return block_timer("fn(*inputs)", globals={"fn": fn, "inputs": inputs}, num_threads=threads)

    base_timer, cand_timer = timer(baseline), timer(candidate)
    with torch.no_grad(), alone():
        baseline(*inputs), candidate(*inputs)  # warm-up: allocator, lazy initialisation
        for t in (base_timer, cand_timer):
            t.choose_calls(min_run_time / BLOCKS_PER_ROUND)
        ratios, base_times, cand_times = [], [], []
        for round_index in range(rounds):
            order = (base_timer, cand_timer) if round_index % 2 == 0 else (cand_timer, base_timer)
            times, spent = {id(t): math.inf for t in order}, {id(t): 0.0 for t in order}
            while min(spent.values()) < min_run_time:
                for t in order:
                    per_call = t.block()
                    times[id(t)] = min(times[id(t)], per_call)
                    spent[id(t)] += per_call * t.calls
            base_times.append(times[id(base_timer)])
            cand_times.append(times[id(cand_timer)])
            ratios.append(base_times[-1] / cand_times[-1])
            if clear_verdict(ratios, accept):
                break
    return speedup_of(base_times, cand_times)


@dataclass(frozen=True)
class Cost:
    aten_ops: int
    bytes_written: int  # bytes of every fresh (non-view) tensor the ops produced


class CountingMode(TorchDispatchMode):
    """A dispatch mode that counts what aten ops do (the graders' exact costs: this module's, kata 08's traffic)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Nothing here is compiled. Left True, torch wraps __torch_dispatch__ in torch._disable_dynamo, whose
        # first call imports torch._dynamo (sympy, inductor): 4-5 s in every fresh grading process.
        return False


class _CostCounter(CountingMode):
    def __init__(self):
        super().__init__()
        self.ops = 0
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        self.bytes += sum(t.numel() * t.element_size() for t in tree_leaves(out)
                          if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs)
        return out


def count_cost(model: Callable, inputs: tuple) -> Cost:
    """aten ops executed and bytes they wrote: the same on every machine, unlike a time."""
    counter = _CostCounter()
    with torch.no_grad(), counter:
        model(*inputs)
    return Cost(counter.ops, counter.bytes)


def cost_figures(before: Cost, after: Cost) -> dict:
    return {
        "aten_ops_before": before.aten_ops, "aten_ops_after": after.aten_ops,
        "bytes_written_before": before.bytes_written, "bytes_written_after": after.bytes_written,
        # Bytes of fresh tensors written before the pass over those after: what a pass gains in allocation
        # and first-touch page faults. Not memory traffic: an op that overwrites a tensor in place reads and
        # writes it all the same, and writes no fresh bytes.
        "fresh_bytes_ratio": round(before.bytes_written / max(after.bytes_written, 1), 3),
    }


def _megabytes(n: float) -> str:
    return f"{n / 2**20:.3g} MiB" if n >= 2**20 else f"{n:.0f} bytes"


def assert_speedup(ctx, baseline: Callable, candidate: Callable, make_inputs: Callable[[], tuple],
                   thresholds: dict[str, float], *, what: str, hint: str,
                   max_bytes_fraction: float | None = None, ideal: float | None = None) -> dict:
    """The L3 verdict: the candidate must beat the traced original by the kata's threshold on this device.

    `max_bytes_fraction`, for katas whose gain is fresh tensors not written, also caps the bytes the
    candidate writes per call at that fraction of the original's. The count is exact, so the lesson is
    graded even when allocation costs swing (page faults in a VM), and the time threshold can sit low
    enough that the reference never fails it. Outputs are compared again on fresh inputs after timing,
    so a candidate that returns cached results cannot pass.

    `ideal`: the speedup the kata's own exact count allows (kata 08: its memory-traffic ratio), for the
    implausibility ceiling; by default `fresh_bytes_ratio`.

    A device the thresholds do not name (the kata.toml says why) is graded on the byte count alone, untimed
    (`"timed": False`); a kata with neither says in one sentence that its speed level cannot be graded there.
    """
    threshold = thresholds.get(ctx.device.type)
    if threshold is None and max_bytes_fraction is None:
        raise CheckFailed(f"this kata's manifest (kata.toml, [speed] threshold) has no speed threshold for "
                          f"{ctx.device.type} and no byte count: its speed level cannot be graded on this device.",
                          {"device": ctx.device.type})
    inputs = make_inputs()
    costs = cost_figures(count_cost(baseline, inputs), count_cost(candidate, inputs))
    if max_bytes_fraction is not None:
        costs["max_bytes_fraction"] = max_bytes_fraction
        before, after = costs["bytes_written_before"], costs["bytes_written_after"]
        if after > max_bytes_fraction * before:
            raise CheckFailed(
                f"{what} writes {_megabytes(after)} of fresh tensors per call, the traced original "
                f"{_megabytes(before)}; this level allows at most {max_bytes_fraction:.0%} of the original's "
                f"({_megabytes(max_bytes_fraction * before)}), counted exactly, not timed. Hint: {hint}",
                {**costs, "device": ctx.device.type},
            )
    if threshold is None:  # no time threshold on this device (its kata.toml says why): the count alone
        assert_same_outputs(baseline, candidate, [make_inputs()], what=what)
        return {"device": ctx.device.type, "timed": False, **costs}
    allowed = costs["fresh_bytes_ratio"] if ideal is None else ideal
    ceiling = min(max(IMPLAUSIBLE_OVER_THRESHOLD * threshold, IMPLAUSIBLE_OVER_FRESH_BYTES * allowed),
                  IMPLAUSIBLE_ALWAYS * threshold)
    speed = measure_speedup(baseline, candidate, inputs, threads=ctx.threads, accept=(threshold, math.inf))
    first = None
    if speed.median > ceiling:
        # Disqualifying takes more evidence than failing (a loaded machine can read an honest pass far too fast
        # in a few early-stopped rounds): time again, every round, and judge that reading.
        first, speed = speed, measure_speedup(baseline, candidate, inputs, threads=ctx.threads)
    figures = {
        "speedup": round(speed.median, 3), "speedup_low": round(speed.low, 3), "speedup_high": round(speed.high, 3),
        "threshold": threshold, "rounds": speed.rounds, "baseline_ms": round(speed.baseline_ms, 3), "candidate_ms": round(speed.candidate_ms, 3),
        "device": ctx.device.type, "threads": ctx.threads, "load_average": round(os.getloadavg()[0], 2), **costs,
        **({"first_speedup": round(first.median, 3)} if first else {}),
    }
    # A candidate that remembers outputs by tensor identity or address looks fast in the timing loop,
    # which reuses one input; new values in the same storage and fresh tensors both expose it.
    with torch.no_grad():
        for timed, fresh in zip(tree_leaves(inputs), tree_leaves(make_inputs())):
            if isinstance(timed, torch.Tensor) and timed.is_floating_point():
                timed.copy_(fresh)
    assert_same_outputs(baseline, candidate, [inputs, make_inputs(), make_inputs()], what=what)
    if speed.median > ceiling:
        raise CheckFailed(
            f"{what} is {speed} against the traced original, and read {first} the first time: implausible for this "
            f"kata twice (more than {ceiling:.1f}x, set by the required speedup and the ratio of fresh-tensor bytes "
            f"written before and after; the machine's load average was {figures['load_average']}). The result is "
            f"flagged for the organiser, not ranked; if your pass is honest, run it again and report it.",
            {**figures, "disqualified": True},
        )
    if speed.median < threshold:
        raise CheckFailed(
            f"{what} is {speed} against the traced original; this level needs at least {threshold:.2f}x "
            f"on {ctx.device.type}. Hint: {hint}",
            figures,
        )
    return figures
