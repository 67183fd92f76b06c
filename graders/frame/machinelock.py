"""The machine lock: grading processes that share a machine share it while they compute, and a timed
stretch holds it alone, so no clock that decides a verdict runs beside other grading on that machine.

A readers-writer lock on a file (flock): shared by everything that computes, exclusive while something
times. Whoever waits for the exclusive lock goes first: a turnstile (a second file, taken exclusively
for a moment before the lock itself) holds back new shared holders meanwhile, so a timing waits for the
checks that already run, never for checks that start after it asked. flock's locks belong to an open
file and end with the process that holds them: a grading process that is killed lets go at once.

Used by the fleet's grading processes (graders/competition/jobs.py passes --machine-lock to the pytest
plugin) and by the project's own test suite under pytest-xdist (tests/conftest.py). With a log file,
each holder appends a line as it takes the lock and as it lets go, while holding it, so the log's order
is the lock's order: tests replay it to prove that no timed stretch ran beside other grading.

May import: the standard library only.
"""
from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path


def default_path() -> Path:
    """This machine's lock, shared by every grading job on it ($FX_KATAS_MACHINE_LOCK overrides)."""
    return Path(os.environ.get("FX_KATAS_MACHINE_LOCK") or Path(tempfile.gettempdir()) / "fx-katas-machine.lock")


class MachineLock:
    """One process's handle on the machine lock at `path`; `log`, if given, records every take and release."""

    def __init__(self, path: Path | str, log: Path | str | None = None):
        self.path, self.log = Path(path), log
        self._file = None
        self.exclusive: bool | None = None  # None: not held
        self.label = ""  # what holds it, for the log (the grading process's current check)

    @property
    def turnstile(self) -> Path:
        """The second file (see the module's docstring): whoever waits for the lock alone holds it meanwhile."""
        return self.path.with_name(self.path.name + ".turnstile")

    def files(self) -> tuple[Path, Path]:
        """The lock's files: whoever made a lock of its own removes them once no process uses it."""
        return self.path, self.turnstile

    def _open(self, path: Path):
        # Read-only: flock needs no write access, so one user's lock file serves every user of the machine.
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
        return os.fdopen(fd, "rb")

    def _event(self, event: str) -> None:
        if self.log:
            line = json.dumps({"pid": os.getpid(), "event": event, "lock": self.path.name, "by": self.label,
                               "time": round(time.time(), 3)}) + "\n"
            fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())  # one write with O_APPEND: lines of concurrent holders never mix
            finally:
                os.close(fd)

    def take(self, exclusive: bool) -> None:
        """Wait for the lock (through the turnstile) and hold it until release()."""
        if self._file is None:
            self._file = self._open(self.path)
        if exclusive:
            self._event("wait")
        with self._open(self.turnstile) as turnstile:  # closing it lets the next one through
            fcntl.flock(turnstile, fcntl.LOCK_EX)
            fcntl.flock(self._file, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        self.exclusive = exclusive
        self._event("exclusive" if exclusive else "shared")

    def release(self) -> None:
        if self.exclusive is not None:
            self._event("release")
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self.exclusive = None

    def close(self) -> None:
        self.release()
        if self._file is not None:
            self._file.close()
            self._file = None

    def let_others_in(self) -> None:
        """Held shared: let go and take it again, so a timing that waits for the lock goes first."""
        if self.exclusive is False:
            self.release()
            self.take(False)

    @contextmanager
    def hold(self, exclusive: bool):
        """Hold the lock, shared or exclusive, for the block. Where this process already holds it shared and
        wants it exclusive, it lets go first (waiting for the turnstile while holding it would deadlock with
        a timing waiting for it) and takes it shared again after. Held enough already: nothing to do."""
        before = self.exclusive
        if before is not None and (before or not exclusive):
            yield
            return
        try:
            self.release()
            self.take(exclusive)
            yield
        finally:
            self.release()
            if before is not None:
                self.take(before)
