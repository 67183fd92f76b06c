"""A kata's summary from its check records: points per level, the speedup, and the one sentence a table
shows (full marks, not started, the first failing check, or why it was disqualified). `speed_provisional`:
the speed level was graded against a threshold never calibrated on this device (graders/frame/kata.py,
`Kata.provisional`); the table, the pytest summary and the stored run say so.

May import: graders.frame.
"""
from __future__ import annotations

import hashlib
from functools import cache

from graders.frame.catalogue import manifest
from graders.frame.levels import LEVELS, CheckResult, level_points


def summarise(kata: str, results: list[CheckResult]) -> dict:
    points = level_points(results)
    failures = [r for r in results if not r.passed and not r.skipped]
    speed = next((r.figures for r in results if r.level == 3 and "speedup" in r.figures), {})
    disqualified = next((r for r in results if r.disqualified), None)
    if disqualified:
        message = f"DISQUALIFIED: {disqualified.test_id}: {disqualified.message.splitlines()[0]}"
    elif not failures:
        message = "full marks" if not any(r.skipped for r in results) else "all checks that ran passed"
    elif all("still the stub" in r.message for r in failures) and not any(r.points for r in results):
        message = "not started: solution.py is still the stub"  # with points, a function is written: the failure
    else:
        message = f"{failures[0].test_id}: {failures[0].message.splitlines()[0]}"
    return {"status": "graded", "points": sum(e for e, _ in points.values()), "max_points": 100.0,
            "levels": {str(level): list(p) for level, p in points.items()}, "speedup": speed.get("speedup"),
            "speedup_threshold": speed.get("threshold"), "message": message,
            "speed_provisional": any(r.level == 3 and r.figures.get("provisional") for r in results),
            "disqualified": disqualified.message.splitlines()[0] if disqualified else None,
            "checks": [r.to_dict() for r in results]}


def summarise_phases(kata: str, outcomes: list[list[CheckResult] | dict]) -> dict:
    """A kata graded in phases (its correctness levels, then its speed level): a phase whose grading failed
    (a failed_grading dict: it hung, crashed or was refused) is the kata's summary, else every phase's
    records summarised together."""
    failed = next((o for o in outcomes if isinstance(o, dict)), None)
    return dict(failed) if failed else summarise(kata, [r for o in outcomes for r in o])


def failed_grading(status: str, message: str) -> dict:
    return {"status": status, "points": 0.0, "max_points": 100.0, "levels": {}, "speedup": None,
            "speed_provisional": False, "message": message, "disqualified": None, "checks": []}


def is_shipped_stub(kata: str, source: bytes | None) -> bool:
    """Whether `source` is the kata's stub byte for byte as this project ships it: its SHA-256 is the manifest's
    `stub_sha256` (the dev check holds it to katas/NN_name/solution.py in the project's own tree). Not the file
    in katas/ itself: a learner solves there, in place, and that file is then no stub."""
    return source is not None and hashlib.sha256(source).hexdigest() == _stub_digest(kata)


@cache
def _stub_digest(kata: str) -> str | None:
    return manifest(kata).get("stub_sha256")


def stub_records(kata: str, levels: str | None, speed: bool = True) -> list[CheckResult]:
    """The verdict on the shipped stub without grading it (nothing of it runs: every check of a stub fails
    "still the stub", tests/test_katas.py): one failed record per level of `levels` (as a grading process
    takes them: "1,2,4", or None for every level), holding the level's points; the speed level's is skipped
    when speed is off, as a graded one would be."""
    numbers = [int(level) for level in levels.split(",")] if levels else list(LEVELS)
    return [CheckResult(kata, level, "stub", False, 0.0, float(LEVELS[level].points),
                        f"{kata}/solution.py is still the stub, byte for byte as shipped: fill in its TODO(human) "
                        "parts (not graded: every check of the stub fails)", skipped=level == 3 and not speed)
            for level in numbers]
