"""Mutation testing of the graders: each kata's mutants graded, each must lose points at its level.

May import: graders.frame, graders.run (the machinery it grades with).

Mutants are the reference solution with one plausible bug, written as a source edit.

Each kata's grader folder has a `mutants.py` with `MUTANTS`, a list of `Mutant`, and `NO_OP`, the
mutant that changes nothing (the speed level must fail it). `VARIANTS`, where a kata has them, are
edits that stay correct (a pass that follows another convention PyTorch also follows): they must keep
full marks at every correctness level. Each mutant names the level that must
catch it: no lower level fails, this one does. A mutant of the hidden level (L4) must fail every generated
model, not one of five: a generator that holds what catches it only now and then lets it through at some
grading seeds (bench/seed_sweep.py grades other seeds than the tests' 0). Writing mutants as edits of the
reference keeps them in step with it: an edit whose `old` text no longer occurs exactly once fails loudly.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

from graders.frame.catalogue import grader_module_name, load_grader, reference_source
from graders.frame.mutant import Mutant
from graders.frame.levels import CheckResult
from graders.run.session import grade


def kata_mutants(kata: str) -> ModuleType | None:
    """The kata's graders/katas/kata_<name>/mutants.py, or None where it has none yet."""
    try:
        return importlib.import_module(f"{grader_module_name(kata)}.mutants")
    except ModuleNotFoundError:
        return None


def write_mutant_tree(tmp_path: Path, kata: str, mutant: Mutant) -> Path:
    source = reference_source(kata)
    count = source.count(mutant.old)
    assert count == 1, f"mutant {mutant.name}: its `old` text occurs {count} times in the reference, not once"
    target = tmp_path / kata / "solution.py"
    target.parent.mkdir(parents=True)
    target.write_text(source.replace(mutant.old, mutant.new))
    return tmp_path


def failed_levels(results: list[CheckResult]) -> set[int]:
    return {r.level for r in results if not r.passed and not r.skipped}


def assert_caught_at_its_level(tmp_path: Path, kata: str, mutant: Mutant, seed: int = 0) -> None:
    """No level below `mutant.caught_at` fails it, that level does (at the hidden level, every generated model
    does); where the mutant names the check built to
    catch it (`caught_by`), that check fails it, with a hint where the kata's mutants.py says CAUGHT_WITH_A_HINT
    (a check that fails on what the pass returned can say how to fix it; one that fails on an exception the pass
    raised names the exception and its line instead)."""
    if mutant.caught_by is not None:
        names = [check.name for check in load_grader(kata).checks_at(mutant.caught_at)]
        assert mutant.caught_by in names, (f"{kata} mutant {mutant.name} names caught_by={mutant.caught_by!r}, which "
                                           f"is no check of level {mutant.caught_at}: {', '.join(names)}")
    tree = write_mutant_tree(tmp_path, kata, mutant)
    # Levels in order, stopping at the first failing check: every lower level passed in full by then. The check
    # built for the mutant runs first at its level: where it fails, no other check of that level need run. A
    # mutant of the hidden level is graded on every hidden model: each must fail it.
    hidden = mutant.caught_at == 4
    results = grade(kata, tree, seed=seed, levels=mutant.levels, stop_at_failure=not hidden, first=mutant.caught_by)
    failing = failed_levels(results)
    reasons = "\n".join(f"  {r.test_id}: {r.message.splitlines()[0]}" for r in results if not r.passed)
    assert failing, f"{kata} mutant {mutant.name} got full marks; level {mutant.caught_at} should catch it"
    assert min(failing) == mutant.caught_at, (
        f"{kata} mutant {mutant.name} is caught first at level {min(failing)}, expected {mutant.caught_at}:\n{reasons}")
    if hidden and (passed := [r.check for r in results if r.level == 4 and r.passed]):
        raise AssertionError(f"{kata} mutant {mutant.name} passes the hidden {', '.join(passed)} at seed {seed}: every "
                             "generated model must hold what catches it, or some seed lets it through")
    if mutant.caught_by is not None:
        [built] = [r for r in results if r.check == mutant.caught_by]
        assert not built.passed, (f"{kata} mutant {mutant.name} slipped past {mutant.caught_by}, the check built "
                                  f"for it:\n{reasons}")
        if getattr(kata_mutants(kata), "CAUGHT_WITH_A_HINT", False):
            assert "Hint:" in built.message, f"{built.test_id} fails {mutant.name} without a hint: {built.message}"


def assert_keeps_full_marks(tmp_path: Path, kata: str, variant: Mutant, seed: int = 0) -> None:
    results = grade(kata, write_mutant_tree(tmp_path, kata, variant), seed=seed, levels=variant.levels)
    failures = "\n".join(f"  {r.test_id}: {r.message.splitlines()[0]}" for r in results if not r.passed)
    assert not failures, f"{kata} correct variant {variant.name} loses points:\n{failures}"


def speed_level(tmp_path: Path, kata: str, mutant: Mutant) -> CheckResult:
    [result] = grade(kata, write_mutant_tree(tmp_path, kata, mutant), seed=0, levels=(3,))
    return result


def assert_no_op_is_timed_too_slow(tmp_path: Path, kata: str, no_op: Mutant) -> None:
    """The speed level fails a pass that changes nothing, on the clock: under the threshold. (A no-op reads
    near 1.0x, but how far below it a loaded machine pushes one reading is no claim of the grader's:
    bench/speed_fidelity.py repeats the gradings for that.)"""
    result = speed_level(tmp_path, kata, no_op)
    assert not result.passed, result.message
    assert result.figures["speedup"] < result.figures["threshold"], result.message


def assert_no_op_writes_too_much(tmp_path: Path, kata: str, no_op: Mutant) -> None:
    """The speed level fails a pass that changes nothing on the exact byte count, whatever the clock says.

    For katas whose gain is too small or too machine-dependent to tell from a no-op by timing alone.
    """
    result = speed_level(tmp_path, kata, no_op)
    assert not result.passed
    assert result.figures["bytes_written_after"] == result.figures["bytes_written_before"] > 0
    assert "counted exactly, not timed" in result.message


def assert_no_op_moves_too_much(tmp_path: Path, kata: str, no_op: Mutant) -> None:
    """The speed level fails a pass that changes nothing on the exact memory-traffic count (kata 08's
    modelled cache), whatever the clock says."""
    result = speed_level(tmp_path, kata, no_op)
    assert not result.passed
    assert result.figures["memory_traffic_after"] == result.figures["memory_traffic_before"] > 0
    assert "counted exactly, not timed" in result.message
