"""Tests marked `timing` measure speed: under pytest-xdist each one holds an exclusive lock on the
machine while it runs, and every other test a shared one, so no timing shares the CPU with other tests
of this run (correctness tests still run on every core)."""
import fcntl
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def machine_lock(config, exclusive: bool):
    run = getattr(config, "workerinput", {}).get("testrunuid")
    if run is None:  # not under xdist: nothing runs beside this test
        yield
        return
    with open(Path(tempfile.gettempdir()) / f"fx-katas-tests-{run}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with machine_lock(item.config, exclusive=item.get_closest_marker("timing") is not None):
        yield
