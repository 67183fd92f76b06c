"""The one ranking of teams: points, then the geometric mean of the speed levels' speedups (each capped),
disqualified runs last. Teams equal on both share a rank (1, 2, 2, 4), listed by name: the name orders a
tie, it never wins one. The leaderboard, organiser mode and any service rank with these functions.

May import: the standard library.
"""
from __future__ import annotations

import math


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
    """Ranked runs first, then more points, then a higher capped geomean speedup; the team name orders ties."""
    return bool(run["disqualified"]), -run["total_points"], -(geomean_speedup(run) or 0.0), run["team"]


def ranked(runs: list[dict]) -> list[tuple[int | str, dict]]:
    """The runs in ranking order, each with its rank: runs equal but for the team name share the rank of the
    first of them (1, 2, 2, 4); a disqualified run's is "DQ"."""
    rows, rank, previous = [], 0, None
    for position, run in enumerate(sorted(runs, key=ranking_key), 1):
        if ranking_key(run)[:3] != previous:
            rank, previous = position, ranking_key(run)[:3]
        rows.append(("DQ" if run["disqualified"] else rank, run))
    return rows


def latest_per_team(runs: list[dict]) -> list[dict]:
    latest: dict[str, dict] = {}
    for run in runs:
        if run["team"] not in latest or run["timestamp"] > latest[run["team"]]["timestamp"]:
            latest[run["team"]] = run
    return list(latest.values())
