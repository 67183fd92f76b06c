"""The JSON API behind every page (the team client uses it), under /api/, the token as
`Authorization: Bearer TOKEN`; and the one path every upload takes (API and the page's form alike).

    GET  /api/competition               katas, closing time, rate limit; the seed only after the close
    GET  /api/board                     the ranked rows (graders.competition.ranking)
    GET  /api/katas/{kata}              the ranking for one kata
    GET  /api/teams/{name}              a team's submission history (the name URL-encoded: it may hold a `/`)
    GET  /api/me                        (team) the team's row and rank
    POST /api/submissions               (team) upload: a tar archive, or multipart files named by path
    GET  /api/submissions/{id}          points per kata and level; sentences for the team (all after the close)
    GET  /api/submissions/{id}/files    (team or organiser) the uploaded code
    GET  /api/admin/submissions         (organiser) every submission and its state
    POST /api/admin/teams               (organiser) {"name": ...}: adds a team, returns its token once

Every upload takes the same steps (`take_upload`): the body is read within its cap; the token, the
closing time and the rate limit are checked and the upload recorded as the team's (under a lock on the
team's row that every server on the database respects, one short transaction); the archive is unpacked in a worker thread, outside every lock, within its byte and
time budgets (graders.arena.uploads); then the submission is stored, or the upload marked refused. A
refused upload counts against the team's rate like a stored one, and one team's upload never holds
another's acknowledgement. A body is read chunk by chunk, each within the server's read time-out
(`serve --read-timeout`, 10 s), the whole within BODY_SECONDS: a client that declares a body and stalls is
answered 408 and its connection closed, never held open.

Every refusal is a sentence ({"detail": "..."}): a body that is not JSON, an id no row can have (over
64 bits), a name holding NUL (which PostgreSQL refuses to compare) answer 400, 404 or 422, never 500.

May import: graders.frame, graders.competition (store: files_hash), graders.arena (db, uploads, board).
"""
from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from datetime import timedelta

from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from sqlalchemy import func, select, update

from graders.arena import uploads
from graders.competition.store import files_hash
from graders.arena.board import frozen, iso, redact_summary, results_of, standings
from graders.arena.db import (Database, NameRefused, NameTaken, Submission, SubmittedFile, SupersededResult, Team,
                              Upload, now, submission_row, token_hash, valid_text)


class Utf8JSONResponse(JSONResponse):
    """A JSON answer that is valid UTF-8 whatever a text holds (a lone surrogate becomes its escape)."""

    def render(self, content) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return super().render(valid_text(content))


router = APIRouter(prefix="/api", default_response_class=Utf8JSONResponse)
_submit_lock = threading.Lock()  # in this process; across servers, Database.lock_team (never held longer)


def db_of(request: Request) -> Database:
    return request.app.state.db


def bearer(request: Request, cookie: bool = False) -> str | None:
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return request.cookies.get("arena_token") if cookie else None


def competition_or_404(db: Database, session):
    competition = db.competition(session)
    if competition is None:
        raise HTTPException(404, "no competition yet: the organiser runs `arena.py create`")
    return competition


def competition_json(db: Database) -> dict:
    with db.session() as session:
        c = competition_or_404(db, session)
        teams = session.scalar(select(func.count(Team.id)))
        out = {"katas": c.katas, "closes_at": iso(c.closes_at), "closed": c.closed, "speed": c.speed,
               "rate_limit": {"submissions": c.rate_limit, "per_seconds": c.rate_window}, "teams": teams,
               "max_upload_bytes": uploads.MAX_UPLOAD_BYTES, "max_files": uploads.MAX_FILES}
        if c.closed:
            out["seed"] = c.seed  # published at the close, never before
        return out


def board_json(db: Database, kata: str | None = None, token: str | None = None) -> dict:
    """The ranked rows; `open` says whether uploads are taken now (not closed, not past the closing time);
    `frozen_at` when the public board stopped moving (the organiser's token reads the live board)."""
    with db.session() as session:
        c = competition_or_404(db, session)
        if kata is not None and kata not in c.katas:
            raise HTTPException(404, f"no kata {kata!r} in this competition")
        live = db.is_organiser(session, token)
        return {"closed": c.closed, "open": not is_closed(c), "katas": c.katas, "kata": kata,
                "frozen_at": iso(frozen(c)), "live": live or not frozen(c), "rows": standings(session, c, kata, live=live)}


