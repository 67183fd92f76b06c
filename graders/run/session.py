"""The grading frame every kata shares: levels, checks, results, loading and calling a solution.

A kata grader declares a `Kata` and its checks; a `GradingSession` runs checks against one solution
tree and yields `CheckResult` records. pytest (graders/pytest_plugin.py), score.py and the project's
own tests all consume the same records.
"""
from __future__ import annotations

import importlib.util
import random
import re
import sys
import traceback
import zlib
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, NamedTuple

import torch

from graders.isolation.guard import Guard
from graders.frame.catalogue import load_grader, manifest


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

# After this many time-outs in one kata, its remaining checks fail at once instead of hanging too.
MAX_TIMEOUTS_PER_KATA = 2


class CheckFailed(Exception):
    """A check's verdict. The message is the sentence the learner reads: what, where, expected vs got, hint.

    `figures` carries what was measured on the way (a speedup that fell short is still worth showing).
    """

    def __init__(self, message: str, figures: dict | None = None):
        super().__init__(message)
        self.figures = figures or {}


@dataclass(frozen=True)
class Check:
    kata: str
    level: int
    name: str
    run: Callable[["Context"], dict | None]
    weight: float = 1.0
    timeout: float = 60.0

    @property
    def test_name(self) -> str:
        return f"test_L{self.level}_{LEVELS[self.level].name}"

    @property
    def test_id(self) -> str:
        return f"{self.test_name}[{self.name}]"


class Kata:
    """One kata's grader: its manifest (title, API, thresholds) and its checks, each at a level.

    A grader declares its checks as data where it can: `cases` (a level's cases, each graded by the
    one run path in graders/harness.py), `hidden` (level 4, generated from the check seed) and `speed`
    (level 3). Checks particular to one kata are ordinary functions registered with `check`.
    """

    def __init__(self, name: str):
        self.name = name
        self.manifest = manifest(name)
        self.title = self.manifest["title"]
        self.api: dict[str, str] = self.manifest["api"]
        speed = self.manifest.get("speed", {})
        self.thresholds: dict[str, float] = speed.get("threshold", {})
        self.max_bytes_fraction: float | None = speed.get("max_bytes_fraction")
        self.checks: list[Check] = []

    def add(self, level: int, name: str, run: Callable, *, weight: float = 1.0, timeout: float | None = None):
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
        """One check per case, named after it, each graded by `harness.check` through the pass `via`."""
        from graders.run import harness

        for name, case in cases.items():
            self.add(level, name, lambda ctx, case=case: harness.check(ctx, case, via))

    def hidden(self, generator: Callable, via=None, *, n: int = 5, check: Callable | None = None) -> None:
        """Level 4: `n` checks model_1..model_n, each grading `generator(rng)` with an rng drawn from the
        check's seed, through the pass `via` (or `check(ctx, generated)` where the kata grades it itself)."""
        from graders.run import harness

        def run(ctx):
            generated = generator(harness.hidden_rng(ctx))
            return check(ctx, generated) if check else harness.check(ctx, generated, via)

        for index in range(1, n + 1):
            self.add(4, f"model_{index}", run)

    def speed(self, name: str, case, via, *, what: str, hint: str, verdict: bool = False) -> None:
        """Level 3: the benchmark case must beat the traced original by the manifest's threshold (and,
        with `verdict`, pass the kata's structure verdict too)."""
        from graders.run import harness

        self.add(3, name, lambda ctx: harness.speed(ctx, case, via, what=what, hint=hint, verdict=verdict))

    def checks_at(self, level: int) -> list[Check]:
        return [c for c in self.checks if c.level == level]

    def max_points(self, check: Check) -> float:
        level_checks = self.checks_at(check.level)
        return LEVELS[check.level].points * check.weight / sum(c.weight for c in level_checks)


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
        return f"test_L{self.level}_{LEVELS[self.level].name}[{self.check}]"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "CheckResult":
        return cls(**data)


def _where_in(exc: BaseException, path: Path) -> str:
    """' (solution.py line 12: `code`)' for the deepest frame of `exc` inside the learner's file."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == path]
    if not frames:
        return ""
    frame = frames[-1]
    return f" ({path.name} line {frame.lineno}: `{(frame.line or '').strip()}`)"


def describe_exception(exc: BaseException, path: Path | None = None) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}" + (_where_in(exc, path) if path else "")


def missing_solution(path: Path) -> str | None:
    """The sentence for a solution file that is not there, or None."""
    return None if path.is_file() else f"{path} does not exist: a solution tree holds one NN_name/solution.py per kata."


def kind_of(value) -> str:
    """What a name of the solution module holds: "class", "function", "value" or "none"."""
    return "class" if isinstance(value, type) else "function" if callable(value) else \
        "none" if value is None else "value"


def load_solution(path: Path, kata: str) -> ModuleType:
    """Import a learner's solution.py by path (so a tree outside the repository works)."""
    if missing := missing_solution(path):
        raise CheckFailed(missing)
    module_name = f"kata_solution_{kata}_{zlib.crc32(str(path).encode()):08x}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look the module up here
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise CheckFailed(f"{path} does not compile: {exc.msg} at line {exc.lineno}.") from None
    except Exception as exc:
        raise CheckFailed(f"importing {path} raised {describe_exception(exc, path)}.") from None
    return module


