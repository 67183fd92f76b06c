"""Levels, verdicts and results: the vocabulary every part of the graders shares.

A check's verdict is a `CheckFailed` (its message is the sentence the learner reads); a check's outcome
is a `CheckResult`, the record pytest, score.py, the stored runs and the project's own tests consume.

May import: the standard library only.
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple


class Level(NamedTuple):
    number: int
    name: str
    points: int
    meaning: str


# The same frame for every kata: 100 points, split over four levels.
LEVELS = {
    1: Level(1, "pattern", 20, "the basic model is rewritten as asked"),
    2: Level(2, "exact", 40, "a zoo of edge cases: outputs match the original, illegal rewrites are left alone"),
    3: Level(3, "fast", 20, "the required speedup on the kata's benchmark model"),
    4: Level(4, "hidden", 20, "models generated from the grading seed, so a pass tuned to the visible models fails"),
}


class CheckFailed(Exception):
    """A check's verdict. The message is the sentence the learner reads: what, where, expected vs got, hint.

    `figures` carries what was measured on the way (a speedup that fell short is still worth showing).
    """

    def __init__(self, message: str, figures: dict | None = None):
        super().__init__(message)
        self.figures = figures or {}


def test_name(level: int) -> str:
    """The pytest test a level's checks are parameters of: test_L2_exact."""
    return f"test_L{level}_{LEVELS[level].name}"


@dataclass
class CheckResult:
    kata: str
    level: int
    check: str
    passed: bool
    points: float
    max_points: float
    message: str
    figures: dict[str, Any] = field(default_factory=dict)
    skipped: bool = False
    disqualified: bool = False  # tampering or an implausible result: shown on the leaderboard, never ranked

    @property
    def test_id(self) -> str:
        return f"{test_name(self.level)}[{self.check}]"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "CheckResult":
        return cls(**data)


# A level's points are a float sum of shares (20 / 3 + ...): a level's total is rounded to this many decimals,
# so that a level earned in full is its points exactly (40.0, not 40.00000000000001) and totals compare equal.
POINTS_DECIMALS = 9


def level_points(results: list[CheckResult]) -> dict[int, tuple[float, float]]:
    """Points earned and possible per level (rounded: POINTS_DECIMALS)."""
    totals = {level: [0.0, 0.0] for level in LEVELS}
    for r in results:
        totals[r.level][0] += r.points
        totals[r.level][1] += r.max_points
    return {level: (round(earned, POINTS_DECIMALS), round(possible, POINTS_DECIMALS))
            for level, (earned, possible) in totals.items()}


def resolve_seed(seed: int | None) -> int:
    """The grading seed: the one asked for, or a fresh random one (printed, so a run can be reproduced)."""
    return random.SystemRandom().randrange(2**31) if seed is None else int(seed)
