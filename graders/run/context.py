"""What a check gets: the learner's functions to call (in process, or through the session's worker when
grading is isolated), the device, the thread count and the check's own seed.

May import: graders.frame, graders.isolation.torch_private (the guards a call added, in process). The session that
makes a context (graders/run/session.py) is only handed in.
"""
from __future__ import annotations

import copy
from pathlib import Path
from types import ModuleType

from graders.frame.kata import Check, Kata
from graders.frame.levels import CheckFailed
from graders.frame.solution import Called, describe_exception, kind_of
from graders.isolation import torch_private


class Context:
    """What a check gets: the learner's solution (loaded lazily), the device, and the session's options."""

    def __init__(self, session, kata: Kata, check: Check):
        """`session`: the GradingSession running the check (graders/run/session.py), above this module."""
        self.session = session
        self.kata = kata
        self.check = check
        self.device = session.device
        self.threads = session.threads
        self.seed = session.check_seed(check)

    def on(self, device) -> "Context":
        """This check's context on another device (a case whose model runs only on the CPU: Case.cpu_only)."""
        moved = copy.copy(self)
        moved.device = device
        return moved

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
        they are after the call. In process they are the very objects; isolated (graders/isolation/worker.py), the
        call ran in the worker and all three are rebuilt here from the data it sent back. `kwargs`: keyword
        arguments (plain data), passed as they are. Either way `Called.added_guards` is measured where the call
        ran: the ShapeEnv guards behind the arguments' and the result's fake values after the call, less those
        behind the arguments' before it."""
        path = self.solution_path
        if self.session.isolate:
            called = self.session.worker(self.kata.name).call(self, function, args, watch, kwargs or {})
        else:
            fn = getattr(self.solution, function, None)
            if not callable(fn):
                raise self.missing(function)
            guards = torch_private.shape_guards(args)
            try:
                result = fn(*args, **(kwargs or {}))
            except NotImplementedError:
                raise self.stub(function) from None
            except Exception as exc:
                raise CheckFailed(f"{function} raised {describe_exception(exc, path)}.") from None
            called = Called(result, args, watch, type(result).__name__,
                            torch_private.guards_added(guards, (args, result)))
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