def team_json(db: Database, name: str, token: str | None) -> dict:
    with db.session() as session:
        c = competition_or_404(db, session)
        # no team's name holds NUL (db.team_name), and PostgreSQL refuses to compare a text that does
        team = None if "\x00" in name else session.scalars(select(Team).where(Team.name == name)).first()
        if team is None:
            raise HTTPException(404, "no such team")
        mine = db.is_organiser(session, token) or (token is not None and team.token_hash == token_hash(token))
        history = [{"id": s.id, "created": iso(s.created), "status": s.status, "katas": s.katas,
                    "points": s.total_points if (s.status == "graded" and not after_freeze(c, s)) or mine else None,
                    "graded_at": iso(s.graded_at), "excluded": (s.excluded if mine else True) if s.excluded else False}
                   for s in session.scalars(select(Submission).where(Submission.team_id == team.id).order_by(Submission.id.desc()))]
        row = next((r for r in standings(session, c) if r["team"] == name), None)
        return {"team": name, "row": row, "submissions": history, "closed": c.closed}


def submission_or_404(session, sid: int) -> Submission:
    """Submission `sid`, or 404; an id over 64 bits (which the database cannot even compare) is no row's."""
    if (s := submission_row(session, sid)) is None:
        raise HTTPException(404, f"no such submission: #{sid}")
    return s


def submission_json(db: Database, sid: int, token: str | None) -> dict:
    """What this reader may see of submission `sid`: its team and the organiser everything but the seed;
    others its points once graded (and the sentences after the close), never its code."""
    with db.session() as session:
        c = competition_or_404(db, session)
        s = submission_or_404(session, sid)
        team = session.get(Team, s.team_id)
        owner = db.is_organiser(session, token) or (token is not None and team.token_hash == token_hash(token))
        results = results_of(session, sid)
        visible = owner or (s.status == "graded" and not after_freeze(c, s))  # a frozen board's secret too
        katas = {k: redact_summary(r, closed=c.closed, detailed=owner) for k, r in results.items()} if visible else {}
        row = next((r for r in standings(session, c) if r["team"] == team.name), None)
        return {"id": s.id, "team": team.name, "status": s.status, "created": iso(s.created), "katas_graded": katas,
                "katas": s.katas, "graded": len(results), "total_points": s.total_points if visible else None,
                "files": [f.path for f in session.scalars(select(SubmittedFile).where(SubmittedFile.submission_id == sid))] if owner else None,
                "attempts": s.attempts if owner else None, "rank": row["rank"] if row else None,
                "team_points": row["points"] if row else None, "of": len(standings(session, c)), "mine": owner,
                "closed": c.closed, "excluded": (s.excluded if owner else True) if s.excluded else False,
                "superseded": [{"kata": r.kata, "points": r.points, "rejudging": r.rejudging_id} for r in
                               session.scalars(select(SupersededResult).where(SupersededResult.submission_id == sid))]
                if visible else []}


def after_freeze(competition, submission: Submission) -> bool:
    """Made after the public board froze: its points are its team's (and the organiser's) until the close."""
    moment = frozen(competition)
    return moment is not None and submission.created >= moment


def retry_after(db: Database, session, team: Team, competition) -> int | None:
    """Seconds until the team may upload again, or None when it may now. Its submissions in the window
    count, and so do its uploads not stored (refused, or still being unpacked)."""
    since = now() - timedelta(seconds=competition.rate_window)
    recent = sorted([*session.scalars(select(Submission.created).where(Submission.team_id == team.id,
                                                                       Submission.created > since)),
                     *session.scalars(select(Upload.created).where(Upload.team_id == team.id, Upload.created > since,
                                                                   Upload.outcome != "stored"))])
    if len(recent) < competition.rate_limit:
        return None
    # free again when enough of them have left the window to leave one place
    return max(1, math.ceil((recent[len(recent) - competition.rate_limit] - since).total_seconds()))


