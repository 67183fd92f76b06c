"""No timing shares the CPU with other tests of this run, while everything else runs on every core.

Under pytest-xdist the tests share a lock on the machine, shared by everything that computes and
exclusive for timing. A speed-level check graded in the test's own process (graders.core
GradingSession.run at level 3) holds it exclusively for that check alone: it waits until what runs
beside it is done, and nothing starts until it is. A plain test holds the shared lock for its whole
run; a test marked `locks_per_check` (it grades in process, and its checks are all it computes) only
while each check runs, so a timing elsewhere waits for one check, not for the whole test. A test
marked `timing` grades a speed level in a subprocess, which cannot take the lock from there: it holds
the exclusive lock for its whole run. Whoever waits for the exclusive lock goes first: a turnstile,
taken before the lock itself, holds back new shared holders meanwhile.
"""
import fcntl
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

from graders.core import GradingSession

_state = {}  # "run": this xdist run's id; "held": the lock file the running test holds for its whole run


def _lock_file(name: str):
    return open(Path(tempfile.gettempdir()) / f"fx-katas-tests-{_state['run']}.{name}", "a")


def _acquire(lock, exclusive: bool) -> None:
    with _lock_file("turnstile") as turnstile:  # closing it lets the next one through
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)


@contextmanager
def machine_lock(exclusive: bool, held=None):
    """Hold the machine lock; with `held`, the test's shared lock, turned exclusive and back. It is let go
    first: waiting for the turnstile while holding it would deadlock with a timing waiting for it."""
    if "run" not in _state:  # not under xdist: nothing runs beside this test
        yield None
        return
    lock = held or _lock_file("lock")
    try:
        if held:
            fcntl.flock(lock, fcntl.LOCK_UN)
        _acquire(lock, exclusive)
        yield lock
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        if held:
            _acquire(lock, False)
        else:
            lock.close()


def pytest_configure(config):
    run = getattr(config, "workerinput", {}).get("testrunuid")
    if run is not None:
        _state["run"] = run


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    if item.get_closest_marker("locks_per_check") is not None:
        yield
        return
    exclusive = item.get_closest_marker("timing") is not None
    with machine_lock(exclusive) as lock:
        _state["held"] = (lock, exclusive)
        try:
            yield
        finally:
            _state.pop("held", None)


_run_check = GradingSession.run


def _run_check_under_the_lock(session, check):
    (held, exclusive), timed = _state.get("held", (None, False)), check.level == 3
    if exclusive or (held is not None and not timed):  # the test's own lock covers it
        return _run_check(session, check)
    with machine_lock(exclusive=timed, held=held):
        return _run_check(session, check)


# Patched before any grading session exists, so the runtime guard's snapshot already holds this function.
GradingSession.run = _run_check_under_the_lock
