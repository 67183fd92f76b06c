"""A kata's declaration: its manifest (title, API, thresholds) and its checks, each at a level.

A grader declares its checks as data where it can: `cases` (a level's cases), `hidden` (level 4, models
generated from the check's seed) and `speed` (level 3) record declarations (`Declared`) that the run
path executes (graders/run/harness.py, `execute`); the frame never runs them. Checks particular to one
kata are ordinary functions registered with `check`: they get the check's context and return figures.

May import: the standard library and the rest of graders.frame.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from graders.frame.catalogue import manifest
from graders.frame.levels import LEVELS, test_name


@dataclass(frozen=True)
class Declared:
    """A check declared as data: `kind` "case" grades `case` through the pass `via`; "hidden" grades
    `generator(rng)` (rng drawn from the check's seed) through `via`, or with `grade(ctx, generated)`;
    "speed" times `case` through `via` against the manifest's threshold (`options`: what, hint, verdict)."""

    kind: str
    via: Any = None
    case: Any = None
    generator: Callable | None = None
    grade: Callable | None = None
    options: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Check:
    kata: str
    level: int
    name: str
    run: Callable[[Any], dict | None] | Declared  # a function of the check's context, or a declaration
    weight: float = 1.0
    timeout: float = 60.0

    @property
    def test_name(self) -> str:
        return test_name(self.level)

    @property
    def test_id(self) -> str:
        return f"{self.test_name}[{self.name}]"


class Kata:
    """One kata's grader: its manifest (title, API, thresholds) and its checks, each at a level.

    `manifest_data`: the kata's kata.toml parsed (default: read from the catalogue; tests hand in their own).
    `imports_torch_internals`: its grading imports the torch internals of graders/isolation/torch_private.py's
    FIRST_USE_MODULES (katas 10-13), which a zygote (or a nursery) then loads before it forks the kata's first
    grading process (or worker), once for all its children (graders/batch/zygote.py, graders/isolation/nursery.py)."""

    def __init__(self, name: str, manifest_data: dict | None = None, *, imports_torch_internals: bool = False):
        self.name = name
        self.imports_torch_internals = imports_torch_internals
        self.manifest = manifest(name) if manifest_data is None else manifest_data
        self.title = self.manifest["title"]
        self.api: dict[str, str] = self.manifest["api"]
        speed = self.manifest.get("speed", {})
        self.thresholds: dict[str, float] = speed.get("threshold", {})
        # Which thresholds were measured, on what and when: `calibrated = { cpu = "<device>, <date>, <N> gradings" }`
        # (bench/calibrate.py --write records it). A device without a record has a provisional threshold.
        self.calibrated: dict[str, str] = speed.get("calibrated", {})
        self.max_bytes_fraction: float | None = speed.get("max_bytes_fraction")
        self.checks: list[Check] = []

    def add(self, level: int, name: str, run: Callable | Declared, *, weight: float = 1.0,
            timeout: float | None = None):
        if any(c.level == level and c.name == name for c in self.checks):
            raise ValueError(f"{self.name}: duplicate check L{level} {name}")
        default_timeout = 300.0 if level == 3 else 60.0
        self.checks.append(Check(self.name, level, name, run, weight, timeout or default_timeout))

    def check(self, level: int, name: str | None = None, **options):
        """Decorator form of `add`: the function's name is the check's name."""

        def register(run):
            self.add(level, name or run.__name__, run, **options)
            return run

        return register

    def cases(self, level: int, cases: dict, via) -> None:
        """One check per case, named after it, each graded through the pass `via`."""
        for name, case in cases.items():
            self.add(level, name, Declared("case", via=via, case=case))

    def hidden(self, generator: Callable, via=None, *, n: int = 5, check: Callable | None = None) -> None:
        """Level 4: `n` checks model_1..model_n, each grading `generator(rng)` with an rng drawn from the
        check's seed, through the pass `via` (or `check(ctx, generated)` where the kata grades it itself)."""
        for index in range(1, n + 1):
            self.add(4, f"model_{index}", Declared("hidden", via=via, generator=generator, grade=check))

    def speed(self, name: str, case, via, *, what: str, hint: str, verdict: bool = False) -> None:
        """Level 3: the benchmark case must beat the traced original by the manifest's threshold (and,
        with `verdict`, pass the kata's structure verdict too)."""
        self.add(3, name, Declared("speed", via=via, case=case, options={"what": what, "hint": hint, "verdict": verdict}))

    def provisional(self, device: str) -> str | None:
        """Why the speed verdict on `device` is provisional (its threshold was never measured there), or None.
        A kata with no time threshold on `device` (08 on a GPU: the exact traffic count alone) is never provisional."""
        if device in self.calibrated or device not in self.thresholds:
            return None
        where = "on a GPU" if device == "cuda" else f"on {device}"
        return (f"provisional: the {device} speed threshold of {self.name} has not been calibrated {where} "
                f"(bench/calibrate.py --device {device})")

    def checks_at(self, level: int) -> list[Check]:
        return [c for c in self.checks if c.level == level]

    def max_points(self, check: Check) -> float:
        level_checks = self.checks_at(check.level)
        return LEVELS[check.level].points * check.weight / sum(c.weight for c in level_checks)
