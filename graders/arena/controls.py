"""The organiser's controls over a live competition, what a contest jury (DOMjudge's, GPU MODE's) relies on:

- freeze: from a moment on, the public board stops moving (it counts only submissions made before it);
  each team still sees its own results, the organiser's board (with the organiser's token) stays live, and
  the close reveals everything (graders/arena/board.py, `standings`);
- exclude a submission (disqualify it, or ignore it), with a reason, and include it again: an excluded
  submission counts for nothing on any board, its team and the organiser read why;
- announce: a message to every team, on the board;
- rejudge a set (submissions, katas, teams; all of them after a grader fix): the servers grade it again
  when no submission waits, and its verdicts wait beside the board's until the organiser, having read old
  and new side by side, applies it (each replaced verdict kept as superseded, the row marked rejudged) or
  discards it;
- every control is logged with its moment, target and reason (`log`).

The same functions serve the `arena.py` commands (on the database) and the organiser's API:

    POST /api/admin/freeze                    {"at": "2026-12-01T17:00:00Z"} (optional; default now)
    POST /api/admin/unfreeze
    POST /api/admin/submissions/{id}/exclude  {"reason": "..."}
    POST /api/admin/submissions/{id}/include
    POST /api/admin/announcements             {"text": "..."}
    POST /api/admin/rejudgings                {"submissions": [...], "katas": [...], "teams": [...]} (each optional)
    GET  /api/admin/rejudgings/{id}           old and new verdicts side by side
    POST /api/admin/rejudgings/{id}/apply     (a ready one)   POST /api/admin/rejudgings/{id}/discard
    GET  /api/admin/log                       (organiser) every control, oldest first
    GET  /api/announcements                   everyone

May import: graders.arena (db, api).
"""
from __future__ import annotations

import datetime
import json

from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import select

from graders.arena.api import MAX_ADMIN_BODY, Utf8JSONResponse, competition_or_404, db_of, read_body, require_organiser
from graders.arena.board import iso
from graders.arena.db import (Announcement, ControlLog, Database, KataResult, RejudgedResult, RejudgeItem, Rejudging,
                              Submission, SupersededResult, Team, now, submission_row, utc_moment, valid_text)

MAX_TEXT = 2000


class ControlRefused(ValueError):
    """A control that cannot be applied; the message says why, in one sentence."""


def _logged(session, action: str, target: str | None = None, reason: str | None = None) -> None:
    session.add(ControlLog(action=action, target=target, reason=reason, created=now()))


def _text(text, what: str) -> str:
    if not isinstance(text, str) or not text.strip():
        raise ControlRefused(f"{what} is empty")
    text = valid_text(text).replace("\x00", "")
    if len(text) > MAX_TEXT:
        raise ControlRefused(f"{what} has more than {MAX_TEXT} characters")
    return text.strip()


def freeze(db: Database, at: datetime.datetime | None = None) -> datetime.datetime:
    """Freeze the public board from `at` (default now; naive UTC)."""
    moment = at or now()
    with db.session() as session:
        competition = competition_or_404(db, session)
        if competition.closed:
            raise ControlRefused("the competition is closed: its board shows everything")
        competition.frozen_at = moment
        _logged(session, "freeze", iso(moment))
    return moment


def unfreeze(db: Database) -> None:
    with db.session() as session:
        competition = competition_or_404(db, session)
        competition.frozen_at = None
        _logged(session, "unfreeze")


def _submission(session, sid: int) -> Submission:
    if (submission := submission_row(session, sid)) is None:
        raise ControlRefused(f"no such submission: #{sid}")
    return submission


def exclude(db: Database, sid: int, reason: str) -> None:
    """Disqualify or ignore submission `sid`: it counts for nothing; `reason` is shown to its team."""
    reason = _text(reason, "the reason")[:500]
    with db.session() as session:
        submission = _submission(session, sid)
        submission.excluded = reason
        _logged(session, "exclude", f"submission {sid} of {session.get(Team, submission.team_id).name}", reason)


def include(db: Database, sid: int) -> None:
    """Take an exclusion back."""
    with db.session() as session:
        submission = _submission(session, sid)
        if submission.excluded is None:
            raise ControlRefused(f"submission #{sid} is not excluded")
        submission.excluded = None
        _logged(session, "include", f"submission {sid} of {session.get(Team, submission.team_id).name}")


def announce(db: Database, text: str) -> int:
    text = _text(text, "the announcement")
    with db.session() as session:
        announcement = Announcement(text=text, created=now())
        session.add(announcement)
        _logged(session, "announce", None, text)
        session.flush()
        return announcement.id


def announcements(db: Database) -> list[dict]:
    with db.session() as session:
        return [{"id": a.id, "at": iso(a.created), "text": a.text}
                for a in session.scalars(select(Announcement).order_by(Announcement.id.desc()))]


