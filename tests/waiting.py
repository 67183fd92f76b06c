"""Shared by the tests that wait for another process to get somewhere: `wait_for`, the one polling loop, and
`running`, whether a process still runs.

May import: the standard library only.
"""
from __future__ import annotations

import os
import time
from pathlib import Path


def wait_for(condition, timeout: float, what: str, every: float = 0.1):
    """`condition()`'s first true value, asked every `every` seconds; AssertionError naming `what` when none comes
    within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


def running(pid: int) -> bool:
    """Is `pid` a live process? Not once it has ended, reaped or not (an ended process nobody reaps, its parent gone
    in a container whose init reaps nothing, stays a zombie)."""
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False
