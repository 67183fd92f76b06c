"""The organiser's controls over a live competition, what a contest jury (DOMjudge's, GPU MODE's) relies on:

- freeze: from a moment on, the public board stops moving (it counts only submissions made before it);
  each team still sees its own results, the organiser's board (with the organiser's token) stays live, and
  the close reveals everything (graders/arena/board.py, `standings`);
- exclude a submission (disqualify it, or ignore it), with a reason, and include it again: an excluded
  submission counts for nothing on any board, its team and the organiser read why;
- announce: a message to every team, on the board;
- every control is logged with its moment, target and reason (`log`).

The same functions serve the `arena.py` commands (on the database) and the organiser's API:

    POST /api/admin/freeze                    {"at": "2026-12-01T17:00:00Z"} (optional; default now)
    POST /api/admin/unfreeze
    POST /api/admin/submissions/{id}/exclude  {"reason": "..."}
    POST /api/admin/submissions/{id}/include
    POST /api/admin/announcements             {"text": "..."}
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
from graders.arena.db import Announcement, ControlLog, Database, Submission, Team, now, valid_text

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
    submission = session.get(Submission, sid) if 0 < sid < 2**63 else None
    if submission is None:
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
        raise HTTPException(409 if "not excluded" in str(refused) or "closed" in str(refused) else
                            404 if "no such" in str(refused) else 400, str(refused)) from None
    return result


def _moment(text) -> datetime.datetime | None:
    if text is None:
        return None
    try:
        moment = datetime.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        raise HTTPException(400, f"'at' {str(text)[:40]!r} is no ISO time (2026-12-01T17:00:00Z)") from None
    return moment.astimezone(datetime.timezone.utc).replace(tzinfo=None) if moment.tzinfo else moment


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


@router.get("/admin/log")
def get_log(request: Request):
    require_organiser(request)
    return log(db_of(request))


@router.get("/announcements")
def get_announcements(request: Request):
    return announcements(db_of(request))
