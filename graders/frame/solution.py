"""A learner's solution module: loading it by path, and the sentences for what can go wrong with it.

Used where solution code runs: the in-process session (graders/run/session.py) and the worker process
(graders/isolation/serve.py). May import: the standard library only.
"""
from __future__ import annotations

import importlib.util
import sys
import traceback
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from graders.frame.levels import CheckFailed
from graders.frame.lifetimes import FIRST_SOLUTION, long_lived


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
        with long_lived(FIRST_SOLUTION):  # what it imports lives as long as the grading (kata 13's: Inductor)
            spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise CheckFailed(f"{path} does not compile: {exc.msg} at line {exc.lineno}.") from None
    except Exception as exc:
        raise CheckFailed(f"importing {path} raised {describe_exception(exc, path)}.") from None
    return module


def is_timeout(exc: BaseException) -> bool:
    """pytest-timeout's signal method fails the test by raising from inside whatever code is running."""
    return type(exc).__name__ == "Failed" and str(exc).startswith("Timeout")


@dataclass
class Called:
    """One call of a learner function: its result, and its arguments and watched objects after the call."""

    result: Any
    args: tuple
    watched: tuple
    type: str  # the name of the result's type (as the solution's process saw it)
    # The guards the call added to the ShapeEnvs behind the fake values of its arguments and result (chapter 2: a
    # pass that specialised a size symbol), as text, measured in the process where it ran: torch_private's
    # `guards_added`, around the call in graders/run/context.py or in the worker (graders/isolation/serve.py).
    added_guards: list[str] = field(default_factory=list)
