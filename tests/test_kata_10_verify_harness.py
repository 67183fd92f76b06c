"""Kata 10 beyond its mutants (tests/test_mutants.py, which proves each wrong verifier fails the very check built
for its blind spot): the verifiers that time the wrong thing fail the speed check built for them too, the kata's
nearest thing to a no-op fails only the speed checks it should, and the hidden battery's claimed truth holds for
the reference on more seeds."""
import random
import time

import pytest
import torch

from graders.run.session import GradingSession, grade
from graders.katas.kata_10_verify_harness.models import hidden_cases
from graders.katas.kata_10_verify_harness.mutants import MUTANTS, SPEEDUP_ALWAYS_ONE
from graders.frame.catalogue import REPO_ROOT, load_grader
from graders.dev.mutation import write_mutant_tree

pytestmark = pytest.mark.locks_per_check  # grades in process: tests/conftest.py

KATA = "10_verify_harness"
BY_NAME = {mutant.name: mutant for mutant in MUTANTS}


CHECKS = {check.name: check for check in load_grader(KATA).checks}


@pytest.mark.timing
def test_a_verifier_that_times_the_original_against_itself_fails_the_speed_check_built_for_it(tmp_path):
    """Level 2 catches it first (tests/test_mutants.py); the speed level's own check must catch it too."""
    mutant = BY_NAME["times_the_original_against_itself"]
    result = GradingSession(write_mutant_tree(tmp_path, KATA, mutant), seed=0).run(CHECKS["dead_code_speedup"])
    assert not result.passed, f"{mutant} slipped past dead_code_speedup"
    assert "Hint:" in result.message, result.message


@pytest.mark.timing
def test_a_verifier_that_never_times_fails_the_speed_checks_that_need_a_clock(tmp_path):
    """Level 2 catches it first too (tests/test_mutants.py); dead_code_speedup, built for it, fails it with a hint."""
    results = grade(KATA, write_mutant_tree(tmp_path, KATA, SPEEDUP_ALWAYS_ONE), seed=0, levels=(3,))
    assert {r.check: r.passed for r in results} == {"no_op_speedup": True, "dead_code_speedup": False,
                                                     "interleaved_timing": False}
    [built] = [r for r in results if r.check == "dead_code_speedup"]
    assert "Hint:" in built.message, built.message


@pytest.mark.parametrize("seed", [101, 202, 303])
def test_hidden_battery_truth_holds_for_the_reference_verifier(seed):
    """The L4 generator's claimed truth, checked by the reference verifier on more seeds."""
    results = grade(KATA, REPO_ROOT / "reference", seed=seed, levels=(4,))
    assert all(r.passed for r in results), [f"{r.test_id}: {r.message}" for r in results if not r.passed]


def test_hidden_battery_grades_effects():
    """L4 grades `effects` in every hidden case, and draws passes that drop the model's effect (every other check
    true): torch.fx's eliminate_dead_code on a buffer update, a pass deleting a dead random draw. Generated only,
    not graded: cheap."""
    droppers, effects = set(), set()
    for seed in range(30):
        for name, case in hidden_cases(random.Random(seed)).items():
            assert "effects" in case.expect, name
            if "effect " in case.extra["why"]:
                effects.add(case.extra["why"].rsplit(" ", 1)[-1])
            if case.expect["effects"] is False and case.expect["numerical"] is True:
                droppers.add(name)
                assert all(case.expect[key] for key in case.expect if key != "effects"), (name, case.expect)
    assert droppers == {"eliminate_dead_code", "drops_dead_random_draws"}
    assert effects == {"running", "dead_random", "clamps_input"}


class LooksLikeCuda(torch.Tensor):
    """A CPU tensor that says it is on CUDA: the stand-in where no GPU is present."""

    @property
    def is_cuda(self):
        return True


def test_reference_timing_synchronizes_cuda_before_each_clock_reading(monkeypatch):
    """On CUDA a call returns once its kernels are queued; a clock read without torch.cuda.synchronize() times the
    launches. The reference's timing loop must synchronize after the last timed call and before reading the clock.

    Runs on the CPU: where no GPU is present the inputs are a CPU tensor that reports is_cuda (LooksLikeCuda) and
    torch.cuda.synchronize is replaced by a recorder; with a GPU, real CUDA tensors and the real synchronize,
    recorded. Either way a log of model calls, synchronizes and clock readings shows the order."""
    import importlib.util
    import types

    spec = importlib.util.spec_from_file_location("reference_10", REPO_ROOT / "reference" / KATA / "solution.py")
    solution = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(solution)
    log = []
    real_sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: (log.append("sync"), real_sync())[1])
    clock = solution.time.perf_counter
    monkeypatch.setattr(solution, "time", types.SimpleNamespace(perf_counter=lambda: (log.append("clock"), clock())[1]))
    if torch.cuda.is_available():
        x = torch.randn(4, 8, device="cuda")
    else:
        x = torch.randn(4, 8).as_subclass(LooksLikeCuda)
        assert x.is_cuda and not torch.Tensor.is_cuda.__get__(x)

    def model(name):
        def run(t):
            log.append(name)
            time.sleep(0.002)  # a few calls per 10 ms chunk
            return t
        return run

    ratio = solution.time_ratio(model("a"), model("b"), (x,))
    assert ratio > 0
    readings = [i for i, e in enumerate(log) if e == "clock"]
    assert len(readings) >= 2 * 2 * solution.TIMING_ROUNDS  # a start and a stop per chunk
    for start, stop in zip(readings[::2], readings[1::2]):
        # Every stop reading: the model calls since the start, then a synchronize, then the clock.
        assert log[stop - 1] == "sync", f"the clock was read after {log[stop - 1]!r}, not after a synchronize: {log[start:stop + 1]}"
        # And nothing left queued from before: a synchronize right before every start reading too.
        assert log[start - 1] == "sync", f"a chunk started timing after {log[start - 1]!r}: {log[max(0, start - 3):start + 1]}"


def test_reference_timing_does_not_synchronize_on_the_cpu(monkeypatch):
    """On CPU tensors there is nothing to synchronize (and torch.cuda.synchronize would raise without a GPU)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("reference_10", REPO_ROOT / "reference" / KATA / "solution.py")
    solution = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(solution)
    called = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: called.append(1))
    assert solution.time_ratio(lambda t: t, lambda t: t, (torch.randn(2, 3),)) > 0
    assert not called
