"""Every kata's mutants (graders/katas/kata_<name>/mutants.py) are caught at the level that should catch them
(and by the check built for them, where a mutant names one: `caught_by`), its correct variants keep full marks,
and its no-op fails the speed level: on the exact byte count where the manifest sets a byte limit, on the exact
memory-traffic count where it sets a traffic limit (kata 08), on the clock otherwise."""
from types import SimpleNamespace

import pytest

from graders.frame.catalogue import KATAS, REPO_ROOT, load_grader
from graders.frame.mutant import Mutant
from graders.run.session import grade
from graders.dev.mutation import (assert_caught_at_its_level, assert_keeps_full_marks, assert_no_op_is_timed_too_slow,
                                  assert_no_op_moves_too_much, assert_no_op_writes_too_much, kata_mutants)

pytestmark = pytest.mark.locks_per_check  # grades in process: tests/conftest.py

MUTANT_MODULES = {kata: module for kata in KATAS if (module := kata_mutants(kata))}


@pytest.mark.parametrize("kata, mutant", [
    pytest.param(kata, mutant, id=f"{kata}-{mutant}", marks=[pytest.mark.timing] if mutant.caught_at == 3 else [])
    for kata, module in MUTANT_MODULES.items() for mutant in module.MUTANTS])
def test_mutant_is_caught_at_its_level(kata, mutant, tmp_path):
    assert_caught_at_its_level(tmp_path, kata, mutant)


@pytest.mark.parametrize("kata, variant", [pytest.param(kata, variant, id=f"{kata}-{variant}")
                                           for kata, module in MUTANT_MODULES.items()
                                           for variant in getattr(module, "VARIANTS", ())])

def test_correct_variant_keeps_full_marks(kata, variant, tmp_path):
    assert_keeps_full_marks(tmp_path, kata, variant)


@pytest.mark.timing
@pytest.mark.parametrize("kata", [kata for kata, module in MUTANT_MODULES.items() if hasattr(module, "NO_OP")])
def test_no_op_fails_the_speed_level(kata, tmp_path):
    no_op = MUTANT_MODULES[kata].NO_OP
    if load_grader(kata).max_bytes_fraction is not None:
        assert_no_op_writes_too_much(tmp_path, kata, no_op)
    elif "max_traffic_fraction" in load_grader(kata).manifest.get("speed", {}):
        assert_no_op_moves_too_much(tmp_path, kata, no_op)
    else:
        assert_no_op_is_timed_too_slow(tmp_path, kata, no_op)


def test_the_check_built_for_a_mutant_runs_first_at_its_level():
    """`grade(first=...)` runs the named check before the others of its level, so a mutant's level stops there."""
    last = load_grader("04_dce").checks_at(2)[-1].name
    results = grade("04_dce", REPO_ROOT / "katas", seed=0, levels=(2,), stop_at_failure=True, first=last)
    assert [(r.check, r.passed) for r in results] == [(last, False)]  # the stub fails it, and grading stops


def test_the_seed_sweep_reports_each_wrong_grading_with_its_seed(tmp_path, monkeypatch):
    """bench/seed_sweep.py, the check of other seeds than 0: the reference's full marks at a seed report nothing; a
    mutant that the hidden level should catch and does not (here an edit that changes nothing) is reported with
    the seed that lets it through."""
    monkeypatch.syspath_prepend(str(REPO_ROOT / "bench"))
    import seed_sweep

    unchanged = MUTANT_MODULES["04_dce"].NO_OP.old
    claimed = Mutant("claimed_caught", unchanged, unchanged, caught_at=4)
    monkeypatch.setattr("graders.dev.mutation.kata_mutants", lambda kata: SimpleNamespace(MUTANTS=[claimed]))
    assert seed_sweep.sweep("04_dce", [7], tmp_path) == []
    assert seed_sweep.sweep("04_dce", [7], tmp_path, mutants=[4]) == [
        "seed 7: claimed_caught: 04_dce mutant claimed_caught got full marks; level 4 should catch it"]


def test_mutant_coverage_names_the_checks_no_mutant_fails(tmp_path, monkeypatch, capsys):
    """bench/mutant_coverage.py grades each mutant on every check of its level: kata 04's no-op (it removes
    nothing) fails both L1 checks; with it the only mutant, every L2 and L4 check is reported unproven."""
    monkeypatch.syspath_prepend(str(REPO_ROOT / "bench"))
    import mutant_coverage

    no_op = MUTANT_MODULES["04_dce"].NO_OP
    monkeypatch.setattr("graders.dev.mutation.kata_mutants", lambda kata: SimpleNamespace(MUTANTS=[no_op]))
    report = mutant_coverage.failed_by("04_dce", tmp_path)
    level = {check.name: check.level for check in load_grader("04_dce").checks}
    assert {check: mutants for check, mutants in report.items() if mutants} == {
        check: ["no_op"] for check in level if level[check] == 1}
    assert {check for check, mutants in report.items() if not mutants} == {
        check for check in level if level[check] in (2, 4)}
