"""Kata 10 beyond its plain mutants (tests/test_mutants.py): each wrong verifier fails the very check built
for its blind spot, the kata's nearest thing to a no-op fails only the speed checks it should, and the
hidden battery's claimed truth holds for the reference on more seeds."""
import pytest

from graders.run.session import GradingSession, grade
from graders.katas.kata_10_verify_harness.mutants import CAUGHT_BY, MUTANTS, SPEEDUP_ALWAYS_ONE
from graders.frame.catalogue import REPO_ROOT, load_grader
from graders.dev.mutation import write_mutant_tree

pytestmark = pytest.mark.locks_per_check  # grades in process: tests/conftest.py

KATA = "10_verify_harness"
BY_NAME = {mutant.name: mutant for mutant in MUTANTS}


CHECKS = {check.name: check for check in load_grader(KATA).checks}


@pytest.mark.parametrize("mutant, catcher", [
    pytest.param(mutant, catcher, marks=[pytest.mark.timing] if CHECKS[catcher].level == 3 else [])
    for mutant, catcher in CAUGHT_BY.items()])
def test_mutant_fails_the_check_built_for_it(mutant, catcher, tmp_path):
    check = CHECKS[catcher]
    result = GradingSession(write_mutant_tree(tmp_path, KATA, BY_NAME[mutant]), seed=0).run(check)
    assert not result.passed, f"{mutant} slipped past {catcher}"
    assert "Hint:" in result.message, result.message


@pytest.mark.timing
def test_a_verifier_that_never_times_fails_the_speed_checks_that_need_a_clock(tmp_path):
    results = grade(KATA, write_mutant_tree(tmp_path, KATA, SPEEDUP_ALWAYS_ONE), seed=0, levels=(3,))
    assert {r.check: r.passed for r in results} == {"no_op_speedup": True, "dead_code_speedup": False,
                                                     "interleaved_timing": False}


@pytest.mark.parametrize("seed", [101, 202, 303])
def test_hidden_battery_truth_holds_for_the_reference_verifier(seed):
    """The L4 generator's claimed truth, checked by the reference verifier on more seeds."""
    results = grade(KATA, REPO_ROOT / "reference", seed=seed, levels=(4,))
    assert all(r.passed for r in results), [f"{r.test_id}: {r.message}" for r in results if not r.passed]
