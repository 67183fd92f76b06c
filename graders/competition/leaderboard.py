"""Stored runs and the leaderboard generated from them.

Each `score.py --team NAME` run is stored as one JSON file under results/<team>/. LEADERBOARD.md is
regenerated from all stored runs, never edited by hand. Storing and regenerating happen under one
file lock, so runs that finish at the same time lose no row.
"""
from __future__ import annotations

import fcntl
import json
import math
import os
import re
import tempfile
from contextlib import contextmanager
from pathlib import Path

from tabulate import tabulate

from graders.frame.catalogue import KATAS

SCHEMA = "fx-katas/results/1"
REQUIRED = {"schema": str, "team": str, "timestamp": str, "seed": int, "device": str, "device_name": str,
            "torch": str, "solutions_hash": str, "total_points": (int, float), "katas": dict}


class InvalidResults(ValueError):
    pass


def validate(run: dict, source: str) -> dict:
    if not isinstance(run, dict) or run.get("schema") != SCHEMA:
        raise InvalidResults(f"{source} is not an fx-katas results file (schema {SCHEMA!r} expected).")
    for key, kind in REQUIRED.items():
        if not isinstance(run.get(key), kind):
            raise InvalidResults(f"{source}: field {key!r} is missing or not a {getattr(kind, '__name__', kind)}.")
    disqualified = run.setdefault("disqualified", [])
    if not isinstance(disqualified, list) or not all(isinstance(reason, str) for reason in disqualified):
        raise InvalidResults(f"{source}: field 'disqualified' must be a list of reasons.")
    for kata, result in run["katas"].items():
        if not isinstance(result, dict) or not isinstance(result.get("points"), (int, float)):
            raise InvalidResults(f"{source}: kata {kata!r} has no points.")
    return run


def safe_team_dir(team: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", team).strip("._")
    if not slug:
        raise ValueError(f"team name {team!r} has no letters or digits")
    return slug


@contextmanager
def locked(results_dir: Path):
    results_dir.mkdir(parents=True, exist_ok=True)
    with open(results_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def store_run(results_dir: Path, run: dict) -> Path:
    """Write the run atomically under results/<team>/ (the caller holds the lock)."""
    validate(run, "the run to store")
    team_dir = results_dir / safe_team_dir(run["team"])
    team_dir.mkdir(parents=True, exist_ok=True)
    stamp = re.sub(r"[^0-9T]", "", run["timestamp"][:19])
    fd, tmp = tempfile.mkstemp(dir=team_dir, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(run, f, indent=1)
    os.chmod(tmp, 0o644)
    path = team_dir / f"{stamp}-{run['solutions_hash'][:8]}-{os.getpid()}.json"
    os.replace(tmp, path)
    return path


def load_runs(results_dir: Path) -> tuple[list[dict], list[str]]:
    """All valid stored runs, and one sentence per file that could not be read."""
    runs, problems = [], []
    for path in sorted(results_dir.glob("*/*.json")):
        try:
            runs.append(validate(json.loads(path.read_text()), str(path)))
        except (OSError, json.JSONDecodeError) as exc:
            problems.append(f"{path} could not be read as JSON ({exc}); it was left out of the leaderboard.")
        except InvalidResults as exc:
            problems.append(f"{exc} It was left out of the leaderboard.")
    return runs, problems


# Each kata's speedup counts up to this multiple of its threshold, so one outlier (a lucky run, a
# machine quirk) cannot outweigh steady gains across the other katas.
SPEEDUP_CAP_OVER_THRESHOLD = 2.0
SPEEDUP_CAP_DEFAULT = 5.0


def capped_speedup(kata_result: dict) -> float | None:
    speedup, threshold = kata_result.get("speedup"), kata_result.get("speedup_threshold")
    if not isinstance(speedup, (int, float)) or speedup <= 0:
        return None
    cap = SPEEDUP_CAP_OVER_THRESHOLD * threshold if isinstance(threshold, (int, float)) else SPEEDUP_CAP_DEFAULT
    return min(speedup, cap)


def geomean_speedup(run: dict) -> float | None:
    """Geometric mean of the speed levels' speedups, each capped (see SPEEDUP_CAP_OVER_THRESHOLD)."""
    speedups = [s for s in map(capped_speedup, run["katas"].values()) if s is not None]
    return math.exp(sum(map(math.log, speedups)) / len(speedups)) if speedups else None


def ranking_key(run: dict) -> tuple:
    """Ranked runs first, then more points, then a higher capped geomean speedup; the team name settles ties."""
    return bool(run["disqualified"]), -run["total_points"], -(geomean_speedup(run) or 0.0), run["team"]


def latest_per_team(runs: list[dict]) -> list[dict]:
    latest: dict[str, dict] = {}
    for run in runs:
        if run["team"] not in latest or run["timestamp"] > latest[run["team"]]["timestamp"]:
            latest[run["team"]] = run
    return list(latest.values())


def render(runs: list[dict]) -> str:
    lines = [
        "# Leaderboard",
        "",
        "Generated by `uv run graders/score.py` from the runs stored under `results/`; do not edit by hand.",
        "Each team's latest run counts. Rank by points, then by the geometric mean of the speed levels' speedups",
        f"(each capped at {SPEEDUP_CAP_OVER_THRESHOLD:g}x its kata's threshold). A disqualified run is listed, not ranked.",
        "",
    ]
    teams = latest_per_team(runs)
    if not teams:
        lines.append("No team has been graded yet: `uv run graders/score.py --team NAME` adds one.")
        return "\n".join(lines) + "\n"
    teams.sort(key=ranking_key)
    short = [k.split("_")[0] for k in KATAS]
    rows = []
    for rank, run in enumerate(teams, 1):
        geo = geomean_speedup(run)
        per_kata = [f"{run['katas'][k]['points']:.0f}" if k in run["katas"] and run["katas"][k].get("status") == "graded"
                    else "-" for k in KATAS]
        note = "disqualified: " + "; ".join(run["disqualified"]) if run["disqualified"] else ""
        rows.append(["DQ" if note else rank, run["team"], f"{run['total_points']:.1f}", *per_kata,
                     f"{geo:.2f}x" if geo else "-", run["device_name"], run["timestamp"][:10], run["solutions_hash"][:8],
                     note[:160].replace("|", "/")])
    lines.append(tabulate(rows, headers=["rank", "team", "points", *short, "geomean speedup", "device", "date", "hash",
                                         "note"], tablefmt="github", disable_numparse=True))
    return "\n".join(lines) + "\n"


def regenerate(results_dir: Path, leaderboard: Path) -> list[str]:
    """Rewrite the leaderboard from the stored runs (the caller holds the lock); returns the problems."""
    runs, problems = load_runs(results_dir)
    leaderboard.write_text(render(runs))
    return problems
