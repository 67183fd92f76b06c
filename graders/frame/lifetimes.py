"""How long the processes grading starts may live: each dies with the process that started it, and a
process that leads its own session is killed with everything it started.

Used by the grading processes (graders/batch/processes.py, graders/batch/zygote.py) and the worker
processes and nurseries (graders/isolation/sandbox.py, graders/isolation/nursery.py).

May import: the standard library only.
"""
from __future__ import annotations

import os
import signal
import sys


def die_with_parent() -> None:
    """In a child: SIGKILL when the thread that started it ends (Linux's PR_SET_PDEATHSIG; elsewhere nothing)."""
    if sys.platform != "linux":
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def kill_group(pid: int) -> None:
    """SIGKILL the process group `pid` leads, and `pid` itself in case it has not made its own group yet."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
