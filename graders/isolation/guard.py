"""The runtime guard: notice when solution code changes what the grader relies on.

A snapshot is taken before the first solution file of a session is imported: which object every name
of the timers, the grader's own modules, torch's functional and module namespaces and the builtins
refers to, plus the environment variables that steer grading. After every check the grader compares.
A solution that monkeypatches time.perf_counter, torch.utils.benchmark.Timer, nn.Conv2d.forward or a
grader function (to make the baseline slower or a verdict kinder) is caught even when the patch does
not help it, and the kata is disqualified rather than scored.

The guard runs in the process that runs the solution, so a solution that knows about it can undo it;
the static scan (graders/isolation/scan.py) flags the introspection that would take. Names added after the
snapshot are ignored: torch and the graders import submodules lazily.

May import: the standard library and torch.
"""
from __future__ import annotations

import builtins
import operator
import os
import sys
import time
import timeit
from itertools import repeat
from pathlib import Path

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F

WATCHED_ENVIRONMENT = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "PYTHONHASHSEED")


def _watched_namespaces() -> dict[str, dict]:
    """Module and class namespaces by name; a class's mappingproxy is live, so it can be compared later."""
    from torch.utils import benchmark
    from torch.utils.benchmark.utils import timer as benchmark_timer

    namespaces = {"time": vars(time), "timeit": vars(timeit), "builtins": vars(builtins), "operator": vars(operator),
                  "torch": vars(torch), "torch.nn.functional": vars(F), "torch.fx": vars(torch.fx),
                  "torch.utils.benchmark": vars(benchmark), "torch.utils.benchmark.utils.timer": vars(benchmark_timer),
                  "torch.Tensor": vars(torch.Tensor), "torch.utils.benchmark.Timer": vars(benchmark.Timer),
                  "torch.fx.GraphModule": vars(torch.fx.GraphModule), "torch.fx.Graph": vars(torch.fx.Graph),
                  "torch.nn.Module": vars(nn.Module)}
    for name in dir(nn):
        kind = getattr(nn, name)
        if isinstance(kind, type) and issubclass(kind, nn.Module):
            namespaces[f"torch.nn.{name}"] = vars(kind)
    for name, module in list(sys.modules.items()):
        if module is not None and (name == "graders" or name.startswith("graders.")):
            namespaces[name] = vars(module)
            for attr, value in list(vars(module).items()):
                if isinstance(value, type) and getattr(value, "__module__", None) == name:
                    namespaces[f"{name}.{attr}"] = vars(value)
    return namespaces


# torch.compile patches torch itself on first use (nn.Module.__init__ for generation tagging,
# torch.manual_seed to disable tracing): changes by code in these files are torch's own, not the solution's.
TORCH_SELF_PATCHERS = tuple(str(Path(torch.__file__).parent / part) for part in ("_dynamo", "_compile.py", "_inductor"))


def _patched_by_torch(value) -> bool:
    code = getattr(value, "__code__", None)
    return code is not None and code.co_filename.startswith(TORCH_SELF_PATCHERS)


class Guard:
    """Identity snapshot of what the grader relies on; `violations()` names what changed since."""

    IGNORED = {("builtins", "_")}  # the interactive interpreter's last result
    # Caches Python and torch add to classes on their own: copyreg's slot names (on deepcopy), and
    # torch.compile's generation tagging of nn.Module.
    ADDED_BY_RUNTIME = {"__slotnames__", "___has_generation_tag_patch"}

    def __init__(self):
        self._live = _watched_namespaces()
        self.namespaces = {name: dict(namespace) for name, namespace in self._live.items()}
        self.modules = {name: sys.modules[name] for name in self.namespaces if name in sys.modules}
        self.environment = {name: os.environ.get(name) for name in WATCHED_ENVIRONMENT}
        self._settle()

    _MISSING = object()

    def _settle(self) -> None:
        """Remember the namespaces as they are now, for the fast pass: what each watched name refers to and,
        for a class, every name it has."""
        self._settled = []
        for name, before in self.namespaces.items():
            live, names = self._live[name], tuple(before)
            keys = frozenset(live.keys()) if isinstance(live, type(vars(object))) else None
            self._settled.append((live, names, tuple(map(live.get, names, repeat(self._MISSING))), keys))

    def _unchanged_since_settled(self) -> bool:
        """Whether every watched name refers to the very object it did when last settled and no class gained
        or lost a name: one pass at C speed over some 20,000 names, where the search that names what changed
        took 5 ms (a grading asks after every check)."""
        return all(all(map(operator.is_, map(live.get, names, repeat(self._MISSING)), values))
                   and (keys is None or live.keys() == keys) for live, names, values, keys in self._settled)

    def violations(self) -> list[str]:
        found = []
        if not self._unchanged_since_settled():
            found = self._namespace_violations()
            if not found:  # what changed is the runtime's own (torch's, Python's caches): judged once, not per check
                self._settle()
        for name, module in self.modules.items():
            if sys.modules.get(name) is not module:
                found.append(f"sys.modules[{name!r}] was replaced")
        for name, value in self.environment.items():
            if os.environ.get(name) != value:
                found.append(f"environment variable {name} was changed from {value!r} to {os.environ.get(name)!r}")
        return found

    def _namespace_violations(self) -> list[str]:
        found = []
        for name, before in self.namespaces.items():
            live = self._live[name]
            for key, value in before.items():
                if (name, key) in self.IGNORED:
                    continue
                if key not in live:
                    found.append(f"{name}.{key} was deleted")
                elif live[key] is not value and not _patched_by_torch(live[key]):
                    found.append(f"{name}.{key} was replaced")
            if isinstance(live, type(vars(object))):  # a class: a new name can shadow an inherited one
                found += [f"{name}.{key} was added" for key in live.keys() - before.keys() if key not in self.ADDED_BY_RUNTIME]
        return found

    def describe(self) -> str | None:
        found = self.violations()
        if not found:
            return None
        shown = "; ".join(found[:3]) + (f"; and {len(found) - 3} more" if len(found) > 3 else "")
        return (f"tampering: the solution changed what the grader relies on ({shown}). A pass may change the "
                f"GraphModule it is given, never the process that grades it; this kata is disqualified.")
