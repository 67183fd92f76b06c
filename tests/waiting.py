"""Shared by the tests that wait for another process to get somewhere: `wait_for`, the one polling loop.

May import: the standard library only.
"""
from __future__ import annotations

import time


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
