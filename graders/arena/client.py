"""The team's client: `uv run graders/score.py --submit URL --token TOKEN [--solutions DIR]` uploads the
tree's NN_name/solution.py files of the competition's katas (nothing else, never a link), prints the
submission's id, follows its grading kata by kata and ends with the team's points and rank. Standard
library only (urllib), so it needs nothing the learner's tools do not.

May import: graders.arena (uploads).
"""
from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from graders.arena.uploads import MAX_UPLOAD_BYTES, pack


class Refused(Exception):
    pass


def call(url: str, token: str | None = None, data: bytes | None = None, kind: str | None = None) -> dict:
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
        raise Refused(f"cannot reach {url}: {exc.reason}") from None


def describe(kata: str, result: dict) -> str:
    levels = result.get("levels") or {}
    parts = ", ".join(f"L{n} {p[0]:.0f}/{p[1]:.0f}" for n, p in sorted(levels.items()) if p and p[1])
    line = f"  {kata}: {result.get('points', 0.0):.1f} points" + (f" ({parts})" if parts else "")
    if result.get("message"):
        line += f": {result['message']}"
    return line


def submit(url: str, token: str, solutions: Path, timeout: float = 3600.0, poll: float = 1.0) -> int:
    base = url.rstrip("/")
    try:
        competition = call(f"{base}/api/competition")
        archive, paths = pack(solutions, competition["katas"])
        if not paths:
            print(f"{solutions} holds no NN_name/solution.py of this competition's katas "
                  f"({', '.join(competition['katas'])}).", file=sys.stderr)
            return 1
        if len(archive) > MAX_UPLOAD_BYTES:
            print(f"the upload would be {len(archive)} bytes, over the {MAX_UPLOAD_BYTES} allowed", file=sys.stderr)
            return 1
        ack = call(f"{base}/api/submissions", token, archive, "application/gzip")
        print(f"Submission {ack['id']} acknowledged for team {ack['team']}: {', '.join(ack['files'])}.", flush=True)
        print(f"Following its grading ({base}/submissions/{ack['id']}):", flush=True)
        shown: set[str] = set()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = call(f"{base}/api/submissions/{ack['id']}", token)
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
