"""Grade a solution tree kata by kata, print the table, and regenerate LEADERBOARD.md.

    uv run graders/score.py                                   # grade your work in katas/
    uv run graders/score.py --solutions reference --kata 03_conv_bn
    uv run graders/score.py --solutions ../team_a --team team_a   # store the run for the leaderboard

    uv run graders/score.py --hint 03_conv_bn                      # the next hint for a kata
    uv run graders/score.py --submissions teams/ --jobs 2           # organiser: grade every team

Katas are graded in pytest subprocesses (the katas' test files, with --solutions pointing at the tree),
kata after kata; a kata whose process crashed, hung or was tampered with is graded again in a process
of its own, so what one kata's solution does costs that kata only. Every solution file is also read by
a static scan (graders/scan.py) that flags attempts to change the grader rather than the graph.

Organiser mode (--submissions DIR) grades every team folder in DIR with one secret seed: only the
teams' NN_name/solution.py files are copied into a staging tree, so nothing else a team ships can
reach the grading; each team's run is stored and LEADERBOARD.md regenerated. --jobs N grades the
correctness levels in N processes at once; the speed levels always run alone so timings stay fair.
Solution code runs only in sandboxed worker processes (graders/worker.py, --isolate): the grading
process never imports it and trusts only the data the workers send back.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tabulate import tabulate

from graders.frame.levels import LEVELS, CheckResult, level_points, resolve_seed
from graders.frame.catalogue import KATAS, REPO_ROOT, is_available
from graders.learner.progress import is_complete, next_hint, progress_line, remember
from graders.competition.leaderboard import SCHEMA, geomean_speedup, locked, ranking_key, regenerate, store_run
from graders.isolation.scan import scan_tree
from graders.isolation.worker import sandbox_problem


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--solutions", type=Path, default=REPO_ROOT / "katas", metavar="DIR",
                        help="solution tree to grade: DIR/<kata>/solution.py (default: katas/)")
    parser.add_argument("--kata", action="append", choices=list(KATAS), metavar="KATA",
                        help="grade only this kata (repeatable), e.g. --kata 03_conv_bn")
    parser.add_argument("--hint", choices=list(KATAS), metavar="KATA",
                        help="show the next hint for KATA (one more each time you ask) and grade nothing")
    parser.add_argument("--team", help="store this run as the team's and regenerate the leaderboard")
    parser.add_argument("--submissions", type=Path, metavar="DIR",
                        help="organiser mode: grade every team folder DIR/<team>/ (a solution tree) and rank them")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)), metavar="N",
                        help="grade the correctness levels in N processes at once (default: one per core; speed "
                             "levels always run alone, afterwards)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the run's raw results to FILE")
    parser.add_argument("--no-speed", action="store_true", help="skip the speed levels (L3)")
    parser.add_argument("--isolate", action="store_true",
                        help="run solution code only in sandboxed worker processes, judged by the data they send "
                             "back (always on with --submissions)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads while timing (default 1)")
    parser.add_argument("--seed", type=int, help="grading seed (default: random, printed)")
    parser.add_argument("--kata-timeout", type=float, default=900.0, metavar="S",
                        help="seconds one kata may take in all before it is stopped (default 900)")
    parser.add_argument("--kata-memory", type=float, default=8.0, metavar="GB",
                        help="address space one kata's grading process may use (default 8 GiB)")
    parser.add_argument("--results-dir", type=Path, default=REPO_ROOT / "results", help=argparse.SUPPRESS)
    parser.add_argument("--leaderboard", type=Path, default=REPO_ROOT / "LEADERBOARD.md", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.submissions is not None:
        if args.team or "--solutions" in (argv if argv is not None else sys.argv):
            parser.error("--submissions grades every team folder: it takes neither --solutions nor --team")
        if not args.submissions.is_dir():
            parser.error(f"--submissions {args.submissions}: no such folder")
    elif not args.solutions.is_dir():
        parser.error(f"--solutions {args.solutions}: no such folder")
    args.isolate = args.isolate or args.submissions is not None
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device on this machine")
    return args


def solutions_hash(tree: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(tree.glob("*/solution.py")):
        digest.update(path.relative_to(tree).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def summarise(kata: str, results: list[CheckResult]) -> dict:
    points = level_points(results)
    failures = [r for r in results if not r.passed and not r.skipped]
    speed = next((r.figures for r in results if r.level == 3 and "speedup" in r.figures), {})
    disqualified = next((r for r in results if r.disqualified), None)
    if disqualified:
        message = f"DISQUALIFIED: {disqualified.test_id}: {disqualified.message.splitlines()[0]}"
    elif not failures:
        message = "full marks" if not any(r.skipped for r in results) else "all checks that ran passed"
    elif all("still the stub" in r.message for r in failures):
        message = "not started: solution.py is still the stub"
    else:
        message = f"{failures[0].test_id}: {failures[0].message.splitlines()[0]}"
    return {"status": "graded", "points": sum(e for e, _ in points.values()), "max_points": 100.0,
            "levels": {str(level): list(p) for level, p in points.items()}, "speedup": speed.get("speedup"),
            "speedup_threshold": speed.get("threshold"), "message": message,
            "disqualified": disqualified.message.splitlines()[0] if disqualified else None,
            "checks": [r.to_dict() for r in results]}


def failed_grading(status: str, message: str) -> dict:
    return {"status": status, "points": 0.0, "max_points": 100.0, "levels": {}, "speedup": None,
            "message": message, "disqualified": None, "checks": []}


def memory_cap(gigabytes: float):
    """A preexec hook: a solution that allocates without bound gets a MemoryError, not the machine."""
    limit = int(gigabytes * 2**30)
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


class Progress:
    """Follows a grading process through its --progress file: which kata it grades now, since when, and
    the points of each kata so far."""

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

    process: subprocess.Popen
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

    def last_words(self) -> str:
        tail = self.output.read_text(errors="replace").strip().splitlines() if self.output.exists() else []
        return tail[-1] if tail else "no output"


def run_katas(katas: list[str], tree: Path, args: argparse.Namespace, seed: int, levels: str | None,
              processes: int = 1, report=lambda kata, points, seconds: None) -> tuple[dict[str, list[CheckResult] | dict], list[str]]:
    """Grade `katas` of `tree` at `levels` in `processes` pytest subprocesses at once, which share them
    out (--claims: each takes the next kata no other has taken, so none idles behind a long kata).

    Returns each kata's check records, or a failed_grading dict (it hung or its process crashed), and
    the katas whose grading a process could not vouch for (see GradingProcess.vouches): grade them
    again, alone. `report(kata, points, seconds)` is called as each kata finishes.

    The seed travels in a file the plugin deletes before any solution code runs, never in argv or the
    environment, so a solution cannot read the hidden models' seed. Each kata may take --kata-timeout
    seconds; a process's --progress file says which kata it is on."""
    test_files = [str(REPO_ROOT / "katas" / kata / f"test_{kata}.py") for kata in katas]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "claims").mkdir()
        options = ["-q", "-p", "no:cacheprovider", "--solutions", str(tree.resolve()), "--device", args.device,
                   "--threads", str(args.threads), "--claims", str(tmp / "claims")]
        options += ["--no-speed"] if args.no_speed else []
        options += ["--isolate"] if args.isolate else []
        options += ["--levels", levels] if levels else []
        running, env = [], dict(os.environ)
        if processes > 1 and "OMP_NUM_THREADS" not in env:
            # Processes that share the cores get a thread pool each as large as their share: a pool as
            # large as the machine in every one of them spins against the others (the ten references'
            # correctness levels on 2 cores: 78 s of CPU with full pools, 44 s with one thread each).
            env["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // processes))
        for n in range(min(processes, len(katas))):
            seed_file = tmp / f"seed{n}"
            seed_file.write_text(str(seed))
            own = ["--seed-file", str(seed_file), "--results-json", str(tmp / f"results{n}.json"),
                   "--progress", str(tmp / f"progress{n}")]
            # Every other process claims from the far end (the files' order is the claims' order): two
            # meet in the middle, so a long kata at either end starts early instead of last.
            order = test_files if n % 2 == 0 else test_files[::-1]
            with open(tmp / f"output{n}", "w") as output:
                process = subprocess.Popen([sys.executable, "-m", "pytest", *order, *options, *own], cwd=REPO_ROOT,
                                           stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
                                           env=env, preexec_fn=memory_cap(args.kata_memory))
            running.append(GradingProcess(process, Progress(tmp / f"progress{n}"), tmp / f"results{n}.json",
                                          tmp / f"output{n}"))

        def follow(g: GradingProcess) -> None:
            for kata in g.progress.read() if g.process.poll() is None else g.progress.end():
                report(kata, "failed: timed out" if kata == g.stopped else g.progress.points.get(kata, 0.0),
                       g.progress.seconds[kata])

        try:
            while any(g.process.poll() is None for g in running):
                time.sleep(0.5)
                for g in running:
                    follow(g)
                    if g.process.poll() is None and time.monotonic() - g.progress.since > args.kata_timeout:
                        g.stopped = g.progress.current or katas[0]
                        os.killpg(g.process.pid, signal.SIGKILL)
                        g.process.wait()
        finally:
            for g in running:
                if g.process.poll() is None:
                    os.killpg(g.process.pid, signal.SIGKILL)
                    g.process.wait()
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


CORRECTNESS_LEVELS, SPEED_LEVELS = "1,2,4", "3"


def grade_trees(trees: dict[str, Path], katas: list[str], args: argparse.Namespace, seed: int) -> dict[str, dict[str, dict]]:
    """Grade every kata of every tree; returns results[team][kata].

    A grading process grades kata after kata: starting one (importing torch and pytest) costs about as
    much as grading a kata. The correctness levels of a tree are graded by --jobs processes at once,
    then the speed levels of all its katas by one process alone, so no timing shares the machine with
    other grading (with --jobs 1 or --no-speed, one pass over all levels). A kata whose process cannot
    vouch for it (a crash, a hang, tampering) is graded again in a process of its own, so what one
    kata's solution does costs that kata only."""
    if args.jobs == 1 or args.no_speed:
        phases = [(None, args.jobs)]
    else:
        phases = [(CORRECTNESS_LEVELS, args.jobs), (SPEED_LEVELS, 1)]
    parts: dict[tuple[str, str], list] = {(team, kata): [] for team in trees for kata in katas}
    done, total = set(), len(parts) * len(phases)  # (team, kata, levels) reported so far

    for levels, processes in phases:
        what = {None: "", CORRECTNESS_LEVELS: " (levels 1, 2, 4)", SPEED_LEVELS: " (speed level)"}[levels]
        for team, tree in trees.items():
            who = f"{team} " if len(trees) > 1 or team else ""

            def report(kata: str, points: float | str, seconds: float):
                done.add((team, kata, levels))
                shown = f"{points:.1f} points" if isinstance(points, float) else points
                print(f"[{len(done)}/{total}] {who}{kata}{what}: {shown} in {seconds:.0f}s", file=sys.stderr, flush=True)

            outcomes, again = run_katas(katas, tree, args, seed, levels, processes, report)
            if again and len(katas) > 1:
                print(f"{who}{', '.join(again)}{what}: grading again, one process per kata, because "
                      f"{'its process' if len(again) == 1 else 'their processes'} could not vouch for "
                      f"{'it' if len(again) == 1 else 'them'}.", file=sys.stderr, flush=True)
                for kata in again:
                    outcomes.update(run_katas([kata], tree, args, seed, levels, 1, report)[0])
            for kata, outcome in outcomes.items():
                parts[(team, kata)].append(outcome)

    graded: dict[str, dict[str, dict]] = {team: {} for team in trees}
    for (team, kata), outcomes in parts.items():
        failed = next((o for o in outcomes if isinstance(o, dict)), None)
        graded[team][kata] = failed or summarise(kata, [r for o in outcomes for r in o])
    return graded


def apply_scan(katas: dict[str, dict], findings: dict[str, list[str]]) -> None:
    """Static-scan findings disqualify the kata; its points are still shown."""
    for kata, found in findings.items():
        if found and kata in katas:
            more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
            katas[kata]["scan"] = found
            if not katas[kata].get("disqualified"):  # a runtime finding, if any, says more
                katas[kata].update(disqualified=f"static scan: {found[0]}{more}",
                                   message=f"DISQUALIFIED by the static scan: {found[0]}{more}")


def make_run(team: str, tree: Path, source: Path, katas: dict[str, dict], seed: int, args: argparse.Namespace) -> dict:
    """The stored record of one team's run: `tree` is what was graded (and hashed), `source` where it came from."""
    graded = [r for r in katas.values() if r["status"] != "not available"]
    return {"schema": SCHEMA, "team": team, "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "seed": seed, "device": args.device, "device_name": device_name(args.device), "threads": args.threads,
            "speed": not args.no_speed, "isolated": args.isolate, "sandboxed": args.isolate and not sandbox_problem(),
            "torch": torch.__version__, "python": platform.python_version(),
            "solutions": str(source.resolve()), "solutions_hash": solutions_hash(tree),
            "total_points": sum(r["points"] for r in graded), "possible_points": 100.0 * len(graded),
            "disqualified": [f"{kata}: {r['disqualified']}" for kata, r in katas.items() if r.get("disqualified")],
            "katas": katas}


def level_cell(kata_result: dict, level: int) -> str:
    earned, possible = kata_result["levels"].get(str(level), (0.0, LEVELS[level].points))
    return f"{earned:.0f}/{possible:.0f}" if possible else "-"


def print_table(katas: dict[str, dict], total: float, possible: float) -> None:
    rows = []
    for kata, r in katas.items():
        if r["status"] == "not available":
            rows.append(["", kata, *["" for _ in LEVELS], "", "", "not yet available"])
            continue
        speed = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
        status = r["message"] if len(r["message"]) <= 100 else r["message"][:97] + "..."
        rows.append(["✓" if is_complete(r) else "", kata, *[level_cell(r, level) for level in LEVELS],
                     f"{r['points']:.1f}", speed, status])
    rows.append(["", "total", *["" for _ in LEVELS], f"{total:.1f}/{possible:.0f}", "", ""])
    headers = ["", "kata", *[f"L{n} {lv.name}" for n, lv in LEVELS.items()], "points", "speedup", "status"]
    print(tabulate(rows, headers=headers))
    print(progress_line(katas))


def next_step(katas: dict[str, dict], args: argparse.Namespace) -> str | None:
    todo = next((k for k, r in katas.items() if r["status"] != "not available" and not is_complete(r)), None)
    if todo is None:
        return None
    def shown(path: Path) -> Path:  # as the learner types it, from the repository root
        try:
            return path.resolve().relative_to(REPO_ROOT)
        except ValueError:
            return path.resolve()
    where, command = f"edit {shown(args.solutions / todo)}/solution.py", f"uv run pytest katas/{todo}"
    if args.solutions.resolve() == (REPO_ROOT / "katas").resolve():
        where = f"read katas/{todo}/README.md, {where}"
    else:
        command += f" --solutions {shown(args.solutions)}"
    return (f"Next: kata {todo} ({KATAS[todo]}): {where}, then run `{command}` to see every check "
            f"(`uv run graders/score.py --hint {todo}` when stuck).")


def stage_submissions(submissions: Path, katas: list[str], staging: Path) -> dict[str, Path]:
    """Copy each team's solution.py files, and nothing else, into staging/<team>/."""
    trees = {}
    for team_dir in sorted(p for p in submissions.iterdir() if p.is_dir() and not p.name.startswith(".")):
        tree = staging / team_dir.name
        tree.mkdir()
        for kata in katas:
            source = team_dir / kata / "solution.py"
            if source.is_file() and not source.is_symlink():
                (tree / kata).mkdir()
                shutil.copyfile(source, tree / kata / "solution.py")
        trees[team_dir.name] = tree
    return trees


def print_teams(runs: list[dict]) -> None:
    rows = []
    for run in sorted(runs, key=ranking_key):
        geo = geomean_speedup(run)
        status = "DISQUALIFIED: " + run["disqualified"][0] if run["disqualified"] else ""
        rows.append([run["team"], f"{run['total_points']:.1f}/{run['possible_points']:.0f}",
                     *[f"{run['katas'][k]['points']:.0f}" if k in run["katas"] else "-" for k in KATAS],
                     f"{geo:.2f}x" if geo else "-", status[:100]])
    print(tabulate(rows, headers=["team", "points", *[k.split("_")[0] for k in KATAS], "geomean", "status"]))


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.hint:
        print(next_hint(args.hint))
        return 0
    seed = resolve_seed(args.seed)
    selected = args.kata or list(KATAS)
    available = [k for k in selected if is_available(k)]
    organiser = args.submissions is not None
    if args.isolate and sandbox_problem():
        print(f"WARNING: {sandbox_problem()}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as staging:
        if organiser:
            trees = stage_submissions(args.submissions, available, Path(staging))
            print(f"Grading {len(trees)} teams from {args.submissions} on {args.device}, one secret seed for all.",
                  flush=True)
        else:
            trees = {args.team or "": args.solutions}
            print(f"Grading {args.solutions} on {args.device} with seed {seed} (reproduce with --seed {seed}).", flush=True)
        graded = grade_trees(trees, available, args, seed)
        runs = []
        for team, tree in trees.items():
            katas = {k: graded[team][k] if k in available else failed_grading("not available", "not yet available")
                     for k in selected}
            apply_scan(katas, scan_tree(tree, available))
            source = args.submissions / team if organiser else tree
            runs.append(make_run(team, tree, source, katas, seed, args))

    if organiser:
        print_teams(runs)
        print(f"The seed was {seed}: publish it after the competition so teams can reproduce their hidden models.")
    else:
        run = runs[0]
        print_table(run["katas"], run["total_points"], run["possible_points"])
        remember(args.solutions, run["katas"])
    if args.json:
        args.json.write_text(json.dumps(runs if organiser else runs[0], indent=1))
    with locked(args.results_dir):
        for run in runs:
            if run["team"]:
                print(f"Stored {run['team']}'s run as {store_run(args.results_dir, run)}.")
        for problem in regenerate(args.results_dir, args.leaderboard):
            print(f"warning: {problem}", file=sys.stderr)
    print(f"Wrote {args.leaderboard}.")
    hint = None if organiser else next_step(runs[0]["katas"], args)
    if hint:
        print(hint)
    return 0