def is_closed(competition) -> bool:
    return competition.closed or bool(competition.closes_at and now() >= competition.closes_at)


def admit_upload(db: Database, token: str | None) -> tuple[int, list[str]]:
    """Authenticate, check the window and the rate limit, and record the upload as the team's, `pending`:
    from here it counts against the team's rate, whatever it holds. (The upload's id, the katas.)"""
    with _submit_lock, db.session() as session:
        team = db.team_by_token(session, token)
        if team is None:
            raise HTTPException(401, "unknown token: use the team token `arena.py team add` printed",
                                headers={"WWW-Authenticate": "Bearer"})
        db.lock_team(session, team.id)  # every server on the database: the count below and the row are one step
        c = competition_or_404(db, session)
        if is_closed(c):
            raise HTTPException(403, "the competition is closed: no more submissions")
        wait = retry_after(db, session, team, c)
        if wait is not None:
            raise HTTPException(429, f"rate limit: {c.rate_limit} submissions per {c.rate_window:g}s; "
                                     f"try again in {wait}s", headers={"Retry-After": str(wait)})
        upload = Upload(team_id=team.id, created=now())
        session.add(upload)
        session.flush()
        return upload.id, list(c.katas)


def reason_text(reason: str) -> str:
    """A refusal's sentence as stored: valid UTF-8, no NUL (PostgreSQL stores no text that holds one)."""
    return valid_text(reason).replace("\x00", "\\x00")[:500]


def refuse_upload(db: Database, upload_id: int, reason: str) -> None:
    with db.session() as session:
        session.execute(update(Upload).where(Upload.id == upload_id)
                        .values(outcome="refused", reason=reason_text(reason)))


def refused_unread(db: Database, token: str | None, reason: str) -> None:
    """An upload refused before it was admitted (its body over the cap, a form that cannot be read) counts
    against the rate of the team whose token the request carries, while the rate allows one more."""
    with _submit_lock, db.session() as session:
        team, c = db.team_by_token(session, token), db.competition(session)
        if team is not None:
            db.lock_team(session, team.id)
        if team is not None and c is not None and not is_closed(c) and retry_after(db, session, team, c) is None:
            session.add(Upload(team_id=team.id, created=now(), outcome="refused", reason=reason_text(reason)))


def store_submission(db: Database, upload_id: int, kept: dict[str, bytes]) -> dict:
    """Store the submission's row and files and mark its upload stored, in one transaction; the id is
    returned (acknowledged) only after the commit."""
    with db.session() as session:
        # Under the team's lock: an upload turns into a submission while no server counts the team's rate.
        # PostgreSQL reads each statement of retry_after at its own moment (READ COMMITTED), so an upload
        # stored between its two reads would be counted by neither, and a fourth upload let through.
        db.lock_team(session, session.get(Upload, upload_id).team_id)
        c = competition_or_404(db, session)
        if is_closed(c):  # closed while the upload was unpacked
            raise HTTPException(403, "the competition is closed: no more submissions")
        upload = session.get(Upload, upload_id)
        team = session.get(Team, upload.team_id)
        submission = Submission(team_id=team.id, katas=list(c.katas), files_hash=files_hash(kept), created=now())
        session.add(submission)
        session.flush()
        session.add_all(SubmittedFile(submission_id=submission.id, path=p, content=b) for p, b in kept.items())
        upload.outcome, upload.submission_id = "stored", submission.id
        sid, team_name = submission.id, team.name
    return {"id": sid, "team": team_name, "status": "queued", "files": sorted(kept), "katas": list(c.katas)}


