"""Organiser grading: every team's tree staged (its NN_name/solution.py files only), graded with one seed
in phases (correctness levels on every core, then the speed levels alone), scanned, and turned into the
run records the store keeps; the table of all teams.

May import: graders.frame, graders.isolation (the static scan, the sandbox's state), graders.batch,
graders.competition (store, ranking).
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import platform
import shutil
import sys
from pathlib import Path

from tabulate import tabulate

from graders.batch.processes import CORRECTNESS_LEVELS, SPEED_LEVELS, run_katas
from graders.batch.summary import summarise
from graders.competition.ranking import geomean_speedup, ranking_key
from graders.competition.store import SCHEMA
from graders.frame.catalogue import KATAS
from graders.isolation.sandbox import sandbox_problem


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


def solutions_hash(tree: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(tree.glob("*/solution.py")):
        digest.update(path.relative_to(tree).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def device_name(device: str) -> str:
    if device == "cuda":
        import torch  # only here: organiser mode's other paths need no tensor library

        return torch.cuda.get_device_name()
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def make_run(team: str, tree: Path, source: Path, katas: dict[str, dict], seed: int, args: argparse.Namespace) -> dict:
    """The stored record of one team's run: `tree` is what was graded (and hashed), `source` where it came from."""
    import torch  # here, not at the top: a learner's --hint or --help needs no tensor library

    graded = [r for r in katas.values() if r["status"] != "not available"]
    return {"schema": SCHEMA, "team": team, "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "seed": seed, "device": args.device, "device_name": device_name(args.device), "threads": args.threads,
            "speed": not args.no_speed, "isolated": args.isolate, "sandboxed": args.isolate and not sandbox_problem(),
            "torch": torch.__version__, "python": platform.python_version(),
            "solutions": str(source.resolve()), "solutions_hash": solutions_hash(tree),
            "total_points": sum(r["points"] for r in graded), "possible_points": 100.0 * len(graded),
            "disqualified": [f"{kata}: {r['disqualified']}" for kata, r in katas.items() if r.get("disqualified")],
            **precision_fields(args.device, katas), "katas": katas}


def precision_fields(device: str, katas: dict[str, dict]) -> dict:
    """What a run record says about its numbers: the float32 precision the grading held (graders/isolation/
    precision.py) and the katas whose speed verdict is provisional (threshold not calibrated on this device)."""
    from graders.isolation.precision import NOTE

    return {"float32": NOTE if device == "cuda" else "torch's CPU defaults (full float32)",
            "speed_provisional": [kata for kata, r in katas.items() if r.get("speed_provisional")]}


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