def log(db: Database) -> list[dict]:
    with db.session() as session:
        return [{"at": iso(entry.created), "action": entry.action, "target": entry.target, "reason": entry.reason}
                for entry in session.scalars(select(ControlLog).order_by(ControlLog.id))]


def rejudge(db: Database, *, submissions: list[int] = (), katas: list[str] = (), teams: list[str] = ()) -> int:
    """Grade a set again: the graded submissions matching every filter given (none: all of them), on the
    katas given (none: each submission's own). The servers grade it when no submission waits; nothing on the
    board changes until `apply_rejudging`. The rejudging's id."""
    with db.session() as session:
        competition = competition_or_404(db, session)
        names = {t.id: t.name for t in session.scalars(select(Team))}
        unknown = [k for k in katas if k not in competition.katas]
        if unknown:
            raise ControlRefused(f"no such kata in this competition: {unknown[0]!r}")
        chosen = [s for s in session.scalars(select(Submission).where(Submission.status == "graded").order_by(Submission.id))
                  if (not submissions or s.id in submissions) and (not teams or names[s.team_id] in teams)]
        items = [(s, [k for k in s.katas if not katas or k in katas]) for s in chosen]
        items = [(s, scope) for s, scope in items if scope]
        if not items:
            raise ControlRefused("no graded submission matches: nothing to rejudge")
        scope = "; ".join(part for part in (
            f"submissions {', '.join(map(str, submissions))}" if submissions else "",
            f"katas {', '.join(katas)}" if katas else "", f"teams {', '.join(teams)}" if teams else "") if part) or "everything"
        rejudging = Rejudging(scope=valid_text(scope)[:500], created=now())
        session.add(rejudging)
        session.flush()
        for submission, scope_katas in items:
            session.add(RejudgeItem(rejudging_id=rejudging.id, submission_id=submission.id, katas=scope_katas))
        _logged(session, "rejudge", f"rejudging {rejudging.id}: {len(items)} submission(s)", rejudging.scope)
        return rejudging.id


def _rejudging(session, rid: int) -> Rejudging:
    rejudging = session.get(Rejudging, rid) if 0 < rid < 2**63 else None
    if rejudging is None:
        raise ControlRefused(f"no such rejudging: #{rid}")
    return rejudging


def rejudging_of(db: Database, rid: int) -> dict:
    """A rejudging for the organiser to review: each kata's verdict on the board and the new one, side by side."""
    with db.session() as session:
        rejudging = _rejudging(session, rid)
        names = {t.id: t.name for t in session.scalars(select(Team))}
        items = session.scalars(select(RejudgeItem).where(RejudgeItem.rejudging_id == rid)).all()
        new = {(r.submission_id, r.kata): r for r in session.scalars(select(RejudgedResult).where(RejudgedResult.rejudging_id == rid))}
        old = {(r.submission_id, r.kata): (r.points if rejudging.status != "applied" else None)
               for r in session.scalars(select(KataResult).where(KataResult.submission_id.in_([i.submission_id for i in items])))}
        if rejudging.status == "applied":
            old = {(r.submission_id, r.kata): r.points for r in session.scalars(
                select(SupersededResult).where(SupersededResult.rejudging_id == rid))}
        rows = []
        for item in items:
            team = names[session.get(Submission, item.submission_id).team_id]
            for kata in item.katas:
                result = new.get((item.submission_id, kata))
                was, now_points = old.get((item.submission_id, kata)), result.points if result else None
                rows.append({"submission": item.submission_id, "team": team, "kata": kata, "old": was,
                             "new": now_points, "changed": result is not None and was != now_points,
                             "message": (result.summary or {}).get("message") if result else None})
        return {"id": rid, "scope": rejudging.scope, "status": rejudging.status, "created": iso(rejudging.created),
                "submissions": len(items), "graded": sum(i.status == "graded" for i in items), "verdicts": rows}


def apply_rejudging(db: Database, rid: int) -> int:
    """Put a ready rejudging's verdicts on the board; each one replaced is kept as superseded. How many changed."""
    changed = 0
    with db.session() as session:
        rejudging = _rejudging(session, rid)
        if rejudging.status != "ready":
            raise ControlRefused(f"rejudging #{rid} is {rejudging.status}: only a ready one (every item graded) is applied")
        touched = set()
        for result in session.scalars(select(RejudgedResult).where(RejudgedResult.rejudging_id == rid)):
            current = session.scalars(select(KataResult).where(KataResult.submission_id == result.submission_id,
                                                               KataResult.kata == result.kata)).first()
            if current is None:
                session.add(KataResult(submission_id=result.submission_id, kata=result.kata, points=result.points,
                                       summary=result.summary))
            else:
                session.add(SupersededResult(submission_id=current.submission_id, kata=current.kata, points=current.points,
                                             summary=current.summary, rejudging_id=rid, superseded_at=now()))
                changed += current.points != result.points
                current.points, current.summary, current.graded_at = result.points, result.summary, now()
            touched.add(result.submission_id)
        session.flush()
        for sid in touched:
            total = sum(session.scalars(select(KataResult.points).where(KataResult.submission_id == sid)))
            session.get(Submission, sid).total_points = total
        rejudging.status = "applied"
        _logged(session, "apply", f"rejudging {rid}", f"{changed} verdict(s) changed")
    return changed


