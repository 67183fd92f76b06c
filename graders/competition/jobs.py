"""What one grading job runs on a worker machine of the fleet (graders/competition/fleet.py submits it).

A job is data: one team's solution file for one kata (bytes), the kata, the phase (all levels; or, with
--timing-host, the correctness levels or the speed level), whether to time, the device, the options and the
secret seed, stamped with the organiser's project version. `grade_job` checks the stamp against its own
machine's (a machine at another version refuses the job with a sentence saying so), stages the file in a
folder of its team's on this machine, grades it as a single machine does (graders.batch.processes.run_katas:
a grading process, here forked from this machine's zygote, graders/batch/zygote.py, whose judge runs the
solution only in a sandboxed worker process, here forked by the team's nursery, graders/competition/
nurseries.py: neither this process nor the judge ever imports solution code) and returns JSON-able data:
the check records or a failure, the machine, and its own start and end.

Timing stays alone per machine: every grading process of a machine shares its machine lock
(graders/frame/machinelock.py), shared while checks run and exclusive while a speed level times, so
no clock runs beside other grading there, whichever jobs the machine runs at once. The Dask worker imports this module by name, so the function that runs is always
the worker machine's own copy of the project.

May import: graders.frame, graders.batch, graders.competition (nurseries, store).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import socket
import time
from functools import cache
from pathlib import Path

from graders.batch.processes import CORRECTNESS_LEVELS, SPEED_LEVELS, run_katas
from graders.batch.zygote import Zygote
from graders.competition.nurseries import team_nursery
from graders.competition.store import files_hash
from graders.frame.catalogue import KATAS, REPO_ROOT
from graders.frame.levels import LEVELS, CheckResult
from graders.frame.machinelock import default_path

# The phases of a kata's grading: every level in one job (the speed level's timed stretches alone on the
# machine, under its machine lock; with --no-speed the speed level is only recorded as skipped), or, with
# --timing-host, its correctness levels anywhere and its speed level on the timing host.
PHASES = {"all": None, "correctness": CORRECTNESS_LEVELS, "speed": SPEED_LEVELS}
SOLUTION = re.compile(r"^(\d\d_[a-z0-9_]+)/solution\.py$")
# Sentences that mean the solution never loaded (graders/frame/solution.py, graders/isolation/worker.py),
# or hung (graders/run/session.py): a correctness job whose every failure says one of them, and that
# passed nothing, is not followed by a speed job that would load it again and wait out its own time-out.
NOT_LOADED = ("does not exist:", "does not compile:", "importing ", "timed out: importing the solution",
              "timed out: the check did not finish", "earlier checks of")


class WrongVersion(RuntimeError):
    """The worker machine's project differs from the organiser's: it refuses the job."""


@cache
def grading_files(root: Path = REPO_ROOT) -> list[Path]:
    """Everything a grading process imports or collects: graders/ (the graders, kata declarations and manifests),
    the root conftest.py (it loads the graders' pytest plugin), pyproject.toml (pytest's settings) and each kata's
    test file; not the learner's solution.py, nor the READMEs."""
    graders = [p for p in (root / "graders").rglob("*") if p.is_file() and "__pycache__" not in p.parts
               and p.suffix not in (".pyc", ".pyo")]
    others = [root / "conftest.py", root / "pyproject.toml", *root.glob("katas/*/test_*.py"), *root.glob("katas/*/conftest.py")]
    return sorted([*graders, *(p for p in others if p.is_file())])


