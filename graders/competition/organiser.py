"""Organiser grading: every team's tree staged (its NN_name/solution.py files only), graded with one seed
as jobs of the fleet (graders/competition/fleet.py: a job per (team, kata) on every core of every machine,
each timed stretch alone on its machine), each job's result saved as it arrives (a resumed run grades only what
is missing), scanned, and turned into the run records the store keeps; the table of all teams.

May import: graders.frame, graders.isolation (the static scan, the sandbox's state), graders.batch,
graders.competition (fleet, jobs, store, ranking).
"""
from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import platform
import re
import shutil
import sys
from pathlib import Path

from tabulate import tabulate

from graders.competition.fleet import Job, combine
from graders.competition.jobs import device_name, did_not_load, speed_not_run
from graders.competition.ranking import geomean_speedup, ranking_key
from graders.competition.store import SCHEMA, RunFolder, files_hash
from graders.frame.catalogue import KATAS
from graders.isolation.sandbox import sandbox_problem


def grade_teams(fleet, files: dict[str, dict[str, bytes]], katas: list[str], seed: int, speed: bool,
                folder: RunFolder) -> dict[str, dict[str, dict]]:
    """Grade every kata of every team on the fleet (graders/competition/fleet.py); returns results[team][kata].

    Each job's result is saved in the run folder as it arrives, with the hash of the file it graded; a job
    saved there already for the same file (a resumed run) is not graded again, one whose file changed is.
    Progress: a line per job (team, kata, points, seconds, machine)."""
    sources = {(team, kata): files[team].get(f"{kata}/solution.py") for team in files for kata in katas}
    saved, changed = folder.saved(sources)
    for team, kata in sorted(changed):
        print(f"{team} {kata}: its solution file is not the one run {folder.run} graded; its saved result is "
              "dropped and it is graded again.", file=sys.stderr, flush=True)
    phases = fleet.phases(speed)
    first = phases[0]
    total = len(files) * len(katas) * len(phases)
    done = [0]
    what = {"all": "", "correctness": " (levels 1, 2, 4)", "speed": " (speed level)"}

    def report(team: str, kata: str, phase: str, result: dict) -> None:
        done[0] += 1
        failed = result.get("failed")
        points = failed["status"] if failed else f"{sum(r['points'] for r in result['records']):.1f} points"
        machine = result.get("machine") or {}
        where = f" on {machine['host']}" + (f" (worker {machine['worker']})" if machine.get("worker") else "") if machine else ""
        who = f"{team} " if len(files) > 1 or team else ""
        print(f"[{done[0]}/{total}] {who}{kata}{what[phase]}: {points} in {result.get('seconds') or 0:.0f}s{where}",
              file=sys.stderr, flush=True)

    parts: dict[tuple[str, str], dict[str, dict]] = {(team, kata): {} for team in files for kata in katas}
    jobs = []
    for (team, kata), found in parts.items():
        for phase in phases:
            if (team, kata, phase) in saved:
                found[phase] = saved[(team, kata, phase)]
                done[0] += 1
        if first not in found:
            jobs.append(Job(team, kata, first, files[team], speed))
        elif "speed" in phases and "speed" not in found:  # its correctness job is back: the speed job is missing
            reason = did_not_load(found[first])
            if reason is None:
                jobs.append(Job(team, kata, "speed", files[team], speed))
            else:
                found["speed"] = speed_not_run(kata, reason)
                folder.save(team, kata, "speed", found["speed"], sources[(team, kata)])
                done[0] += 1
    if saved:
        print(f"Resuming run {folder.run}: {done[0]} of {total} jobs already graded; grading the other {total - done[0]}.",
              file=sys.stderr, flush=True)
    for job, result in fleet.run_jobs(jobs, seed):
        folder.save(job.team, job.kata, job.phase, result, sources[(job.team, job.kata)])
        parts[(job.team, job.kata)][job.phase] = result
        report(job.team, job.kata, job.phase, result)
    graded: dict[str, dict[str, dict]] = {team: {} for team in files}
    for (team, kata), found in parts.items():
        graded[team][kata] = combine(kata, found)
    return graded


def read_files(tree: Path) -> dict[str, bytes]:
    """A staged tree's solution files, as a job carries them."""
    return {path.relative_to(tree).as_posix(): path.read_bytes() for path in sorted(tree.glob("*/solution.py"))}


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
    return files_hash(read_files(tree))


def torch_version() -> str:
    """torch.__version__ as torch/version.py sets it, without importing torch (1.7 s of CPU) in this process."""
    spec = importlib.util.find_spec("torch")
    text = (Path(spec.origin).parent / "version.py").read_text() if spec and spec.origin else ""
    found = re.search(r"^__version__\s*(?::\s*str\s*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return found.group(1) if found else importlib.metadata.version("torch")


def make_run(team: str, tree: Path, source: Path, katas: dict[str, dict], seed: int, args: argparse.Namespace) -> dict:
    """The stored record of one team's run: `tree` is what was graded (and hashed), `source` where it came from."""
    graded = [r for r in katas.values() if r["status"] != "not available"]
    return {"schema": SCHEMA, "team": team, "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "seed": seed, "device": args.device, "device_name": device_name(args.device), "threads": args.threads,
            "speed": not args.no_speed, "isolated": args.isolate, "sandboxed": args.isolate and not sandbox_problem(),
            "torch": torch_version(), "python": platform.python_version(),
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