def discard_rejudging(db: Database, rid: int) -> None:
    with db.session() as session:
        rejudging = _rejudging(session, rid)
        if rejudging.status not in ("queued", "ready"):
            raise ControlRefused(f"rejudging #{rid} is {rejudging.status} already")
        rejudging.status = "discarded"
        for item in session.scalars(select(RejudgeItem).where(RejudgeItem.rejudging_id == rid, RejudgeItem.status != "graded")):
            item.status = "discarded"  # never claimed: the queue takes queued items only
        _logged(session, "discard", f"rejudging {rid}")


# ---------------------------------------------------------------------------------------------------------
# The organiser's API

router = APIRouter(prefix="/api", default_response_class=Utf8JSONResponse)


async def _payload(request: Request) -> dict:
    await run_in_threadpool(require_organiser, request)
    body = await read_body(request, MAX_ADMIN_BODY)
    if not body.strip():
        return {}
    try:
        payload = json.loads(body)
    except ValueError:
        raise HTTPException(400, "the body is not JSON") from None
    if not isinstance(payload, dict):
        raise HTTPException(400, "the body is not a JSON object")
    return payload


async def _apply(request: Request, control, *args):
    try:
        result = await run_in_threadpool(control, db_of(request), *args)
    except ControlRefused as refused:
        raise HTTPException(404 if "no such" in str(refused) else 400 if "nothing to" in str(refused) or
                            "empty" in str(refused) or "characters" in str(refused) else 409, str(refused)) from None
    return result


def _moment(text) -> datetime.datetime | None:
    if text is None:
        return None
    try:
        return utc_moment(text)
    except ValueError:
        raise HTTPException(400, f"'at' {str(text)[:40]!r} is no ISO time (2026-12-01T17:00:00Z)") from None


@router.post("/admin/freeze")
async def post_freeze(request: Request):
    payload = await _payload(request)
    moment = await _apply(request, freeze, _moment(payload.get("at")))
    return {"frozen_at": iso(moment)}


@router.post("/admin/unfreeze")
async def post_unfreeze(request: Request):
    await _payload(request)
    await _apply(request, unfreeze)
    return {"frozen_at": None}


@router.post("/admin/submissions/{sid}/exclude")
async def post_exclude(request: Request, sid: int):
    payload = await _payload(request)
    await _apply(request, exclude, sid, payload.get("reason"))
    return {"id": sid, "excluded": True}


@router.post("/admin/submissions/{sid}/include")
async def post_include(request: Request, sid: int):
    await _payload(request)
    await _apply(request, include, sid)
    return {"id": sid, "excluded": False}


@router.post("/admin/announcements", status_code=201)
async def post_announcement(request: Request):
    payload = await _payload(request)
    return {"id": await _apply(request, announce, payload.get("text"))}


@router.post("/admin/rejudgings", status_code=201)
async def post_rejudging(request: Request):
    payload = await _payload(request)
    lists = {key: payload.get(key) or [] for key in ("submissions", "katas", "teams")}
    if not all(isinstance(v, list) for v in lists.values()) or not all(isinstance(i, int) for i in lists["submissions"]):
        raise HTTPException(400, 'send {"submissions": [ids], "katas": [names], "teams": [names]} (each optional)')
    rid = await _apply(request, lambda db: rejudge(db, **lists))
    request.app.state.queue.wake.set()
    return {"id": rid}


@router.get("/admin/rejudgings/{rid}")
async def get_rejudging(request: Request, rid: int):
    await run_in_threadpool(require_organiser, request)
    return await _apply(request, rejudging_of, rid)


@router.post("/admin/rejudgings/{rid}/apply")
async def post_apply(request: Request, rid: int):
    await _payload(request)
    return {"id": rid, "changed": await _apply(request, apply_rejudging, rid)}


@router.post("/admin/rejudgings/{rid}/discard")
async def post_discard(request: Request, rid: int):
    await _payload(request)
    await _apply(request, discard_rejudging, rid)
    return {"id": rid, "status": "discarded"}


@router.get("/admin/log")
def get_log(request: Request):
    require_organiser(request)
    return log(db_of(request))


@router.get("/announcements")
def get_announcements(request: Request):
    return announcements(db_of(request))
