"""Mutants: the reference solution with one plausible bug, written as a source edit.

Each mutant names the level that must catch it. Writing mutants as edits of the reference keeps them
in step with it: an edit whose `old` text no longer occurs exactly once fails loudly.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from graders.core import CheckResult, grade
from graders.katas import REPO_ROOT


@dataclass(frozen=True)
class Mutant:
    name: str
    old: str          # text of the reference solution, occurring exactly once
    new: str          # what the bug puts there instead
    caught_at: int    # the level that must catch it: no lower level fails, this one does

    def __str__(self) -> str:
        return self.name


def write_mutant_tree(tmp_path: Path, kata: str, mutant: Mutant) -> Path:
    source = (REPO_ROOT / "reference" / kata / "solution.py").read_text()
    count = source.count(mutant.old)
    assert count == 1, f"mutant {mutant.name}: its `old` text occurs {count} times in the reference, not once"
    target = tmp_path / kata / "solution.py"
    target.parent.mkdir(parents=True)
    target.write_text(source.replace(mutant.old, mutant.new))
    return tmp_path


def failed_levels(results: list[CheckResult]) -> set[int]:
    return {r.level for r in results if not r.passed and not r.skipped}


def assert_caught_at_its_level(tmp_path: Path, kata: str, mutant: Mutant, seed: int = 0) -> None:
    tree = write_mutant_tree(tmp_path, kata, mutant)
    results = grade(kata, tree, seed=seed, speed=mutant.caught_at == 3)
    failing = failed_levels(results)
    reasons = "\n".join(f"  {r.test_id}: {r.message.splitlines()[0]}" for r in results if not r.passed)
    assert failing, f"{kata} mutant {mutant.name} got full marks; level {mutant.caught_at} should catch it"
    assert min(failing) == mutant.caught_at, (
        f"{kata} mutant {mutant.name} is caught first at level {min(failing)}, expected {mutant.caught_at}:\n{reasons}")


def speed_level(tmp_path: Path, kata: str, mutant: Mutant) -> CheckResult:
    [result] = grade(kata, write_mutant_tree(tmp_path, kata, mutant), seed=0, levels=(3,))
    return result


def assert_no_op_is_timed_too_slow(tmp_path: Path, kata: str, no_op: Mutant) -> None:
    """The speed level fails a pass that changes nothing, on the clock (near 1.0x, under the threshold)."""
    result = speed_level(tmp_path, kata, no_op)
    assert not result.passed
    assert 0.8 < result.figures["speedup"] < result.figures["threshold"]


def assert_no_op_writes_too_much(tmp_path: Path, kata: str, no_op: Mutant) -> None:
    """The speed level fails a pass that changes nothing on the exact byte count, whatever the clock says.

    For katas whose gain is too small or too machine-dependent to tell from a no-op by timing alone.
    """
    result = speed_level(tmp_path, kata, no_op)
    assert not result.passed
    assert result.figures["bytes_written_after"] == result.figures["bytes_written_before"] > 0
    assert "counted exactly, not timed" in result.message
