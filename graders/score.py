"""Grade a solution tree kata by kata, print the table, and regenerate LEADERBOARD.md.

    uv run graders/score.py                                   # grade your work in katas/
    uv run graders/score.py --solutions reference --kata 03_conv_bn
    uv run graders/score.py --solutions ../team_a --team team_a   # store the run for the leaderboard

    uv run graders/score.py --hint 03_conv_bn                      # the next hint for a kata
    uv run graders/score.py --submissions teams/ --jobs 2           # organiser: grade every team

Each kata is graded in its own pytest subprocess (the kata's test file, with --solutions pointing at
the tree), so a crash or a hang in one kata costs that kata only. Every solution file is also read by
a static scan (graders/scan.py) that flags attempts to change the grader rather than the graph.

Organiser mode (--submissions DIR) grades every team folder in DIR with one secret seed: only the
teams' NN_name/solution.py files are copied into a staging tree, so nothing else a team ships can
reach the grading; each team's run is stored and LEADERBOARD.md regenerated. --jobs N grades the
correctness levels of N katas at once; the speed level always runs alone so timings stay fair.
Solution code runs only in sandboxed worker processes (graders/worker.py, --isolate): the grading
process never imports it and trusts only the data the workers send back.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import hashlib
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from tabulate import tabulate

from graders.core import LEVELS, CheckResult, level_points, resolve_seed
from graders.katas import KATAS, REPO_ROOT, is_available
from graders.progress import is_complete, next_hint, progress_line, remember
from graders.leaderboard import SCHEMA, geomean_speedup, locked, ranking_key, regenerate, store_run
from graders.scan import scan_tree
from graders.worker import Limits, kill, launch, sandbox_problem


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
                        help="grade the correctness levels of N katas at once (default: one per core; speed levels "
                             "always run alone, afterwards)")
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


def run_kata(kata: str, tree: Path, args: argparse.Namespace, seed: int, levels: str | None = None) -> list[CheckResult] | dict:
    """One pytest subprocess; its check records, or a failed_grading dict when it hung or crashed.

    The seed travels in a file the plugin deletes before any solution code runs, never in argv or the
    environment, so a solution cannot read the hidden models' seed."""
    test_file = REPO_ROOT / "katas" / kata / f"test_{kata}.py"
    with tempfile.TemporaryDirectory() as tmp:
        out, seed_file = Path(tmp) / "results.json", Path(tmp) / "seed"
        seed_file.write_text(str(seed))
        command = [sys.executable, "-m", "pytest", str(test_file), "-q", "-p", "no:cacheprovider",
                   "--solutions", str(tree.resolve()), "--seed-file", str(seed_file), "--device", args.device,
                   "--threads", str(args.threads), "--results-json", str(out)]
        command += ["--no-speed"] if args.no_speed else []
        command += ["--isolate"] if args.isolate else []
        command += ["--levels", levels] if levels else []
        # Isolated, the worker starts now, so that it imports torch while the grading process does.
        solution = tree.resolve() / kata / "solution.py"
        worker = launch(solution, kata, threads=args.threads, limits=Limits(args.kata_memory)) \
            if args.isolate and solution.is_file() else None
        if worker:
            command += ["--worker-channel", f"{kata},{worker}"]
        try:
            proc = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=args.kata_timeout,
                                  preexec_fn=memory_cap(args.kata_memory),
                                  pass_fds=(worker.to_worker, worker.from_worker) if worker else ())
        except subprocess.TimeoutExpired:
            return failed_grading("timed out", f"grading did not finish within {args.kata_timeout:.0f}s; "
                                                f"run `uv run pytest katas/{kata}` to see which check hangs.")
        finally:
            if worker:
                kill(worker)
        results = [CheckResult.from_dict(d) for d in json.loads(out.read_text())["results"]] if out.exists() else []
        if not results:
            tail = (proc.stdout + proc.stderr).strip().splitlines()
            return failed_grading("crashed", f"grading stopped before any check ran: {tail[-1] if tail else 'no output'}")
    return results


CORRECTNESS_LEVELS, SPEED_LEVELS = "1,2,4", "3"


def grade_trees(trees: dict[str, Path], katas: list[str], args: argparse.Namespace, seed: int) -> dict[str, dict[str, dict]]:
    """Grade every kata of every tree; returns results[team][kata].

    With --jobs 1 each kata is one subprocess. With more, the correctness levels of several katas run
    at once, then every speed level runs alone, so no timing shares the machine with other grading."""
    jobs = [(team, kata) for team in trees for kata in katas]
    if args.jobs == 1 or args.no_speed:  # nothing is timed: one pass over all levels (L3 is recorded as skipped)
        phases = [(None, args.jobs)]
    else:
        phases = [(CORRECTNESS_LEVELS, args.jobs), (SPEED_LEVELS, 1)]
    parts: dict[tuple[str, str], list] = {job: [] for job in jobs}
    print_lock, done, total = threading.Lock(), [0], len(jobs) * len(phases)

    def grade(job, levels):
        team, kata = job
        started = time.monotonic()
        outcome = run_kata(kata, trees[team], args, seed, levels)
        with print_lock:
            done[0] += 1
            points = "failed: " + outcome["status"] if isinstance(outcome, dict) else \
                f"{sum(r.points for r in outcome):.1f} points"
            what = {None: "", CORRECTNESS_LEVELS: " (levels 1, 2, 4)", SPEED_LEVELS: " (speed level)"}[levels]
            who = f"{team} " if len(trees) > 1 or team else ""
            print(f"[{done[0]}/{total}] {who}{kata}{what}: {points} in {time.monotonic() - started:.0f}s",
                  file=sys.stderr, flush=True)
        parts[job].append(outcome)

    for levels, workers in phases:
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            for future in [pool.submit(grade, job, levels) for job in jobs]:
                future.result()

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


if __name__ == "__main__":
    sys.exit(main())
