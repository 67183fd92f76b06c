"""The arena.py commands (graders/arena.py is the entry point); each takes --db URL.

    uv run graders/arena.py create --kata 03_conv_bn --kata 04_dce --closes 2026-12-01T18:00 --rate 5/600
    uv run graders/arena.py team add "Team A" "Team B" # prints each team's token, once
    uv run graders/arena.py serve [--host 127.0.0.1] [--port 8000] [--cluster tls://HOST:8786 --certificates DIR] [--read-timeout S]
    uv run graders/arena.py freeze [--at TIME]        # the public board stops moving (unfreeze; the close reveals)
    uv run graders/arena.py exclude ID --reason TEXT  # a submission counts for nothing (include ID takes it back)
    uv run graders/arena.py announce TEXT             # a message to every team, on the board (log: every control)
    uv run graders/arena.py rejudge [--kata K] [--team T] [--submission ID]   # then: rejudging show|apply|discard ID
    uv run graders/arena.py close                     # no more submissions; exports results/, LEADERBOARD.md, the seed

May import: graders.frame, graders.arena (db, grading, app, board, controls).
"""
from __future__ import annotations

import argparse
import datetime
import logging
import random
import sys
import time
from pathlib import Path

from sqlalchemy import func, select

from graders.arena.db import (DEFAULT_DB, Competition, Database, NameRefused, Submission, new_token, token_hash,
                              utc_moment)
from graders.frame.catalogue import KATAS, REPO_ROOT


def rate(text: str) -> tuple[int, float]:
    count, _, seconds = text.partition("/")
    try:
        parsed = int(count), float(seconds or 3600)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--rate {text!r}: N/SECONDS, e.g. 5/600") from None
    if parsed[0] < 1 or parsed[1] <= 0:
        raise argparse.ArgumentTypeError("--rate: at least 1 submission per a positive number of seconds")
    return parsed


def moment(text: str) -> datetime.datetime:
    try:
        return utc_moment(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--closes {text!r}: a time such as 2026-12-01T18:00 (UTC)") from None


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="arena.py", description="Live competitions: submissions, grading, live board.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", default=DEFAULT_DB, metavar="URL",
                        help=f"SQLAlchemy database URL (default {DEFAULT_DB}; PostgreSQL: postgresql://...)")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", parents=[common], help="the web service: live board at /, team API at /api/")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--cluster", metavar="ADDRESS",
                       help="grade on this Dask cluster (tls://HOST:8786 with --certificates, or tcp:// unencrypted; "
                            "default: a local cluster of the fleet's own)")
    serve.add_argument("--certificates", type=Path, metavar="DIR",
                       help="the fleet's certificates for a tls:// --cluster (score.py --make-certificates DIR)")
    serve.add_argument("--grading-threads", type=int, default=1, metavar="N",
                       help="submissions graded at once (default 1)")
    serve.add_argument("--read-timeout", type=float, default=10.0, metavar="S",
                       help="an upload whose body stalls this many seconds is cut off with 408, and a connection "
                            "whose request line and headers take longer is closed (default 10)")
    serve.add_argument("--lease", type=float, default=15.0, metavar="S",
                       help="a server's claim on the submission it grades lasts S seconds unless renewed; another "
                            "server on the same database takes over a submission only when its lease runs out (default 15)")
    create = commands.add_parser("create", parents=[common], help="create the competition; prints the organiser's token")
    create.add_argument("--kata", action="append", choices=list(KATAS), metavar="KATA", help="a kata (repeatable; default all)")
    create.add_argument("--closes", type=moment, metavar="TIME", help="closing time, UTC (e.g. 2026-12-01T18:00); "
                        "submissions stop then, `close` exports")
    create.add_argument("--rate", type=rate, default=(10, 3600.0), metavar="N/SECONDS",
                        help="at most N submissions per team in any SECONDS (default 10/3600)")
    create.add_argument("--no-speed", action="store_true", help="grade without the speed level (L3)")
    team = commands.add_parser("team", help="teams")
    team_commands = team.add_subparsers(dest="team_command", required=True)
    add = team_commands.add_parser("add", parents=[common], help="add teams; prints each one's token once (only a hash is kept)")
    add.add_argument("name", nargs="+", help="a team's name (several: one team each)")
    freeze = commands.add_parser("freeze", parents=[common], help="freeze the public board (teams still see their own "
                                 "results; the organiser's board stays live; the close reveals)")
    freeze.add_argument("--at", type=moment, metavar="TIME", help="from this time, UTC (default now)")
    commands.add_parser("unfreeze", parents=[common], help="let the public board move again")
    exclude = commands.add_parser("exclude", parents=[common], help="disqualify or ignore a submission: it counts for nothing")
    exclude.add_argument("submission", type=int, metavar="ID")
    exclude.add_argument("--reason", required=True, help="why (shown to the submission's team and logged)")
    include = commands.add_parser("include", parents=[common], help="take a submission's exclusion back")
    include.add_argument("submission", type=int, metavar="ID")
    announce = commands.add_parser("announce", parents=[common], help="a message to every team, on the board")
    announce.add_argument("text")
    commands.add_parser("log", parents=[common], help="every control the organiser applied, oldest first")
    rejudge = commands.add_parser("rejudge", parents=[common], help="grade a set again (every filter given must "
                                  "match; none: every graded submission); nothing changes until `rejudging apply`")
    rejudge.add_argument("--submission", type=int, action="append", default=[], metavar="ID")
    rejudge.add_argument("--kata", action="append", default=[], metavar="KATA")
    rejudge.add_argument("--team", action="append", default=[], metavar="NAME")
    rejudging = commands.add_parser("rejudging", parents=[common], help="a rejudging's old and new verdicts side by "
                                    "side (show), or apply or discard it")
    rejudging.add_argument("action", choices=["show", "apply", "discard"])
    rejudging.add_argument("rejudging", type=int, metavar="ID")
    close = commands.add_parser("close", parents=[common], help="close: export results/ and LEADERBOARD.md, publish the seed")
    close.add_argument("--results-dir", type=Path, default=REPO_ROOT / "results")
    close.add_argument("--leaderboard", type=Path, default=REPO_ROOT / "LEADERBOARD.md")
    close.add_argument("--wait", type=float, default=3600.0, metavar="S",
                       help="seconds to wait for gradings still queued or running (default 3600)")
    return parser.parse_args(argv)