async def take_upload(request: Request) -> tuple[dict, str | None]:
    """The one path every upload takes (see the module's docstring): (the acknowledgement, the token).
    Each step that waits on the database or unpacks runs in a worker thread, never in the event loop."""
    db = db_of(request)
    try:
        form_token, parse = await read_upload(request)
    except HTTPException as exc:
        await run_in_threadpool(refused_unread, db, bearer(request), str(exc.detail))
        raise
    token = bearer(request) or form_token
    upload_id, katas = await run_in_threadpool(admit_upload, db, token)
    try:
        kept = await run_in_threadpool(parse, katas)
        ack = await run_in_threadpool(store_submission, db, upload_id, kept)
    except uploads.UploadRefused as exc:
        await run_in_threadpool(refuse_upload, db, upload_id, str(exc))
        raise HTTPException(exc.status, str(exc)) from None
    except Exception as exc:
        await run_in_threadpool(refuse_upload, db, upload_id, str(getattr(exc, "detail", exc)) or type(exc).__name__)
        raise
    return ack, token


# A body declared over the cap is still read (and dropped) up to this multiple of it, so the client reads its 413.
DRAINED_OVER_THE_CAP = 4
READ_TIMEOUT = 10.0  # seconds a body may stall between two chunks (`serve --read-timeout`)
BODY_SECONDS = 120.0  # seconds the whole body may take: 512 KiB at 4.4 KB/s
MAX_ADMIN_BODY = 16 * 1024


async def body_chunks(request: Request):
    """The request's body, chunk by chunk, each within the server's read time-out of the one before and the
    whole within BODY_SECONDS; else 408 (and the connection is closed: its body was never read to its end)."""
    idle = getattr(request.app.state, "read_timeout", READ_TIMEOUT)
    deadline = time.monotonic() + BODY_SECONDS
    chunks = request.stream().__aiter__()
    while True:
        left = deadline - time.monotonic()
        try:
            chunk = await asyncio.wait_for(chunks.__anext__(), max(0.0, min(idle, left)))
        except StopAsyncIteration:
            return
        except asyncio.TimeoutError:
            raise HTTPException(408, f"the request's body stalled: no byte for {idle:g} s" if left > idle else
                                     f"the request's body took over {BODY_SECONDS:g} s",
                                headers={"Connection": "close"}) from None
        yield chunk


async def read_body(request: Request, cap: int) -> bytes:
    """The whole body within `cap` bytes (413 over it) and the read time-outs (408)."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > cap):
        if declared.isdigit() and int(declared) <= DRAINED_OVER_THE_CAP * cap:
            # Read what a client that does not wait for an answer is still sending, and drop it: answering and
            # closing first resets its connection, and it would never read the 413.
            async for _ in body_chunks(request):
                pass
            raise HTTPException(413, f"upload over {cap} bytes")
        raise HTTPException(413, f"upload over {cap} bytes", headers={"Connection": "close"})  # its body unread
    body = bytearray()
    async for chunk in body_chunks(request):
        body += chunk
        if len(body) > cap:
            raise HTTPException(413, f"upload over {cap} bytes")
    return bytes(body)


async def read_upload(request: Request) -> tuple[str | None, object]:
    """The body within the cap (413 before reading when Content-Length is over it) and the read time-outs
    (408), and a parser for it: (the token a form carried, parse(katas) -> files)."""
    body = await read_body(request, uploads.MAX_UPLOAD_BYTES)
    request._body = body  # request.form() reads the body kept here
    kind = request.headers.get("content-type", "")
    if kind.startswith("multipart/form-data"):
        try:
            form = await request.form(max_files=uploads.MAX_FILES, max_fields=uploads.MAX_FILES + 4)
        except Exception as exc:
            raise HTTPException(413 if "Too many" in str(exc) else 400, f"unreadable form: {exc}") from None
        parts = []
        for key, value in form.multi_items():
            if hasattr(value, "read"):
                data = await value.read()
                name = key if key not in ("file", "files", "archive") else (value.filename or "")
                if key == "archive" and data:
                    return form.get("token") or None, lambda katas, d=data: uploads.from_tar(d, katas)
                parts.append((name, data))
        token = form.get("token")
        return (token if isinstance(token, str) and token else None), lambda katas: uploads.from_parts(parts, katas)
    data = bytes(body)
    return None, lambda katas: uploads.from_tar(data, katas)


@router.get("/competition")
def get_competition(request: Request):
    return competition_json(db_of(request))


@router.get("/board")
def get_board(request: Request):
    return board_json(db_of(request), token=bearer(request))


@router.get("/katas/{kata}")
def get_kata_board(request: Request, kata: str):
    return board_json(db_of(request), kata, bearer(request))


@router.get("/teams/{name:path}")  # a name may hold a `/` (encoded %2F, which the path arrives decoded)
def get_team(request: Request, name: str):
    return team_json(db_of(request), name, bearer(request))


@router.get("/me")
def get_me(request: Request):
    db = db_of(request)
    with db.session() as session:
        team = db.team_by_token(session, bearer(request))
        if team is None:
            raise HTTPException(401, "unknown token", headers={"WWW-Authenticate": "Bearer"})
        name = team.name
    return team_json(db, name, bearer(request))


@router.post("/submissions", status_code=201)
async def post_submission(request: Request):
    started = time.perf_counter()
    ack, _ = await take_upload(request)
    request.app.state.queue.wake.set()
    ack["ack_seconds"] = round(time.perf_counter() - started, 4)
    return JSONResponse(ack, status_code=201, headers={"Location": f"/api/submissions/{ack['id']}"})


@router.get("/submissions/{sid}")
def get_submission(request: Request, sid: int):
    return submission_json(db_of(request), sid, bearer(request))


@router.get("/submissions/{sid}/files")
def get_files(request: Request, sid: int):
    db, token = db_of(request), bearer(request)
    with db.session() as session:
        s = submission_or_404(session, sid)
        team = session.get(Team, s.team_id)
        if not (db.is_organiser(session, token) or (token and team.token_hash == token_hash(token))):
            raise HTTPException(403, "only the submission's team and the organiser read its code")
        return {f.path: f.content.decode(errors="replace")
                for f in session.scalars(select(SubmittedFile).where(SubmittedFile.submission_id == sid))}


def organiser_only(request: Request, session) -> None:
    """401 without a token, 403 with one that is not the organiser's."""
    token = bearer(request)
    if not db_of(request).is_organiser(session, token):
        raise HTTPException(403 if token else 401, "organiser endpoints need the organiser's token (printed by "
                            "`arena.py create`)", headers=None if token else {"WWW-Authenticate": "Bearer"})


