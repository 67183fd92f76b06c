"""A grading session: one solution tree graded check by check, with one seed, device and speed setting.

A `GradingSession` runs the checks of any kata (declared in graders/katas/, found through the frame's
catalogue) against one solution tree and yields `CheckResult` records; each check gets a `Context`: the
learner's functions to call (in process, or in a worker process when grading is isolated), the device,
the check's seed. pytest (graders/learner/pytest_plugin.py), score.py and the project's own tests all
consume the same records. `grade` grades one kata of a tree in this process.

On CUDA a session holds full float32 for its lifetime (graders/isolation/precision.py: TF32 off in cuBLAS and
cuDNN), so both sides of every comparison compute alike, and each check's record says whether its
device's speed threshold was calibrated (`Kata.provisional`): a level-3 figure `provisional` and a
sentence in the message where it was not.

May import: graders.frame, graders.isolation (the worker and the runtime guard), the rest of graders.run.
"""
from __future__ import annotations

import random
import re
import zlib
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from graders.frame.catalogue import load_grader
from graders.frame.kata import Check
from graders.frame.levels import CheckFailed, CheckResult, resolve_seed
from graders.frame.solution import describe_exception, is_timeout, load_solution
from graders.isolation import precision
from graders.isolation.guard import Guard
from graders.isolation.worker import Limits, Worker
from graders.run.context import Context
from graders.run.harness import execute
from graders.run.numerics import manual_seed

# After this many time-outs in one kata, its remaining checks fail at once instead of hanging too.
MAX_TIMEOUTS_PER_KATA = 2


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
        nursery: Path | None = None,
        check_timeout: float | None = None,
        worker_memory: float | None = None,
    ):
        if device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda was asked for, but torch sees no CUDA device on this machine.")
        self.solutions = Path(solutions).resolve()
        self.seed = resolve_seed(seed)
        self.device = torch.device(device)
        self.threads = threads
        self.speed = speed
        self.isolate = isolate  # solution code runs in worker processes only (graders/isolation/worker.py)
        self.nursery = Path(nursery) if nursery else None  # where isolated workers come from, forked warm (the fleet)
        self._workers: dict[str, Any] = {}
        self.check_timeout = check_timeout  # seconds a check may take (--check-timeout), instead of each check's own
        # what a worker started here may take (--worker-memory GB; a nursery's workers get the nursery's)
        self.worker_limits = Limits(device=self.device.type) if worker_memory is None else Limits(worker_memory, device=self.device.type)
        self.results: list[CheckResult] = []
        self._modules: dict[str, ModuleType | CheckFailed] = {}
        self._timeouts: Counter[str] = Counter()
        self._guard: Guard | None = None
        self._tampering: str | None = None
        self._full_float32 = self.device.type == "cuda"  # held until close()
        if self._full_float32:
            precision.acquire()

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
        if kata not in self._workers:
            self._workers[kata] = Worker(self.solution_path(kata), kata, threads=self.threads, nursery=self.nursery,
                                         limits=self.worker_limits)
        return self._workers[kata]

    def close(self) -> None:
        """Stop the workers."""
        for worker in self._workers.values():
            worker.stop()
        self._workers.clear()
        if self._full_float32:
            self._full_float32 = False
            precision.release()

    def timeout(self, check: Check) -> float:
        """Seconds `check` may take: --check-timeout where given, else the check's own."""
        return self.check_timeout or check.timeout

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
            if self._full_float32 and not precision.is_full() and not tampering:
                passed, message = False, (f"the check ran with torch's float32 precision changed ({precision.settings()}); "
                                          f"grading on CUDA holds {precision.NOTE}.")
                precision.apply()
            provisional = check.level == 3 and not skipped and kata.provisional(self.device.type)
            if provisional:
                figures = {**(figures or {}), "provisional": True}
                first, *rest = message.split("\n", 1)  # the first line is what tables show
                message = "\n".join([f"{first} ({provisional})", *rest])
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
        if self._full_float32:
            precision.apply()  # whatever ran before in this process
        manual_seed(context.seed, self.device)
        random.seed(context.seed)
        try:
            figures = execute(check, context)
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
          first: str | None = None, **options) -> list[CheckResult]:
    """Grade one kata of a solution tree in this process (the project's tests use this).

    `stop_at_failure`: checks run level by level (in the order of `levels`) and grading stops after the
    first failing check; enough to tell the first level that catches a mutant. `first`: the name of a check
    that runs before the other checks of its level (the check built to catch a mutant: where it fails, that
    level stops there)."""
    session, grader, results = GradingSession(solutions, **options), load_grader(kata), []
    try:
        for level in levels:
            for check in sorted(grader.checks_at(level), key=lambda c: c.name != first):
                results.append(session.run(check))
                if stop_at_failure and not results[-1].passed and not results[-1].skipped:
                    return results
        return results
    finally:
        session.close()