def is_timeout(exc: BaseException) -> bool:
    """pytest-timeout's signal method fails the test by raising from inside whatever code is running."""
    return type(exc).__name__ == "Failed" and str(exc).startswith("Timeout")


class Context:
    """What a check gets: the learner's solution (loaded lazily), the device, and the session's options."""

    def __init__(self, session: "GradingSession", kata: Kata, check: Check):
        self.session = session
        self.kata = kata
        self.check = check
        self.device = session.device
        self.threads = session.threads
        self.seed = session.check_seed(check)

    @property
    def solution_path(self) -> Path:
        return self.session.solution_path(self.kata.name)

    @property
    def solution(self) -> ModuleType:
        if self.session.isolate:  # a grader bug: an isolated judge never imports solution code
            raise RuntimeError("Context.solution is not available when grading is isolated; use call or defines")
        return self.session.load(self.kata.name)

    def call(self, function: str, *args, returns: type | tuple[type, ...] | None = None):
        """Call the learner's `function`; every way it can go wrong becomes one sentence."""
        return self.invoke(function, *args, returns=returns).result

    def invoke(self, function: str, *args, returns: type | tuple[type, ...] | None = None, watch: tuple = (),
               kwargs: dict | None = None) -> Called:
        """Call the learner's `function` on `args`; the result, and the arguments and `watch`ed objects as
        they are after the call. In process they are the very objects; isolated (graders/worker.py), the
        call ran in the worker and all three are rebuilt here from the data it sent back. `kwargs`: keyword
        arguments (plain data), passed as they are."""
        path = self.solution_path
        if self.session.isolate:
            called = self.session.worker(self.kata.name).call(self, function, args, watch, kwargs or {})
        else:
            fn = getattr(self.solution, function, None)
            if not callable(fn):
                raise self.missing(function)
            try:
                result = fn(*args, **(kwargs or {}))
            except NotImplementedError:
                raise self.stub(function) from None
            except Exception as exc:
                raise CheckFailed(f"{function} raised {describe_exception(exc, path)}.") from None
            called = Called(result, args, watch, type(result).__name__)
        if returns is not None and not isinstance(called.result, returns):
            expected = " or ".join(t.__name__ for t in (returns if isinstance(returns, tuple) else (returns,)))
            raise CheckFailed(f"{function} returned a {called.type}; the kata asks for {self.kata.api[function]} returning {expected}.")
        return called

    def defines(self, name: str) -> str:
        """What the solution's `name` is: "class", "function", "value" or "none"."""
        if self.session.isolate:
            return self.session.worker(self.kata.name).defines(self, name)
        return kind_of(getattr(self.solution, name, None))

    def missing(self, function: str) -> CheckFailed:
        return CheckFailed(f"{self.solution_path} has no function {function}: the kata asks for "
                           f"{self.kata.api[function]}.")

    def stub(self, function: str) -> CheckFailed:
        return CheckFailed(f"{function} is still the stub (it raises NotImplementedError): "
                           f"fill in the TODO(human) parts of {self.solution_path}.")


@dataclass
class Called:
    """One call of a learner function: its result, and its arguments and watched objects after the call."""

    result: Any
    args: tuple
    watched: tuple
    type: str  # the name of the result's type (as the solution's process saw it)


def resolve_seed(seed: int | None) -> int:
    """The grading seed: the one asked for, or a fresh random one (printed, so a run can be reproduced)."""
    return random.SystemRandom().randrange(2**31) if seed is None else int(seed)


