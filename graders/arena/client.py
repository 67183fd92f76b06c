"""The team's client: `uv run graders/score.py --submit URL --token TOKEN [--solutions DIR]` uploads the
tree's NN_name/solution.py files of the competition's katas (nothing else, never a link), prints the
submission's id, follows its grading kata by kata and ends with the team's points and rank. Standard
library only (urllib), so it needs nothing the learner's tools do not.

A server that cannot be reached (restarted, its network gone a moment) is tried again with exponential
back-off (1 s, 2 s, 4 s ... at most 16 s apart) for RETRY_SECONDS from the first failure, saying so each
time; an HTTP answer (401, 429...) is final at once. The upload itself is sent again only when the server
refused the connection (nothing was sent): a connection lost after the upload was sent may have stored
it, and a second one would spend the team's rate.

May import: graders.arena (uploads).
"""
from __future__ import annotations

import http.client
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from graders.arena.uploads import MAX_UPLOAD_BYTES, pack


RETRY_SECONDS = 60.0  # how long an unreachable server is tried again, from the first failure
MAX_PAUSE = 16.0


class Refused(Exception):
    pass


class Unreachable(Refused):
    """No HTTP answer: `sent` says whether the request may have reached the server."""

    def __init__(self, message: str, sent: bool):
        super().__init__(message)
        self.sent = sent


def call_once(url: str, token: str | None = None, data: bytes | None = None, kind: str | None = None) -> dict:
    request = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    if kind:
        request.add_header("Content-Type", kind)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read()).get("detail", exc.reason)
        except ValueError:
            detail = exc.reason
        wait = exc.headers.get("Retry-After")
        raise Refused(f"{exc.code}: {detail}" + (f" (Retry-After: {wait}s)" if wait else "")) from None
    except urllib.error.URLError as exc:
        raise Unreachable(f"cannot reach {url}: {exc.reason}", sent=not isinstance(exc.reason, ConnectionRefusedError)) from None
    except (ConnectionError, TimeoutError, http.client.HTTPException) as exc:  # the connection lost mid-answer
        raise Unreachable(f"cannot reach {url}: {exc or type(exc).__name__}", sent=True) from None


def call(url: str, token: str | None = None, data: bytes | None = None, kind: str | None = None, *,
         retry_for: float = RETRY_SECONDS) -> dict:
    """call_once, tried again while the server cannot be reached, for `retry_for` seconds (see the module's
    docstring); an upload only while nothing of it was sent."""
    deadline, pause = None, 1.0
    while True:
        try:
            return call_once(url, token, data, kind)
        except Unreachable as exc:
            if data is not None and exc.sent:
                raise Refused(f"{exc}; the upload was sent but not acknowledged, so it may be stored: see your "
                              "team's page before sending it again") from None
            deadline = deadline if deadline is not None else time.monotonic() + retry_for
            left = deadline - time.monotonic()
            if left <= 0:
                raise Refused(f"{exc} (tried again for {retry_for:g}s)") from None
            wait = min(pause, left)
            print(f"{exc}; trying again in {wait:.0f}s (for up to {retry_for:g}s in all)", file=sys.stderr, flush=True)
            time.sleep(wait)
            pause = min(2 * pause, MAX_PAUSE)


def describe(kata: str, result: dict) -> str:
    levels = result.get("levels") or {}
    parts = ", ".join(f"L{n} {p[0]:.0f}/{p[1]:.0f}" for n, p in sorted(levels.items()) if p and p[1])
    line = f"  {kata}: {result.get('points', 0.0):.1f} points" + (f" ({parts})" if parts else "")
    if result.get("message"):
        line += f": {result['message']}"
    return line


def submit(url: str, token: str, solutions: Path, timeout: float = 3600.0, poll: float = 1.0,
           retry_for: float = RETRY_SECONDS) -> int:
    base = url.rstrip("/")
    try:
        competition = call(f"{base}/api/competition", retry_for=retry_for)
        archive, paths = pack(solutions, competition["katas"])
        if not paths:
            print(f"{solutions} holds no NN_name/solution.py of this competition's katas "
                  f"({', '.join(competition['katas'])}).", file=sys.stderr)
            return 1
        if len(archive) > MAX_UPLOAD_BYTES:
            print(f"the upload would be {len(archive)} bytes, over the {MAX_UPLOAD_BYTES} allowed", file=sys.stderr)
            return 1
        ack = call(f"{base}/api/submissions", token, archive, "application/gzip", retry_for=retry_for)
        print(f"Submission {ack['id']} acknowledged for team {ack['team']}: {', '.join(ack['files'])}.", flush=True)
        print(f"Following its grading ({base}/submissions/{ack['id']}):", flush=True)
        shown: set[str] = set()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = call(f"{base}/api/submissions/{ack['id']}", token, retry_for=retry_for)
            for kata, result in state["katas_graded"].items():
                if kata not in shown:
                    shown.add(kata)
                    print(describe(kata, result), flush=True)
            if state["status"] == "graded":
                print(f"Submission {ack['id']}: {state['total_points']:.1f} points. Team {state['team']}: "
                      f"{state['team_points']:.1f} points, rank {state['rank']} of {state['of']}.", flush=True)
                return 0
            time.sleep(poll)
        print(f"Submission {ack['id']} is still being graded after {timeout:g}s; its page: {base}/submissions/{ack['id']}",
              file=sys.stderr)
        return 1
    except Refused as exc:
        print(f"Refused: {exc}", file=sys.stderr)
        return 1