def create(db: Database, args) -> int:
    with db.session() as session:
        if db.competition(session) is not None:
            print(f"{db.shown_url} holds a competition already; use another --db for a new one.", file=sys.stderr)
            return 1
        token = new_token()
        katas = args.kata or list(KATAS)
        session.add(Competition(katas=katas, closes_at=args.closes, rate_limit=args.rate[0], rate_window=args.rate[1],
                                speed=not args.no_speed, seed=random.SystemRandom().randrange(2**31),
                                organiser_hash=token_hash(token)))
    print(f"Created the competition in {db.shown_url}: katas {', '.join(katas)}; "
          f"{'closes ' + args.closes.isoformat() + ' UTC' if args.closes else 'open until `arena.py close`'}; "
          f"at most {args.rate[0]} submissions per team per {args.rate[1]:g}s; the secret seed is kept in the database.")
    print(f"Organiser token (shown once; only its hash is kept): {token}")
    return 0


def add_team(db: Database, text: str) -> int:
    """The name is stored normalised (db.team_name) and refused when it reads like an existing team's."""
    with db.session() as session:
        if db.competition(session) is None:
            print("no competition yet: run `arena.py create` first", file=sys.stderr)
            return 1
    try:
        name, token = db.add_team(text)
    except NameRefused as refused:
        print(f"{text!r} refused: {refused}.", file=sys.stderr)
        return 1
    print(f"Team {name!r} added. Its token (shown once; only its hash is kept): {token}")
    return 0


def close(db: Database, args) -> int:
    from graders.arena.board import export  # torch (for the run records' version) only here

    with db.session() as session:
        competition = db.competition(session)
        if competition is None:
            print("no competition in this database", file=sys.stderr)
            return 1
        competition.closed = True
    print("Closed: no more submissions. Each team's last submission counts.", flush=True)
    deadline, said = time.monotonic() + args.wait, None
    while True:
        with db.session() as session:
            pending = session.scalar(select(func.count(Submission.id)).where(Submission.status != "graded"))
        if not pending:
            break
        if time.monotonic() > deadline:
            print(f"{pending} submission(s) still queued or running after {args.wait:g}s: is `arena.py serve` running? "
                  "Run `arena.py close` again once they are graded.", file=sys.stderr)
            return 1
        if pending != said:
            print(f"waiting for {pending} grading(s) to finish...", flush=True)
            said = pending
        time.sleep(1.0)
    with db.session() as session:
        competition = db.competition(session)
        stored = export(session, competition, args.results_dir, args.leaderboard)
        seed = competition.seed
    for path in stored:
        print(f"Stored {path}.")
    print(f"Wrote {args.leaderboard}.")
    print(f"The seed was {seed}: teams reproduce their hidden models with `score.py --seed {seed}`.")
    return 0


