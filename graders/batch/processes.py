"""Katas of one tree graded in pytest subprocesses: each process grades kata after kata (--claims shares
them out), writes a progress line per check and its check records at the end; a kata whose process
crashed, hung or was tampered with is reported so that the caller can grade it again alone.

May import: graders.frame, graders.batch.summary.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from graders.batch.summary import failed_grading, is_shipped_stub, stub_records, summarise, summarise_phases
from graders.batch.zygote import ForkedProcess
from graders.frame.catalogue import REPO_ROOT
from graders.frame.lifetimes import cap_memory, die_with_parent, kill_group
from graders.frame.levels import CheckResult
from graders.frame.scratch import claimed_folder

# The levels of a correctness phase and of a speed phase (--levels of the pytest plugin).
CORRECTNESS_LEVELS, SPEED_LEVELS = "1,2,4", "3"


def memory_cap(gigabytes: float, device: str = "cpu"):
    """A preexec hook: a solution that allocates without bound gets a MemoryError, not the machine (what the
    cap counts depends on the device: cap_memory). The grading process also dies with the one that started
    it (Linux): a fleet worker killed mid-job leaves no grading running on its machine."""
    limit = int(gigabytes * 2**30)

    def hook():
        cap_memory(limit, device)
        die_with_parent()

    return hook


STARTUP_SECONDS = 300.0  # a grading process's start-up (torch, pytest, collection) before its first kata: no
# solution code runs yet, so only a machine far too busy takes this long; a kata's own clock starts at its first check


class Progress:
    """Follows a grading process through its --progress file: which kata it grades now, since when, and
    the points of each kata so far. Until its first kata starts, the process is starting up: its clock is
    STARTUP_SECONDS, not a kata's (import torch takes seconds on a busy machine, and a kata graded again in
    a process of its own must not pay for it)."""

    def __init__(self, path: Path):
        self.path, self.offset = path, 0
        self.current: str | None = None
        self.since = time.monotonic()
        self.points: dict[str, float] = {}
        self.seconds: dict[str, float] = {}

    def read(self) -> list[str]:
        """Take in the new lines; the katas that are finished (the process has moved past them)."""
        if not self.path.exists():
            return []
        with open(self.path) as progress:
            progress.seek(self.offset)
            lines = progress.readlines()
        complete = [line for line in lines if line.endswith("\n")]  # a line still being written waits
        self.offset += sum(len(line.encode()) for line in complete)
        finished = []
        for line in complete:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            kata = event.get("kata")
            if "started" in event and kata != self.current:
                if self.current is not None:
                    finished.append(self.current)
                    self.seconds[self.current] = time.monotonic() - self.since
                self.current, self.since = kata, time.monotonic()
            if "ended" in event:
                self.points[kata] = event.get("points", 0.0)
        return finished

    def overdue(self, kata_timeout: float) -> bool:
        """Has the kata it grades (or its start-up, before any) run past its time?"""
        limit = kata_timeout if self.current is not None else max(kata_timeout, STARTUP_SECONDS)
        return time.monotonic() - self.since > limit

    def end(self) -> list[str]:
        """The process is gone: its last kata is finished too."""
        finished = self.read()
        if self.current is not None:
            self.seconds[self.current] = time.monotonic() - self.since
            finished.append(self.current)
            self.current = None
        return finished


@dataclass
class GradingProcess:
    """One pytest subprocess of a run_katas call, and its files."""

    process: subprocess.Popen | ForkedProcess
    progress: Progress
    results: Path
    output: Path
    stopped: str | None = None  # the kata it hung on, when it was killed for that

    def records(self) -> dict[str, list[CheckResult]]:
        """The check records it wrote, by kata (none when it was killed or crashed)."""
        data = json.loads(self.results.read_text()) if self.results.exists() else {"results": []}
        graded: dict[str, list[CheckResult]] = {}
        for record in data["results"]:
            graded.setdefault(record["kata"], []).append(CheckResult.from_dict(record))
        return graded

    def vouches(self) -> bool:
        """Whether its records speak for every kata it claimed. Not when it crashed or was stopped (a
        kata it had claimed may never have been graded) or when the runtime guard found tampering,
        which fails every later check in that process, whichever kata it belongs to."""
        if self.stopped or self.process.returncode not in (0, 1) or not self.results.exists():
            return False
        return not json.loads(self.results.read_text()).get("tampering")

    def kill(self) -> None:
        """Kill its process group (the judge and the worker processes it started) and wait for it."""
        kill_group(self.process.pid)
        self.process.wait()

    def last_words(self) -> str:
        tail = self.output.read_text(errors="replace").strip().splitlines() if self.output.exists() else []
        return tail[-1] if tail else "no output"


def run_katas(katas: list[str], tree: Path, args: argparse.Namespace, seed: int, levels: str | None,
              processes: int = 1, report=lambda kata, points, seconds: None,
              threads_each: int | None = None) -> tuple[dict[str, list[CheckResult] | dict], list[str]]:
    """Grade `katas` of `tree` at `levels` in `processes` pytest subprocesses at once, which share them
    out (--claims: each takes the next kata no other has taken, so none idles behind a long kata).

    Returns each kata's check records, or a failed_grading dict (it hung or its process crashed), and
    the katas whose grading a process could not vouch for (see GradingProcess.vouches): grade them
    again, alone. `report(kata, points, seconds)` is called as each kata finishes.

    The seed travels in a file the plugin deletes before any solution code runs, never in argv or the
    environment, so a solution cannot read the hidden models' seed. Each kata may take --kata-timeout
    seconds; a process's --progress file says which kata it is on. With args.fork the processes are forked
    from a zygote that has imported what they need (graders/batch/zygote.py); with args.machine_lock they
    share that machine lock (graders/frame/machinelock.py); threads_each sizes their thread pools (a fleet
    worker's cores shared by its jobs)."""
    test_files = [str(REPO_ROOT / "katas" / kata / f"test_{kata}.py") for kata in katas]
    with claimed_folder("fx-katas-grading-") as tmp:  # removed by the next one if this process is killed
        tmp = Path(tmp)
        (tmp / "claims").mkdir()
        # Plugins grading never uses stay out: anyio's alone costs 0.3 s of start-up (its package is loaded
        # through pytest's assertion rewriting) in every grading process.
        options = ["-q", "-p", "no:cacheprovider", "-p", "no:anyio", "-p", "no:xdist", "-p", "no:xdist.looponfail",
                   "--solutions", str(tree.resolve()), "--device", args.device,
                   "--threads", str(args.threads), "--claims", str(tmp / "claims")]
        options += ["--no-speed"] if args.no_speed else []
        options += ["--isolate"] if args.isolate else []
        options += ["--levels", levels] if levels else []
        options += ["--check-timeout", str(args.check_timeout)] if getattr(args, "check_timeout", None) else []
        options += ["--worker-memory", str(args.kata_memory)] if args.isolate else []  # the worker's cap: the kata's
        options += ["--machine-lock", str(args.machine_lock)] if getattr(args, "machine_lock", None) else []
        options += ["--nursery", str(args.nursery)] if getattr(args, "nursery", None) else []
        running, env = [], dict(os.environ)
        if (processes > 1 or threads_each) and "OMP_NUM_THREADS" not in env:
            # Processes that share the cores get a thread pool each as large as their share: a pool as
            # large as the machine in every one of them spins against the others (the ten references'
            # correctness levels on 2 cores: 78 s of CPU with full pools, 44 s with one thread each).
            env["OMP_NUM_THREADS"] = str(threads_each or max(1, len(os.sched_getaffinity(0)) // processes))
        for n in range(min(processes, len(katas))):
            seed_file = tmp / f"seed{n}"
            seed_file.write_text(str(seed))
            own = ["--seed-file", str(seed_file), "--results-json", str(tmp / f"results{n}.json"),
                   "--progress", str(tmp / f"progress{n}")]
            # Every other process claims from the far end (the files' order is the claims' order): two
            # meet in the middle, so a long kata at either end starts early instead of last.
            order = test_files if n % 2 == 0 else test_files[::-1]
            if getattr(args, "fork", False):  # forked from the warm fork server (graders/batch/zygote.py)
                process = ForkedProcess([*order, *options, *own], tmp / f"output{n}", env, args.kata_memory,
                                        args.device, katas)
            else:
                with open(tmp / f"output{n}", "w") as output:
                    process = subprocess.Popen([sys.executable, "-m", "graders.batch.pytest_process", *order, *options,
                                                *own], cwd=REPO_ROOT, stdout=output, stderr=subprocess.STDOUT,
                                               start_new_session=True, env=env,
                                               preexec_fn=memory_cap(args.kata_memory, args.device))
            running.append(GradingProcess(process, Progress(tmp / f"progress{n}"), tmp / f"results{n}.json",
                                          tmp / f"output{n}"))

        def follow(g: GradingProcess) -> None:
            for kata in g.progress.read() if g.process.poll() is None else g.progress.end():
                report(kata, "failed: timed out" if kata == g.stopped else g.progress.points.get(kata, 0.0),
                       g.progress.seconds[kata])

        try:
            while any(g.process.poll() is None for g in running):
                alive = [g.process for g in running if g.process.poll() is None]
                if len(alive) == 1:  # back as soon as it ends
                    try:
                        alive[0].wait(timeout=0.5)
                    except subprocess.TimeoutExpired:
                        pass
                else:
                    time.sleep(0.5)
                for g in running:
                    follow(g)
                    if g.process.poll() is None and g.progress.overdue(args.kata_timeout):
                        g.stopped = g.progress.current or katas[0]
                        g.kill()
        finally:
            for g in running:
                if g.process.poll() is None:
                    g.kill()
        outcomes: dict[str, list[CheckResult] | dict] = {}
        again: list[str] = []
        stopped = [g.stopped for g in running if g.stopped]
        for g in running:
            follow(g)
            if g.stopped:
                outcomes[g.stopped] = failed_grading(
                    "timed out", f"grading did not finish within {args.kata_timeout:.0f}s; run "
                                 f"`uv run pytest katas/{g.stopped}` to see which check hangs.")
            records = g.records()
            outcomes.update((kata, results) for kata, results in records.items() if kata not in outcomes)
            if not g.vouches():
                again += [kata for kata in katas if kata in records or kata in g.progress.seconds]
        last_words = "; ".join(dict.fromkeys(g.last_words() for g in running))
    again += [kata for kata in katas if kata not in outcomes]
    for kata in katas:
        outcomes.setdefault(kata, failed_grading("crashed", f"grading stopped before any check ran: {last_words}"))
    return outcomes, [kata for kata in katas if kata in again and kata not in stopped]


def grade_tree(tree: Path, katas: list[str], args: argparse.Namespace, seed: int) -> dict[str, dict]:
    """A learner's run: every kata of one tree, by kata; returns results[kata] (summaries).

    A grading process grades kata after kata: starting one (importing torch and pytest) costs about as
    much as grading a kata. The correctness levels are graded by --jobs processes at once, then the speed
    levels of all katas by one process alone, so no timing shares the machine with other grading (with
    --jobs 1 or --no-speed, one pass over all levels). A kata whose process cannot vouch for it (a crash,
    a hang, tampering) is graded again in a process of its own, so what one kata's solution does costs
    that kata only. A kata whose solution is still the shipped stub, byte for byte, is reported from its
    bytes, not graded (every check of a stub fails): untouched katas cost nothing, and a tree of stubs
    starts no grading process. (Organiser mode grades on the fleet instead: graders/competition/fleet.py.)"""
    stubs = {kata: summarise(kata, stub_records(kata, None, speed=not args.no_speed)) for kata in katas
             if is_shipped_stub(kata, _read(tree / kata / "solution.py"))}
    for kata in stubs:
        print(f"{kata}: not started (solution.py is the shipped stub; not graded)", file=sys.stderr, flush=True)
    order, katas = list(katas), [kata for kata in katas if kata not in stubs]
    if not katas:
        return stubs
    phases = [(None, args.jobs)] if args.jobs == 1 or args.no_speed else [(CORRECTNESS_LEVELS, args.jobs), (SPEED_LEVELS, 1)]
    parts: dict[str, list] = {kata: [] for kata in katas}
    done, total = set(), len(parts) * len(phases)  # (kata, levels) reported so far
    for levels, processes in phases:
        what = {None: "", CORRECTNESS_LEVELS: " (levels 1, 2, 4)", SPEED_LEVELS: " (speed level)"}[levels]

        def report(kata: str, points: float | str, seconds: float):
            done.add((kata, levels))
            shown = f"{points:.1f} points" if isinstance(points, float) else points
            print(f"[{len(done)}/{total}] {kata}{what}: {shown} in {seconds:.0f}s", file=sys.stderr, flush=True)

        outcomes, again = run_katas(katas, tree, args, seed, levels, processes, report)
        if again and len(katas) > 1:
            print(f"{', '.join(again)}{what}: grading again, one process per kata, because "
                  f"{'its process' if len(again) == 1 else 'their processes'} could not vouch for "
                  f"{'it' if len(again) == 1 else 'them'}.", file=sys.stderr, flush=True)
            for kata in again:
                outcomes.update(run_katas([kata], tree, args, seed, levels, 1, report)[0])
        for kata, outcome in outcomes.items():
            parts[kata].append(outcome)
    graded = {kata: summarise_phases(kata, outcomes) for kata, outcomes in parts.items()}
    return {kata: stubs.get(kata) or graded[kata] for kata in order}


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None