def project_version(root: Path = REPO_ROOT) -> str:
    """A hash of the grading files (their paths and bytes): a worker grades only jobs of its own version."""
    digest = hashlib.sha256()
    for path in grading_files(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def device_name(device: str) -> str:
    if device == "cuda":
        import torch  # only here: organiser mode's other paths need no tensor library

        return torch.cuda.get_device_name()
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine(device: str = "cpu") -> dict:
    """The machine a job ran on: its host name, the Dask worker (two workers may share a host) and the CPU or
    GPU model it timed with."""
    return {**_host(device), "worker": _worker_name()}


@cache
def _host(device: str) -> dict:
    return {"host": socket.gethostname(), "device": device, "device_name": device_name(device)}


def _worker_name() -> str | None:
    try:
        from distributed import get_worker

        return str(get_worker().name)
    except (ImportError, ValueError):  # not in a Dask worker's task
        return None


def make_job(team: str, kata: str, files: dict[str, bytes], phase: str, seed: int, *, speed: bool = True,
             device: str = "cpu", threads: int = 1, kata_timeout: float = 900.0, kata_memory: float = 8.0,
             check_timeout: float | None = None) -> dict:
    """A job for the fleet: only this kata's solution file travels."""
    name = f"{kata}/solution.py"
    return {"version": project_version(), "team": team, "kata": kata, "phase": phase, "speed": speed, "seed": seed,
            "files": {name: files[name]} if name in files else {}, "tree": files_hash(files), "device": device, "threads": threads,
            "kata_timeout": kata_timeout, "kata_memory": kata_memory, "check_timeout": check_timeout}


def _threads_each() -> int | None:
    """Thread pools for the grading processes of a fleet worker: its cores shared by the jobs it runs at once."""
    try:
        from distributed import get_worker

        return max(1, len(os.sched_getaffinity(0)) // get_worker().state.nthreads)
    except (ImportError, ValueError, AttributeError):
        return None


def _worker_address() -> str:
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return f"pid {os.getpid()}"


def _log(event: str, job: dict, address: str) -> None:
    """One line per job start and end in $FX_KATAS_JOB_LOG (if set): the order of jobs on each worker."""
    path = os.environ.get("FX_KATAS_JOB_LOG")
    if path:
        line = json.dumps({"event": event, "worker": address, "team": job["team"], "kata": job["kata"],
                           "phase": job["phase"], "pid": os.getpid()}) + "\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())  # one write with O_APPEND: lines of concurrent jobs never mix
        finally:
            os.close(fd)


def solution_of(job: dict) -> bytes | None:
    """The bytes of the job's `NN_kata/solution.py` for its own kata, or None: nothing else a job carries reaches
    the disk (make_job sends only that file; a job made otherwise is read no further)."""
    return next((data for name, data in job["files"].items()
                 if (found := SOLUTION.match(name)) and found.group(1) == job["kata"]), None)


def grade_job(job: dict) -> dict:
    """Run one job on this machine; raises WrongVersion when this machine's project is not the organiser's."""
    address, here = _worker_address(), machine(job["device"])
    mine = project_version()
    if job["version"] != mine:
        raise WrongVersion(
            f"worker {address} on {here['host']} refuses {job['team']}'s {job['kata']}: its project version "
            f"(hash of graders/, conftest.py, pyproject.toml and the katas' test files) is {mine[:12]}, the "
            f"organiser's is {job['version'][:12]}; check out the organiser's commit there, run `uv sync` and start "
            f"its worker again.")
    kata, levels = job["kata"], PHASES[job["phase"]]
    if kata not in KATAS:
        raise ValueError(f"unknown kata {kata!r}")
    _log("start", job, address)
    started = time.time()
    try:
        source = solution_of(job)
        with team_nursery(f"{job['team']}\0{job['tree']}\0{job['device']}", kata, source, job["kata_memory"],
                          job["device"]) as (tree, nursery):
            # Forked from this machine's zygote, sharing its machine lock with every other grading process
            # here; its workers forked by the team's nursery.
            args = argparse.Namespace(device=job["device"], threads=job["threads"], no_speed=not job["speed"],
                                      isolate=True, kata_timeout=job["kata_timeout"], kata_memory=job["kata_memory"],
                                      check_timeout=job.get("check_timeout"),
                                      fork=True, machine_lock=default_path(), nursery=nursery)
            outcomes, _ = run_katas([kata], tree, args, job["seed"], levels, 1, threads_each=_threads_each())
        outcome = outcomes[kata]
    finally:
        _log("end", job, address)
    result = {"team": job["team"], "kata": kata, "phase": job["phase"], "worker": address, "machine": here,
              "started": started, "seconds": time.time() - started}
    if isinstance(outcome, dict):
        return {**result, "failed": outcome}
    return {**result, "records": [r.to_dict() for r in outcome]}


def warm_up() -> None:
    """Start this machine's zygote now (it imports torch and the graders, about 2 s), not with the first job."""
    Zygote.get()


def did_not_load(result: dict) -> str | None:
    """Why a correctness job's solution never loaded (it hung importing, did not compile, raised, was
    missing, or its grading process hung or crashed), or None: then it is not loaded again for speed."""
    if "failed" in result:
        return result["failed"]["message"]
    records = [CheckResult.from_dict(r) for r in result["records"]]
    failures = [r for r in records if not r.passed and not r.skipped]
    if records and not any(r.passed for r in records) and failures and all(
            any(sentence in r.message for sentence in NOT_LOADED) for r in failures):
        return failures[0].message.splitlines()[0]
    return None


def speed_not_run(kata: str, reason: str) -> dict:
    """The speed level of a solution that did not load in its correctness job, without loading it again."""
    record = CheckResult(kata, 3, "speed", False, 0.0, float(LEVELS[3].points),
                         f"not run: the solution did not load in its correctness job ({reason})")
    return {"records": [record.to_dict()], "machine": None, "worker": None, "seconds": 0.0}
