"""No timing shares the CPU with other tests of this run, while everything else runs on every core.

Under pytest-xdist the tests share a lock on the machine: shared by everything that computes, exclusive
while something times. Timing here means the stretches graders.run.timing.alone() wraps (a speed level's
interleaved rounds, kata 10's two timing loops): only those run alone, not the whole speed check (its
model building, byte count and output comparisons hold the lock shared like any other work).

- A plain test holds the shared lock for its whole run; a timed stretch inside turns it exclusive.
- A test marked `locks_per_check` (it grades in process, and its checks are all it computes) holds the
  shared lock only while each check runs, so a timing elsewhere waits for one check, not a whole test.
  So does a test whose grading runs in subprocesses given this run's lock (the `machine_lock_file` fixture,
  as FX_KATAS_MACHINE_LOCK): the test holds nothing, its grading processes take the lock per check, shared,
  and exclusively for each timed stretch, as a fleet machine's do. Marked `timing` as well, it runs last.
- A test marked `timing` without `locks_per_check` times in a subprocess, which cannot take the lock from
  there: it holds the lock exclusively for its whole run.

The lock is the fleet's own (graders/frame/machinelock.py): whoever waits for the exclusive lock goes
first, a turnstile holding back new shared holders meanwhile. Tests marked `timing` run last (their order under xdist, with
--maxschedchunk 2 from the root conftest.py, follows the collection order): by then the long
correctness tests are done, so a timing waits for one check at most. A test that times without the
`timing` mark fails and says so.
"""
import os
import tempfile
from contextlib import contextmanager, nullcontext
from pathlib import Path

import pytest
import torch

from graders.frame.machinelock import MachineLock
from graders.run import timing
from graders.run.session import GradingSession

# "lock": this xdist run's machine lock (graders/frame/machinelock.py); "item": the running test;
# "timed": whether it has timed
_state = {}

# The project's tests keep no exported program across processes (graders/run/exported.py, `cache_folder`): they
# neither read what a learner's gradings left in the user's cache nor write there; tests/test_exported.py sets
# its own folder. The subprocesses a test starts inherit it.
os.environ["FX_KATAS_EXPORT_CACHE"] = "off"


def machine_lock(exclusive: bool):
    """Hold the machine lock, shared or exclusive, for the block (MachineLock.hold); not under xdist, nothing."""
    lock = _state.get("lock")
    return lock.hold(exclusive) if lock else nullcontext()


@contextmanager
def _timed_alone():
    _state["timed"] = True
    with machine_lock(exclusive=True):
        yield


def _lock_path(run: str) -> Path:
    return Path(tempfile.gettempdir()) / f"fx-katas-tests-{run}.lock"


def pytest_configure(config):
    run = getattr(config, "workerinput", {}).get("testrunuid")
    if run is not None:
        _state["lock"] = MachineLock(_lock_path(run))
        # One thread for each of the processes that share the cores: with a pool as large as the machine
        # in every worker and in every process a test starts, their threads spin against each other (on
        # 2 cores the run took 410 s of CPU with the default pools, 290 s with one thread each).
        torch.set_num_threads(1)
        os.environ["OMP_NUM_THREADS"] = "1"
    timing.run_alone_with(_timed_alone)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """Under xdist, in the process that runs the workers: note the run's lock, to remove it at the end."""
    _state["run's lock"] = MachineLock(_lock_path(node.workerinput["testrunuid"]))


def pytest_unconfigure(config):
    """The run's lock and its turnstile go with the run (every worker has ended): before, each run of the suite left
    the two files in the temporary folder."""
    if "run's lock" in _state:
        for path in _state["run's lock"].files():
            path.unlink(missing_ok=True)


@pytest.fixture
def machine_lock_file(tmp_path) -> Path:
    """The machine lock for a test's grading subprocesses (FX_KATAS_MACHINE_LOCK): under xdist this run's own,
    so that their timed stretches hold the machine alone against every other test of the run (mark the test
    `locks_per_check`: it holds nothing itself); run alone, one of the test's own."""
    lock = _state.get("lock")
    return lock.path if lock else tmp_path / "machine.lock"


def _locks_per_check(item) -> bool:
    return item.get_closest_marker("locks_per_check") is not None


def _timing(item) -> bool:
    return item.get_closest_marker("timing") is not None


# The system tests: they start a Dask fleet, a live arena server, a browser, or the zygote and nursery machinery,
# and take about 40% of the suite's time (docs/contributors.md, pair 28). Marked `system`, so that
# `uv run pytest -m "not system"` is a quicker loop while working on graders; `uv run pytest` (and CI) runs them all.
SYSTEM_MODULES = {"test_fleet.py", "test_arena.py", "test_arena_servers.py", "test_arena_controls.py",
                  "test_arena_browser.py", "test_arena_load.py", "test_machine.py"}
assert all((Path(__file__).parent / name).is_file() for name in SYSTEM_MODULES), "SYSTEM_MODULES names a missing file"


def pytest_itemcollected(item):
    if item.path.name in SYSTEM_MODULES:
        item.add_marker("system")


def pytest_collection_modifyitems(config, items):
    """Under xdist: plain tests first (the long ones run a subprocess and hold the lock throughout), then
    tests that lock per check, then tests that time."""
    if "lock" in _state:
        items.sort(key=lambda item: (_timing(item), _locks_per_check(item)))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    _state.update(item=item.nodeid, timed=False)
    if _locks_per_check(item):
        result = yield
    else:
        with machine_lock(exclusive=_timing(item)):
            result = yield
    if _state["timed"] and not _timing(item):
        pytest.fail(f"{item.nodeid} timed something (graders.run.timing.alone) without the `timing` mark: mark "
                    "it, so that it runs with the other timing tests, after the rest (tests/conftest.py).",
                    pytrace=False)
    return result


_run_check = GradingSession.run


def _run_check_under_the_lock(session, check):
    with machine_lock(exclusive=False):
        return _run_check(session, check)


# Patched before any grading session exists, so the runtime guard's snapshot already holds this function.
GradingSession.run = _run_check_under_the_lock
