"""The one ranking of teams: points, then the geometric mean of the speed levels' speedups (each capped),
disqualified runs last; the team name settles ties. The leaderboard, organiser mode and any service rank
with these functions.

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
    """Ranked runs first, then more points, then a higher capped geomean speedup; the team name settles ties."""
    return bool(run["disqualified"]), -run["total_points"], -(geomean_speedup(run) or 0.0), run["team"]


def latest_per_team(runs: list[dict]) -> list[dict]:
    latest: dict[str, dict] = {}
    for run in runs:
        if run["team"] not in latest or run["timestamp"] > latest[run["team"]]["timestamp"]:
            latest[run["team"]] = run
    return list(latest.values())