@router.get("/admin/submissions")
def admin_submissions(request: Request):
    db = db_of(request)
    with db.session() as session:
        organiser_only(request, session)
        teams = {t.id: t.name for t in session.scalars(select(Team))}
        return [{"id": s.id, "team": teams[s.team_id], "status": s.status, "attempts": s.attempts,
                 "created": iso(s.created), "graded": len(results_of(session, s.id)), "points": s.total_points}
                for s in session.scalars(select(Submission).order_by(Submission.id))]


@router.post("/admin/teams", status_code=201)
async def admin_add_team(request: Request):
    """The organiser first (401, 403), then the body: a JSON object {"name": ...} (400 otherwise); the name is
    normalised and refused as `arena.py team add` does (db.Database.add_team; 409 when it reads like a team's)."""
    db = db_of(request)
    await run_in_threadpool(require_organiser, request)
    body = await read_body(request, MAX_ADMIN_BODY)
    try:
        payload = json.loads(body)
    except ValueError:
        raise HTTPException(400, 'the body is not JSON: send {"name": "Team Name"}') from None
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        raise HTTPException(400, 'the body names no team: send {"name": "Team Name"}')
    try:
        name, token = await run_in_threadpool(db.add_team, payload["name"])
    except NameTaken as taken:
        raise HTTPException(409, str(taken)) from None
    except NameRefused as refused:
        raise HTTPException(400, str(refused)) from None
    return {"team": name, "token": token}


def require_organiser(request: Request) -> None:
    with db_of(request).session() as session:
        organiser_only(request, session)


def refusal(errors: list[dict]) -> str:
    """A request FastAPI could not read (an id that is not a number...), as one sentence."""
    said = []
    for error in errors:
        where = ".".join(str(part) for part in error.get("loc", ())[1:]) or "the request"
        said.append(f"{where} {error['input']!r}: {error.get('msg', 'invalid')}" if "input" in error
                    else f"{where}: {error.get('msg', 'invalid')}")
    return "; ".join(said) or "the request could not be read"