def serve(db: Database, args) -> int:
    import uvicorn

    from graders.arena.app import make_app
    from graders.arena.grading import make_grader

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    app = make_app(db, make_grader(args.cluster, grades=args.grading_threads > 0, certificates=args.certificates),
                   grading_threads=args.grading_threads, read_timeout=args.read_timeout, lease=args.lease)
    print(f"Serving the board at http://{args.host}:{args.port}/ (database {db.shown_url}).", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=3,
                http=headers_within(args.read_timeout))
    return 0


def headers_within(seconds: float):
    """uvicorn's HTTP/1.1 protocol (h11), except that a request's line and headers must arrive within `seconds`
    of the connection (or of the previous response): uvicorn times only an idle keep-alive connection, so a
    client that sends a header line now and then held its connection, and a socket of the server, forever."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeadersWithin(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._expect_request()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._expect_request()

        def _expect_request(self) -> None:
            waiting_since = self.cycle  # a request read after this replaces the cycle

            def late() -> None:
                if self.cycle is waiting_since and not self.transport.is_closing():
                    self.transport.close()

            self.loop.call_later(seconds, late)

    return HeadersWithin


def main(argv=None) -> int:
    args = parse_args(argv)
    db = Database(args.db)
    if args.command == "serve":
        return serve(db, args)
    if args.command == "create":
        return create(db, args)
    if args.command == "team":
        return max(add_team(db, name) for name in args.name)
    if args.command in CONTROLS:
        return control(db, args)
    return close(db, args)


CONTROLS = ("freeze", "unfreeze", "exclude", "include", "announce", "log", "rejudge", "rejudging")


def control(db: Database, args) -> int:
    """The organiser's controls (graders/arena/controls.py), on the database: a running server follows."""
    from fastapi import HTTPException

    from graders.arena import controls

    try:
        if args.command == "freeze":
            print(f"The public board is frozen from {controls.freeze(db, args.at).isoformat(timespec='seconds')} UTC.")
        elif args.command == "unfreeze":
            controls.unfreeze(db)
            print("The public board moves again.")
        elif args.command == "exclude":
            controls.exclude(db, args.submission, args.reason)
            print(f"Submission #{args.submission} is excluded: it counts for nothing.")
        elif args.command == "include":
            controls.include(db, args.submission)
            print(f"Submission #{args.submission} counts again.")
        elif args.command == "announce":
            print(f"Announcement #{controls.announce(db, args.text)} is on the board.")
        elif args.command == "rejudge":
            rid = controls.rejudge(db, submissions=args.submission, katas=args.kata, teams=args.team)
            print(f"Rejudging #{rid} is queued: the servers grade it when no submission waits; "
                  f"`arena.py rejudging show {rid}` compares, then apply or discard it.")
        elif args.command == "rejudging":
            if args.action == "apply":
                print(f"Rejudging #{args.rejudging} applied: {controls.apply_rejudging(db, args.rejudging)} verdict(s) changed.")
            elif args.action == "discard":
                controls.discard_rejudging(db, args.rejudging)
                print(f"Rejudging #{args.rejudging} discarded: the board keeps its verdicts.")
            else:
                shown = controls.rejudging_of(db, args.rejudging)
                print(f"Rejudging #{shown['id']} ({shown['scope']}): {shown['status']}, "
                      f"{shown['graded']}/{shown['submissions']} submissions graded.")
                for v in shown["verdicts"]:
                    mark = "changed" if v["changed"] else ""
                    print(f"  #{v['submission']} {v['team']} {v['kata']}: {v['old']} -> {v['new']} {mark}".rstrip())
        else:
            for entry in controls.log(db):
                print(f"{entry['at']}  {entry['action']:<10} {entry['target'] or ''}  {entry['reason'] or ''}".rstrip())
    except (controls.ControlRefused, HTTPException) as refused:
        print(f"Refused: {getattr(refused, 'detail', refused)}.", file=sys.stderr)
        return 1
    return 0
