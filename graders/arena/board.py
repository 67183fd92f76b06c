"""Standings from the database through the one ranking (graders.competition.ranking), what a reader may
see of a submission, and the export at the close (results/ and LEADERBOARD.md in organiser mode's formats).

Until the close, level 4's checks read only "passed" or "failed" (their names and sentences would describe
the secret models), a submission still being graded is shown only to its team, and only a submission's
team (or the organiser) reads its failing checks' sentences; after the close everyone reads everything
but the code.

May import: graders.frame, graders.competition (ranking, store, leaderboard, organiser), graders.arena.db.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from graders.arena.db import Competition, KataResult, Submission, SubmittedFile, SupersededResult, Team
from graders.competition.leaderboard import regenerate
from graders.competition.organiser import make_run
from graders.competition.ranking import geomean_speedup, ranked
from graders.competition.store import locked, store_run

HIDDEN_LEVEL = 4


def iso(moment) -> str | None:
    return moment.isoformat(timespec="seconds") + "Z" if moment else None


def redact_summary(summary: dict, *, closed: bool, detailed: bool) -> dict:
    """A kata's summary as this reader may see it (see the module's docstring)."""
    shown = {k: summary.get(k) for k in ("status", "points", "max_points", "levels", "speedup", "speedup_threshold")}
    shown["disqualified"] = bool(summary.get("disqualified"))
    if not detailed and not closed:
        return shown
    checks, hidden = [], 0
    for check in summary.get("checks", []):
        check = dict(check)
        if check.get("level") == HIDDEN_LEVEL and not closed:
            hidden += 1
            check.update(check=f"hidden-{hidden}", figures={},
                         message="skipped" if check.get("skipped") else "passed" if check.get("passed") else "failed")
        checks.append(check)
    message, disqualified = summary.get("message", ""), summary.get("disqualified")
    if not closed and "test_L4" in (message or ""):
        message = "a level 4 check failed (level 4's sentences are shown after the close)"
    if not closed and disqualified and "test_L4" in str(disqualified):
        disqualified = "a level 4 check (shown after the close)"
    shown.update(message=message, checks=checks, disqualified=disqualified or False, scan=summary.get("scan"))
    return shown


def results_of(session: Session, sid: int) -> dict[str, dict]:
    return {r.kata: r.summary for r in session.scalars(select(KataResult).where(KataResult.submission_id == sid)
                                                       .order_by(KataResult.id))}


def as_run(team: str, submission: Submission, katas: dict[str, dict]) -> dict:
    """The shape graders.competition.ranking ranks: the stored run's fields it reads."""
    return {"team": team, "total_points": sum(r.get("points", 0.0) for r in katas.values()),
            "disqualified": [f"{k}: {r['disqualified']}" for k, r in katas.items() if r.get("disqualified")],
            "katas": katas, "submission": submission.id if submission else None,
            "timestamp": iso(submission.created) if submission else None}


def frozen(competition: Competition):
    """When the public board stopped moving (graders/arena/controls.py), or None: never, or closed since."""
    return None if competition.closed else competition.frozen_at


def counted(session: Session, competition: Competition, *, live: bool = True) -> dict[str, tuple[Submission | None, Submission | None]]:
    """Per team that has submitted: (the submission that counts now, its latest submission). Until the
    close the latest graded one counts; at the close each team's last submission. An excluded submission
    counts for nothing; on a frozen board (not `live`) neither does one made after the freeze."""
    teams = {t.id: t.name for t in session.scalars(select(Team))}
    cutoff = None if live else frozen(competition)
    out: dict[str, tuple] = {}
    for s in session.scalars(select(Submission).order_by(Submission.id)):
        if s.excluded is not None or (cutoff is not None and s.created >= cutoff):
            continue
        best, _ = out.get(teams[s.team_id], (None, None))
        out[teams[s.team_id]] = (s if s.status == "graded" else best, s)
    if competition.closed:
        out = {team: (latest, latest) for team, (_, latest) in out.items()}
    return out


def standings(session: Session, competition: Competition, kata: str | None = None, *, live: bool = False) -> list[dict]:
    """The board's rows, ranked by graders.competition.ranking.ranking_key (for one kata: the same key over
    that kata alone). `live`: the organiser's board, which a freeze does not stop."""
    runs, graded = [], {}
    for team, (submission, latest) in counted(session, competition, live=live).items():
        if submission is not None:
            graded[submission.id] = iso(submission.graded_at)  # when its grading finished (None: not yet)
        katas = results_of(session, submission.id) if submission and submission.status == "graded" else {}
        if kata is not None:
            katas = {kata: katas[kata]} if kata in katas else {}
        run = as_run(team, submission, katas)
        run["pending"] = latest is not None and latest.status != "graded"
        runs.append(run)
    rejudged = set(session.scalars(select(SupersededResult.submission_id)))
    rows = []
    for rank, run in ranked(runs):
        geo = geomean_speedup(run)
        rows.append({"rank": rank, "team": run["team"], "points": run["total_points"],
                     "geomean_speedup": geo, "disqualified": bool(run["disqualified"]),
                     "katas": {k: r.get("points", 0.0) for k, r in run["katas"].items()},
                     "submission": run["submission"], "submitted": run["timestamp"],
                     "graded_at": graded.get(run["submission"]), "grading": run["pending"],
                     "rejudged": run["submission"] in rejudged})
    return rows


def export(session: Session, competition: Competition, results_dir: Path, leaderboard: Path) -> list[Path]:
    """At the close: each team's last submission stored as a run under results/ (organiser mode's record)
    and LEADERBOARD.md regenerated from every stored run."""
    args = argparse.Namespace(device="cpu", threads=1, no_speed=not competition.speed, isolate=True)
    stored = []
    with locked(results_dir):
        for team, (submission, _) in sorted(counted(session, competition).items()):
            if submission is None or submission.status != "graded":
                continue
            katas = results_of(session, submission.id)
            with tempfile.TemporaryDirectory(prefix="arena-export-") as tmp:
                for f in session.scalars(select(SubmittedFile).where(SubmittedFile.submission_id == submission.id)):
                    (Path(tmp) / f.path).parent.mkdir(parents=True, exist_ok=True)
                    (Path(tmp) / f.path).write_bytes(f.content)
                run = make_run(team, Path(tmp), Path(tmp), katas, competition.seed, args)
            machines = {r["machine"]["device_name"] for r in katas.values() if r.get("machine")}
            run.update(timestamp=iso(submission.created).replace("Z", "+00:00"), solutions=f"arena submission {submission.id}",
                       **({"device_name": " + ".join(sorted(machines))} if machines else {}))
            stored.append(store_run(results_dir, run))
        problems = regenerate(results_dir, leaderboard)
    for problem in problems:
        print(f"warning: {problem}")
    return stored