class GradingSession:
    """Runs checks of any kata against one solution tree, with one seed, device and speed setting."""

    def __init__(
        self,
        solutions: Path | str,
        *,
        seed: int | None = None,
        device: str = "cpu",
        threads: int = 1,
        speed: bool = True,
        isolate: bool = False,
    ):
        if device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda was asked for, but torch sees no CUDA device on this machine.")
        self.solutions = Path(solutions).resolve()
        self.seed = resolve_seed(seed)
        self.device = torch.device(device)
        self.threads = threads
        self.speed = speed
        self.isolate = isolate  # solution code runs in worker processes only (graders/worker.py)
        self._workers: dict[str, Any] = {}
        self.results: list[CheckResult] = []
        self._modules: dict[str, ModuleType | CheckFailed] = {}
        self._timeouts: Counter[str] = Counter()
        self._guard: Guard | None = None
        self._tampering: str | None = None

    def solution_path(self, kata: str) -> Path:
        return self.solutions / kata / "solution.py"

    def load(self, kata: str) -> ModuleType:
        """Load once per session; a failure is remembered so every later check repeats its reason."""
        if kata not in self._modules:
            if self._guard is None:
                self._guard = Guard()  # before the first solution code runs
            try:
                self._modules[kata] = load_solution(self.solution_path(kata), kata)
            except CheckFailed as failure:
                self._modules[kata] = failure
            except BaseException as exc:
                if is_timeout(exc):
                    self._modules[kata] = CheckFailed(f"importing {self.solution_path(kata)} did not finish (timed out).")
                raise
        loaded = self._modules[kata]
        if isinstance(loaded, CheckFailed):
            raise CheckFailed(str(loaded))
        return loaded

    def worker(self, kata: str):
        """The worker process that runs this tree's solution of `kata` (isolated grading)."""
        from graders.isolation.worker import Worker

        if kata not in self._workers:
            self._workers[kata] = Worker(self.solution_path(kata), kata, threads=self.threads)
        return self._workers[kata]

    def close(self) -> None:
        """Stop the workers."""
        for worker in self._workers.values():
            worker.stop()
        self._workers.clear()

    def check_seed(self, check: Check) -> int:
        return zlib.crc32(f"{self.seed}/{check.kata}/{check.level}/{check.name}".encode())

    def run(self, check: Check) -> CheckResult:
        kata = load_grader(check.kata)
        max_points = kata.max_points(check)

        def record(passed: bool, message: str, figures: dict | None = None, skipped: bool = False):
            tampering = self._guard and self._guard.describe()
            if tampering:
                self._tampering = self._tampering or tampering
                passed, message = False, tampering
            disqualified = bool(tampering) or bool((figures or {}).get("disqualified"))
            result = CheckResult(check.kata, check.level, check.name, passed, max_points if passed else 0.0,
                                 max_points, message, figures or {}, skipped, disqualified)
            self.results.append(result)
            return result

        if check.level == 3 and not self.speed:
            return record(False, "not run: speed levels are off (--no-speed).", skipped=True)
        if self._tampering:
            return record(False, f"not run: {self._tampering}")
        if self._timeouts[check.kata] >= MAX_TIMEOUTS_PER_KATA:
            return record(False, f"not run: {MAX_TIMEOUTS_PER_KATA} earlier checks of {check.kata} timed out.")

        context = Context(self, kata, check)
        torch.manual_seed(context.seed)
        random.seed(context.seed)
        try:
            figures = check.run(context)
        except CheckFailed as failure:
            return record(False, str(failure), failure.figures)
        except BaseException as exc:
            if is_timeout(exc):
                # Report it like any other failure: pytest-timeout's own "Timeout (>2.0s)" names no kata or check.
                self._timeouts[check.kata] += 1
                limit = re.search(r">([\d.]+)s", str(exc))
                within = f" within {limit.group(1)} s" if limit else ""
                return record(False, f"timed out: the check did not finish{within}; does the pass loop forever "
                                     f"on this model?")
            if not isinstance(exc, Exception):
                raise
            return record(False, f"the check could not finish: {describe_exception(exc, self.solution_path(check.kata))}.")
        return record(True, "ok", figures)


def grade(kata: str, solutions: Path | str, *, levels: tuple[int, ...] = (1, 2, 3, 4), stop_at_failure: bool = False,
          **options) -> list[CheckResult]:
    """Grade one kata of a solution tree in this process (the project's tests use this).

    `stop_at_failure`: checks run level by level (in the order of `levels`) and grading stops after the
    first failing check; enough to tell the first level that catches a mutant."""
    session, grader, results = GradingSession(solutions, **options), load_grader(kata), []
    try:
        for level in levels:
            for check in grader.checks_at(level):
                results.append(session.run(check))
                if stop_at_failure and not results[-1].passed and not results[-1].skipped:
                    return results
        return results
    finally:
        session.close()


def level_points(results: list[CheckResult]) -> dict[int, tuple[float, float]]:
    """Points earned and possible per level."""
    totals = {level: [0.0, 0.0] for level in LEVELS}
    for r in results:
        totals[r.level][0] += r.points
        totals[r.level][1] += r.max_points
    return {level: (earned, possible) for level, (earned, possible) in totals.items()}
