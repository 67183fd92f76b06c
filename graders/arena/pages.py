"""The pages, rendered on the server (no front-end build): the live board at `/` (it follows /events, a
server-sent event stream, and redraws its rows from /api/board without a reload), the ranking per kata,
a team's history, a submission's points per kata and level with the failing check's sentence and the
graph before and after the pass drawn as SVG, and the upload form. Every text a team controls is
HTML-escaped here (and the board's script writes rows with textContent only).

Every page has a viewport (it reads on a phone), and no inline script or style: the script and the style
sheet are served from /static/ under the server's Content-Security-Policy (graders.arena.app), which
allows only this site's own. When the competition closes the board drops its upload form and shows the
seed without a reload. An error on a page (not under /api/) is answered as a small page with its
sentence, its status kept (`error_page`).

May import: graders.frame, graders.arena (api, controls, graphs, uploads).
"""
from __future__ import annotations

import asyncio
import datetime
import html
import json
import time
from http import HTTPStatus

from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from sqlalchemy import func, select

from graders.arena import controls
from graders.arena.api import (bearer, board_json, competition_json, db_of, is_closed, submission_json, take_upload,
                               team_json)
from graders.arena.db import Announcement, KataResult, Submission, SupersededResult
from graders.arena.graphs import split_message, svg
from graders.frame.levels import LEVELS

router = APIRouter()
e = html.escape
STREAM_SECONDS = 300  # an event stream ends after this; the browser's EventSource reconnects by itself

STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:72em}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}th{background:#f4f4f4}.dq{color:#a00}
.grading{color:#888;font-style:italic}pre{white-space:pre-wrap;background:#f8f8f8;padding:.5em}
.graphs{display:flex;gap:1em;flex-wrap:wrap}nav a{margin-right:1em}form{margin-top:1em}
.wide{overflow-x:auto}svg{max-width:100%;height:auto}
@media (max-width:40em){body{margin:.6em}td,th{padding:.2em .3em}h1{font-size:1.4em}}"""
VIEWPORT = "<meta name='viewport' content='width=device-width, initial-scale=1'>"


def page(title: str, body: str, status: int = 200, headers: dict | None = None) -> HTMLResponse:
    text = (f"<!doctype html><html><head><meta charset='utf-8'>{VIEWPORT}<title>{e(title)}</title>"
            "<link rel='stylesheet' href='/static/arena.css'></head>"
            f"<body><nav><a href='/'>board</a></nav><h1>{e(title)}</h1>{body}</body></html>")
    # valid UTF-8 whatever a text holds: a lone surrogate (an exception's message) is shown as its escape
    return HTMLResponse(text.encode("utf-8", "backslashreplace"), status_code=status, headers=headers)


def error_page(status: int, sentence: str, headers: dict | None = None) -> HTMLResponse:
    """An error on a page: its sentence on a small page, the status kept."""
    try:
        title = f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        title = str(status)
    return page(title, f"<p id='error'>{e(sentence)}</p><p><a href='/'>back to the board</a></p>", status, headers)


def fmt(x, pattern="{:.1f}", none="-"):
    return pattern.format(x) if isinstance(x, (int, float)) else none


def team_link(name: str) -> str:
    """A team's page, its name URL-encoded (a `/` is %2F; /teams/{name:path} takes it back)."""
    from urllib.parse import quote
    return f"<a href='/teams/{e(quote(name, safe=''))}'>{e(name)}</a>"


def board_rows(board: dict) -> str:
    rows = []
    for r in board["rows"]:
        cells = [str(r["rank"]), team_link(r["team"]), fmt(r["points"]),
                 *[fmt(r["katas"].get(k), "{:.0f}") for k in board["katas"]],
                 fmt(r["geomean_speedup"], "{:.2f}x"), "grading…" if r["grading"] else "rejudged" if r.get("rejudged") else ""]
        rows.append(f"<tr data-team='{e(r['team'])}'{' class=dq' if r['disqualified'] else ''}>"
                    + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return "".join(rows)


BOARD_SCRIPT = """'use strict';
const table = document.getElementById('board');
const katas = JSON.parse(table.dataset.katas);
function cell(tr, text, href) { const td = document.createElement('td');
  if (href) { const a = document.createElement('a'); a.href = href; a.textContent = text; td.appendChild(a); }
  else td.textContent = text; tr.appendChild(td); }
function f(x, d) { return (typeof x === 'number') ? x.toFixed(d) : '-'; }
async function closed(board) {
  const form = document.getElementById('submit'); if (form) form.remove();
  const state = document.getElementById('state');
  if (board.closed) state.textContent = 'closed';
  else if (!state.textContent.startsWith('closed')) state.textContent = 'closed for submissions';
  const seed = document.getElementById('seed');
  if (board.closed && !seed.textContent) {
    const info = await (await fetch('/api/competition', {cache: 'no-store'})).json();
    if (info.seed !== undefined) seed.textContent = 'The seed was ' + info.seed + '.';
  }
}
async function redraw() {
  const board = await (await fetch('/api/board', {cache: 'no-store'})).json();
  const body = document.getElementById('rows'); const fresh = document.createElement('tbody'); fresh.id = 'rows';
  for (const r of board.rows) { const tr = document.createElement('tr'); tr.dataset.team = r.team;
    if (r.disqualified) tr.className = 'dq';
    cell(tr, String(r.rank)); cell(tr, r.team, '/teams/' + encodeURIComponent(r.team)); cell(tr, f(r.points, 1));
    for (const k of katas) cell(tr, f(r.katas[k], 0));
    cell(tr, typeof r.geomean_speedup === 'number' ? r.geomean_speedup.toFixed(2) + 'x' : '-');
    cell(tr, r.grading ? 'grading…' : r.rejudged ? 'rejudged' : ''); fresh.appendChild(tr); }
  body.replaceWith(fresh); document.getElementById('updated').textContent = new Date().toLocaleTimeString();
  document.getElementById('frozen').textContent = board.frozen_at ? frozenText(board.frozen_at) : '';
  const said = await (await fetch('/api/announcements', {cache: 'no-store'})).json();
  const list = document.createElement('ul'); list.id = 'announcements';
  for (const a of said) { const li = document.createElement('li'); li.textContent = a.at + ': ' + a.text; list.appendChild(li); }
  document.getElementById('announcements').replaceWith(list);
  if (!board.open) await closed(board);
}
function frozenText(at) { return 'The board is frozen since ' + at + ': submissions made since then show at the close.'; }
const events = new EventSource('/events');
events.addEventListener('board', () => redraw());
"""
# A submission's page while it is graded: reloaded when the database moves (a kata graded).
SUBMISSION_SCRIPT = """'use strict';
const s = new EventSource('/events');
s.addEventListener('board', (ev) => { if (window.seen && window.seen !== ev.data) location.reload(); window.seen = ev.data; });
"""
STATIC = {"arena.css": (STYLE, "text/css"), "board.js": (BOARD_SCRIPT, "text/javascript"),
          "submission.js": (SUBMISSION_SCRIPT, "text/javascript")}


@router.get("/static/{name}")
def static(name: str):
    if name not in STATIC:
        raise HTTPException(404, f"no such file: /static/{name}")
    text, kind = STATIC[name]
    return Response(text, media_type=kind, headers={"Cache-Control": "no-cache"})


def upload_form(katas: list[str]) -> str:
    inputs = "".join(f"<label>{e(k)}/solution.py <input type='file' name='{e(k)}/solution.py' accept='.py'></label><br>"
                     for k in katas)
    return ("<section id='submit'><h2>Submit</h2><form id='upload' method='post' action='/submit' "
            "enctype='multipart/form-data'><label>team token <input type='password' name='token' autocomplete='off'>"
            f"</label><br>{inputs}<button type='submit'>submit</button></form></section>")


@router.get("/", response_class=HTMLResponse)
def board_page(request: Request):
    db = db_of(request)
    try:
        info, board = competition_json(db), board_json(db)
    except HTTPException:
        return page("fx-katas arena", "<p>No competition yet: the organiser runs <code>arena.py create</code>.</p>")
    head = "".join(f"<th><a href='/katas/{e(k)}'>{e(k.split('_')[0])}</a></th>" for k in board["katas"])
    past = bool(info["closes_at"]) and info["closes_at"] <= datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    state = ("closed" if info["closed"] else f"closed for submissions since {e(info['closes_at'])} UTC" if past
             else f"open{' until ' + e(info['closes_at']) + ' UTC' if info['closes_at'] else ''}")
    seed = f"The seed was {info['seed']}." if info.get("seed") is not None else ""
    frozen = (f"The board is frozen since {e(board['frozen_at'])}: submissions made since then show at the close."
              if board["frozen_at"] else "")
    said = "".join(f"<li>{e(a['at'])}: {e(a['text'])}</li>" for a in controls.announcements(db))
    body = (f"<p>Competition <span id='state'>{state}</span>; katas {e(', '.join(board['katas']))}; "
            f"updated <span id='updated'>now</span>.</p><p id='seed'>{seed}</p><p id='frozen'>{frozen}</p>"
            f"<ul id='announcements'>{said}</ul>"
            f"<div class='wide'><table id='board' data-katas='{e(json.dumps(board['katas']))}'><thead><tr><th>rank</th>"
            f"<th>team</th><th>points</th>{head}<th>geomean speedup</th><th></th>"
            f"</tr></thead><tbody id='rows'>{board_rows(board)}</tbody></table></div>"
            "<p>Rank by points, then by the geometric mean of the speed levels' speedups (each capped at twice "
            "its kata's threshold).</p>"
            + ("" if info["closed"] or past else upload_form(board["katas"])) + "<script src='/static/board.js'></script>")
    return page("fx-katas arena: live board", body)


@router.get("/katas/{kata}", response_class=HTMLResponse)
def kata_page(request: Request, kata: str):
    board = board_json(db_of(request), kata)
    rows = "".join(f"<tr><td>{r['rank']}</td><td>{team_link(r['team'])}</td><td>{fmt(r['points'])}</td>"
                   f"<td>{fmt(r['geomean_speedup'], '{:.2f}x')}</td></tr>" for r in board["rows"])
    return page(f"{kata}: ranking", "<table><tr><th>rank</th><th>team</th><th>points</th><th>speedup (capped)</th></tr>"
                f"{rows}</table>")


@router.get("/teams/{name:path}", response_class=HTMLResponse)
def team_page(request: Request, name: str):
    data = team_json(db_of(request), name, bearer(request, cookie=True))
    row = data["row"]
    rows = "".join(f"<tr><td><a href='/submissions/{s['id']}'>#{s['id']}</a></td><td>{e(s['created'])}</td>"
                   f"<td>{e(s['status'])}</td><td>{fmt(s['points'])}</td></tr>" for s in data["submissions"])
    rank = f"<p>Rank {row['rank']} with {fmt(row['points'])} points.</p>" if row else ""
    return page(f"Team {name}", f"{rank}<table><tr><th>submission</th><th>submitted (UTC)</th><th>status</th>"
                f"<th>points</th></tr>{rows}</table>")


def kata_section(kata: str, result: dict) -> str:
    levels = result.get("levels") or {}
    cells = "".join(f"<td>{fmt((levels.get(str(n)) or [None])[0])} / {fmt((levels.get(str(n)) or [None, None])[1], '{:.0f}')}</td>"
                    for n in LEVELS)
    out = [f"<h2>{e(kata)}: {fmt(result.get('points'))} points</h2><table><tr>"
           + "".join(f"<th>L{n} {e(level.name)}</th>" for n, level in LEVELS.items()) + f"</tr><tr>{cells}</tr></table>"]
    if result.get("speedup") is not None:
        out.append(f"<p>speedup {fmt(result['speedup'], '{:.2f}x')} (threshold {fmt(result.get('speedup_threshold'), '{:.2f}x')})</p>")
    if result.get("disqualified"):
        out.append(f"<p class='dq'>disqualified: {e(str(result['disqualified']))}</p>")
    if "message" in result:
        out.append(f"<p>{e(result['message'] or '')}</p>")
    failing = next((c for c in result.get("checks", []) if not c.get("passed") and not c.get("skipped")), None)
    if failing:
        sentence, before, after = split_message(failing.get("message", ""))
        out.append(f"<h3>first failing check: L{failing['level']} {e(failing['check'])}</h3><pre>{e(sentence)}</pre>")
        if before:
            out.append(f"<div class='graphs'>{svg(before, 'graph before the pass')}"
                       f"{svg(after, 'graph after the pass') if after else ''}</div>")
    return "".join(out)


@router.get("/submissions/{sid}", response_class=HTMLResponse)
def submission_page(request: Request, sid: int):
    data = submission_json(db_of(request), sid, bearer(request, cookie=True))
    head = (f"<p>Team {team_link(data['team'])}, submitted {e(data['created'])} UTC: <b id='status'>{e(data['status'])}</b>"
            f" ({data['graded']}/{len(data['katas'])} katas graded)"
            + (f", {fmt(data['total_points'])} points" if data["total_points"] is not None else "") + ".</p>")
    if data["excluded"]:
        why = f": {e(data['excluded'])}" if isinstance(data["excluded"], str) else ""
        head += f"<p class='dq' id='excluded'>Excluded by the organiser{why}. It counts for nothing.</p>"
    for old in data["superseded"]:
        head += (f"<p class='rejudged'>Rejudged (rejudging #{old['rejudging']}): {e(old['kata'])} had "
                 f"{fmt(old['points'])} points before.</p>")
    if not data["katas_graded"] and data["status"] != "graded":
        head += ("<p>Its results are shown to its team while it is graded, and to everyone once graded (on a frozen "
                 "board, at the close).</p>")
    if not data["mine"] and not data["closed"]:
        head += "<p>The failing checks' sentences are shown to the team (and to everyone after the close).</p>"
    elif not data["closed"]:
        head += "<p>Level 4's checks read only passed or failed until the close, so the hidden models stay secret.</p>"
    body = head + "".join(kata_section(k, r) for k, r in data["katas_graded"].items())
    if data["status"] != "graded":
        body += "<script src='/static/submission.js'></script>"
    return page(f"Submission #{sid}", body)


@router.post("/submit")
async def submit_form(request: Request):
    """The upload form: the token in a field; on success the token is kept in a cookie (this site only)
    so the submission's page shows the team its sentences."""
    try:
        ack, token = await take_upload(request)
    except HTTPException as exc:
        return page("Submission refused", f"<p>{e(str(exc.detail))}</p><p><a href='/'>back</a></p>", exc.status_code,
                    exc.headers)
    request.app.state.queue.wake.set()
    response = RedirectResponse(f"/submissions/{ack['id']}", status_code=303)
    response.set_cookie("arena_token", token or "", httponly=True, samesite="strict")
    return response


def fingerprint(db) -> str:
    """Changes whenever the board does: a submission stored, a kata graded, the close or the closing time."""
    with db.session() as session:
        c = db.competition(session)
        counts = session.execute(select(func.count(Submission.id), func.sum(Submission.attempts),
                                        func.count(Submission.graded_at))).one()
        results = session.scalar(select(func.count(KataResult.id)))
        excluded = session.scalar(select(func.count(Submission.id)).where(Submission.excluded.is_not(None)))
        said = session.scalar(select(func.max(Announcement.id)))
        said = f"{said}-{session.scalar(select(func.count(SupersededResult.id)))}"  # a rejudging applied
        return (f"{counts[0]}-{counts[1]}-{counts[2]}-{results}-{bool(c and c.closed)}-{bool(c and is_closed(c))}"
                f"-{c and c.frozen_at and c.frozen_at.isoformat()}-{excluded}-{said}")


class BoardChanges:
    """One watcher of the board for the whole server: while anyone listens it reads the database's
    `fingerprint` once a tick and wakes every open event stream when it changes. Before, each stream read
    the database twice a second itself: 300 open boards made 600 queries a second and the board slowed past a
    second. Changes made by other servers on the same database show as well: the database is what is read."""

    TICK = 0.5

    def __init__(self, db):
        self.db = db
        self.current: str | None = None
        self.changed = asyncio.Event()  # set, and replaced, at each change
        self.listeners = 0
        self.reads = 0  # fingerprints read (tests/test_arena_servers.py counts them)

    async def read(self) -> str:
        self.reads += 1
        value = await run_in_threadpool(fingerprint, self.db)
        if value != self.current:
            self.current = value
            changed, self.changed = self.changed, asyncio.Event()
            changed.set()
        return value

    async def run(self, stopping) -> None:
        while not stopping.is_set():
            if self.listeners:
                try:
                    await self.read()
                except Exception:  # noqa: BLE001 - a database hiccup: the next tick reads again
                    pass
            await asyncio.sleep(self.TICK)


@router.get("/events")
async def events(request: Request):
    """Server-sent events: `board` with a fingerprint of the database's state whenever it changes (a
    submission stored, a kata graded, the close), a comment every 15 s; the stream ends after
    STREAM_SECONDS. Every stream waits on the server's one BoardChanges."""
    changes: BoardChanges = request.app.state.board_changes

    async def stream():
        started, last = time.monotonic(), None
        changes.listeners += 1
        try:
            yield "retry: 1000\n\n"
            if changes.current is None:
                await changes.read()
            while time.monotonic() - started < STREAM_SECONDS and not request.app.state.stopping.is_set():
                if changes.current != last:
                    last = changes.current
                    yield f"event: board\ndata: {last}\n\n"
                try:
                    await asyncio.wait_for(changes.changed.wait(), timeout=15)
                except TimeoutError:
                    yield ": still here\n\n"
                if await request.is_disconnected():
                    return
        finally:
            changes.listeners -= 1

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-store"})
