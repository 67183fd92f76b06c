"""A fleet machine's nurseries: one per team's tree that the machine grades, so its workers start warm
(graders/isolation/nursery.py), shared by that team's jobs on this machine and closed when idle.

A job stages its kata's solution file in its team's folder here (`NN_name/solution.py`, in the Dask worker's
scratch space, read-only inside the team's sandbox) and grades with that nursery's socket. A nursery serves one team's tree (the
key: the team and a hash of all its files, so a resubmission gets a sandbox of its own) and only it.
Nurseries start from one long-lived thread of this process: the sandbox dies with the thread that
started it (bubblewrap's --die-with-parent), and a Dask worker's job threads come and go. One that no job
has used for IDLE_SECONDS, or beyond the KEEP_IDLE most recently used idle ones, is closed (its workers
with it) and its folder removed: when a job ends, and IDLE_SECONDS after it even if no other job ever
ends on this machine (before, an idle nursery's ~690 MB stayed until one did).

May import: graders.frame, graders.isolation (the nursery).
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from graders.frame.machinelock import MachineLock, default_path
from graders.frame.scratch import claim_folder, write_whole
from graders.isolation.nursery import Limits, Nursery, open_nursery

IDLE_SECONDS, KEEP_IDLE = 60.0, 2


@dataclass
class _Team:
    solutions: Path  # the team's staged files: in the Dask worker's own scratch space, which Dask purges
    sockets: Path  # the nursery's socket: a short path in /tmp (a socket's path has at most 107 bytes)
    owner: object  # the sockets folder's claim file, held locked while this process lives (see _sockets_folder)
    started: Future
    users: int = 0
    used: float = field(default_factory=time.monotonic)


def _scratch() -> str | None:
    """The Dask worker's local directory (removed with the worker, or purged by the next one if it died)."""
    try:
        from distributed import get_worker

        return get_worker().local_directory
    except (ImportError, ValueError, AttributeError):
        return None


_lock = threading.Lock()
_teams: dict[str, _Team] = {}
_starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fx-katas-nurseries")  # its thread never ends


SOCKETS = Path("/tmp") if os.path.isdir("/tmp") else Path(tempfile.gettempdir())


def _sockets_folder():
    """A new folder for a nursery's socket, and its claim (graders/frame/scratch.py): folders whose claim
    nobody holds (their process was killed before it could remove them) go first."""
    return claim_folder("fx-katas-nursery-", SOCKETS)


def _start(solutions: Path, sockets: Path, limits: Limits) -> Nursery:
    """A nursery loads torch and the katas' models (2 s of CPU): grading work, held off timings like any other."""
    with MachineLock(default_path()).hold(exclusive=False):
        return open_nursery(solutions, sockets, limits)


def _usable(team: _Team) -> bool:
    if not team.started.done():
        return True
    return team.started.exception() is None and team.started.result().alive()


@contextmanager
def team_nursery(key: str, kata: str, source: bytes | None, memory_gb: float = Limits.memory_gb, device: str = "cpu"):
    """This team's solutions folder (with `source` staged as kata's solution file) and its nursery's socket
    (None if it could not start: the judge then starts each worker itself), for one job; each worker the
    nursery forks may take `memory_gb` of memory (the organiser's --kata-memory; counted as cap_memory counts
    it on `device`)."""
    stale = None
    with _lock:
        team = _teams.get(key)
        if team is not None and team.users == 0 and not _usable(team):  # died, or never started: try again
            stale, team = _teams.pop(key), None
        if team is None:
            solutions = Path(tempfile.mkdtemp(prefix="fx-katas-team-", dir=_scratch()))
            sockets, claim = _sockets_folder()
            started = _starter.submit(_start, solutions, sockets, Limits(memory_gb=memory_gb, device=device))
            team = _teams[key] = _Team(solutions, sockets, claim, started)
        team.users += 1
    if stale is not None:
        _close(stale)
    try:
        if source is not None:
            _stage(team.solutions / kata / "solution.py", source)
        try:
            socket_path = team.started.result().socket_path
        except Exception:  # noqa: BLE001 - no nursery: the judge starts each worker itself, as off the fleet
            socket_path = None
        yield team.solutions, socket_path
    finally:
        with _lock:
            team.users -= 1
            team.used = time.monotonic()
        _sweep()
        later = threading.Timer(IDLE_SECONDS + 1.0, _sweep)  # the sweep that finds it idle, if no job ends first
        later.daemon = True
        later.start()


def _stage(staged: Path, source: bytes) -> None:
    """Write `source` as `staged` where another job of the same tree's kata may be staging the same bytes at the
    same moment (a team that submitted one file twice: one key, one folder, one content hash): each job writes a file
    of its own and renames it over the name (`write_whole`). Before, both wrote one `solution.part`, and the second
    rename found it gone: that job failed, and the team's resubmission scored 0."""
    staged.parent.mkdir(exist_ok=True)
    if not staged.exists():
        write_whole(staged, source, mode=0o644)  # the mode it had before under the usual umask


def _sweep() -> None:
    """Close the nurseries idle for IDLE_SECONDS, beyond the KEEP_IDLE most recently used, or dead."""
    with _lock:
        idle = sorted((t for t in _teams.items() if t[1].users == 0), key=lambda t: t[1].used, reverse=True)
        closing = [(k, t) for n, (k, t) in enumerate(idle)
                   if n >= KEEP_IDLE or time.monotonic() - t.used > IDLE_SECONDS or not _usable(t)]
        for k, _ in closing:
            del _teams[k]
    for _, t in closing:
        _close(t)


def _close(team: _Team) -> None:
    try:
        if team.started.exception() is None:
            team.started.result().close()
    finally:
        shutil.rmtree(team.solutions, ignore_errors=True)
        shutil.rmtree(team.sockets, ignore_errors=True)
        team.owner.close()


@atexit.register
def close_all() -> None:
    with _lock:
        teams = list(_teams.values())
        _teams.clear()
    for team in teams:
        _close(team)
