"""The grading backend and the grading queue.

A backend has the shape of the fleet's `Fleet` (graders/competition/fleet.py): `grade(team, files, katas,
seed, *, speed, on_result)` returns {kata: summary} and calls on_result(team, kata, summary) as each kata
finishes; `close()`. `make_grader` makes it: the fleet on the Dask cluster `--cluster` names, or on a
local cluster of its own (one machine, nothing to start). Solution code runs only in sandboxed grading
workers; this process never imports it.

The queue is the database: a thread takes the oldest queued submission (or one whose grading server
died; when none is waiting, a rejudging's submission: graders/arena/controls.py), grades the katas that have no result row yet and stores each result as it comes, so a server killed
mid-grading and started again grades each remaining kata once and no kata twice. Each server has an id of
its own; it claims a submission with a lease (`lease` seconds) that a thread renews while it grades. Another
server on the same database takes the submission over only when the lease has run out: never one a live
server is grading (before, a starting server re-queued every `running` submission, and two servers graded it).

May import: graders.frame, graders.isolation (the static scan), graders.batch, graders.competition, and
graders.arena.db.
"""
from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import threading
from datetime import timedelta
from pathlib import Path
from typing import Callable, Protocol

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError

from graders.arena.db import (Database, KataResult, RejudgedResult, RejudgeItem, Rejudging, Submission, SubmittedFile,
                              Team, now)
from graders.batch.summary import failed_grading
from graders.competition.organiser import apply_scan
from graders.isolation.scan import scan_source

log = logging.getLogger("arena")
OnResult = Callable[[str, str, dict], None]
MAX_ATTEMPTS = 3  # gradings of one submission that the backend may fail (raise) before its katas count as failed
LEASE = 15.0  # seconds a server's claim on a submission holds unless renewed (`serve --lease`)


class Grader(Protocol):
    def grade(self, team: str, files: dict[str, bytes], katas: list[str], seed: int, *, speed: bool = True,
              on_result: OnResult | None = None) -> dict[str, dict]: ...

    def close(self) -> None: ...


class FleetGrader:
    """The fleet (graders.competition.fleet.Fleet, a Dask client), imported only when used."""

    def __init__(self, address: str | None = None, *, device: str = "cpu", certificates: Path | None = None):
        from graders.competition.fleet import Fleet  # lazily: the fleet and Dask are needed only here

        self.fleet = Fleet(address, device=device, certificates=certificates)

    def grade(self, team, files, katas, seed, *, speed=True, on_result=None):
        return self.fleet.grade(team, files, katas, seed, speed=speed, on_result=on_result)

    def close(self) -> None:
        self.fleet.close()


class NoGrader:
    """The backend of a server that grades nothing (--grading-threads 0: it takes and stores submissions,
    another server grades them): no cluster, no zygote."""

    def grade(self, team, files, katas, seed, *, speed=True, on_result=None):
        raise RuntimeError("this server grades nothing (--grading-threads 0)")

    def close(self) -> None:
        pass


def make_grader(cluster: str | None, *, grades: bool = True, certificates: Path | None = None) -> Grader:
    """The grading backend: the fleet on the Dask cluster at `cluster` (tls://HOST:8786 with the fleet's
    `certificates`, or tcp://), or on a local cluster of its own when None; none when this server grades nothing."""
    return FleetGrader(cluster, certificates=certificates) if grades else NoGrader()


def stop_children() -> None:
    """Kill the process group of each child process that leads its own (run_katas starts each grading
    process in a session of its own), by id."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            pid = int(stat.parent.name)
            if int(fields[1]) == os.getpid() and int(fields[2]) == pid:
                os.killpg(pid, signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            pass


class GradingQueue:
    """Background threads that grade queued submissions, oldest first; `changed()` is called after every
    stored result (the pages' live updates follow the database, so they need nothing from here)."""

    def __init__(self, db: Database, grader: Grader, *, threads: int = 1, lease: float = LEASE):
        self.db, self.grader, self.threads, self.lease = db, grader, threads, lease
        self.owner = f"{socket.gethostname()[:40]}:{os.getpid()}:{secrets.token_hex(4)}"  # this server, this run
        self.wake, self.stopping = threading.Event(), threading.Event()
        self.workers: list[threading.Thread] = []
        self.claim_lock = threading.Lock()

    def start(self) -> None:
        if not self.threads:
            return  # a server that grades nothing claims nothing, and renews no lease
        for n in range(self.threads):
            worker = threading.Thread(target=self.loop, name=f"grading-{n}", daemon=True)
            worker.start()
            self.workers.append(worker)
        renewer = threading.Thread(target=self.renew_leases, name="leases", daemon=True)
        renewer.start()
        self.workers.append(renewer)

    def renew_leases(self) -> None:
        """Every third of the lease, extend the lease of every submission this server is grading."""
        while not self.stopping.wait(self.lease / 3):
            try:
                with self.db.session() as session:
                    for table in (Submission, RejudgeItem):
                        session.execute(update(table).where(table.owner == self.owner, table.status == "running")
                                        .values(lease_until=now() + timedelta(seconds=self.lease)))
            except Exception:  # noqa: BLE001 - a database hiccup: the next round tries again
                log.exception("renewing this server's leases failed")

    def stop(self, timeout: float = 5.0) -> None:
        """Stop grading: the grading processes this server started are killed and their submissions queued
        again (graded by the next server to claim them, from the first kata without a result)."""
        self.stopping.set()
        self.wake.set()
        stop_children()
        for worker in self.workers:
            worker.join(timeout)
        try:  # what this server was grading is queued again at once, for whichever server runs next
            with self.db.session() as session:
                for table in (Submission, RejudgeItem):
                    session.execute(update(table).where(table.owner == self.owner, table.status == "running")
                                    .values(status="queued", lease_until=None))
        except Exception:  # noqa: BLE001 - the database is gone too: the lease runs out instead
            log.exception("queueing this server's gradings again failed")
        self.grader.close()

    def claim(self, table=Submission) -> int | None:
        """The oldest row of `table` (a submission, or a rejudging's item) that is queued, or running under a
        lease that ran out (its server died), marked running as this server's with a fresh lease (atomically:
        one thread, one server claims it)."""
        with self.claim_lock, self.db.session() as session:
            moment = now()
            free = (table.status == "queued") | ((table.status == "running") & (
                table.lease_until.is_(None) | (table.lease_until < moment)))
            for row_id, status in session.execute(select(table.id, table.status).where(free).order_by(table.id).limit(5)):
                claimed = session.execute(update(table).where(table.id == row_id, free).values(
                    status="running", attempts=table.attempts + 1, owner=self.owner,
                    lease_until=moment + timedelta(seconds=self.lease))).rowcount
                if claimed:
                    if status == "running":
                        log.warning("%s %s: its grading server stopped renewing its lease; grading the rest",
                                    table.__tablename__, row_id)
                    return row_id
        return None

    def loop(self) -> None:
        """Submissions first, then rejudgings' items (graders/arena/controls.py), oldest first."""
        while not self.stopping.is_set():
            sid = self.claim()
            if sid is not None:
                try:
                    self.grade(sid)
                except Exception as exc:
                    log.exception("grading submission %s failed", sid)
                    self.failed(sid, exc)
                continue
            item = self.claim(RejudgeItem)
            if item is not None:
                try:
                    self.rejudge(item)
                except Exception:
                    log.exception("rejudging item %s failed", item)
                    self.rejudge_failed(item)
                continue
            self.wake.wait(1.0)
            self.wake.clear()

    def _inputs(self, session, sid: int) -> tuple[str, dict[str, bytes], int, bool]:
        submission = session.get(Submission, sid)
        files = {f.path: f.content for f in session.scalars(select(SubmittedFile).where(SubmittedFile.submission_id == sid))}
        competition = self.db.competition(session)
        return session.get(Team, submission.team_id).name, files, competition.seed, competition.speed

    def rejudge(self, item_id: int) -> None:
        """Grade a rejudging's item again with today's graders: its new verdicts go beside the board's
        (RejudgedResult) until the organiser applies or discards the rejudging."""
        with self.db.session() as session:
            item = session.get(RejudgeItem, item_id)
            rid, sid, katas = item.rejudging_id, item.submission_id, list(item.katas)
            team, files, seed, speed = self._inputs(session, sid)
            done = set(session.scalars(select(RejudgedResult.kata).where(RejudgedResult.rejudging_id == rid,
                                                                         RejudgedResult.submission_id == sid)))
        todo = [k for k in katas if k not in done]
        for kata in [k for k in todo if f"{k}/solution.py" not in files]:
            self.store(sid, kata, failed_grading("not submitted", f"no {kata}/solution.py in this submission"), rejudging=rid)
        todo = [k for k in todo if f"{k}/solution.py" in files]
        if todo:
            self.grader.grade(team, files, todo, seed, speed=speed,
                              on_result=lambda _team, kata, summary: self.store(sid, kata, summary, files, rejudging=rid))
        if not self.stopping.is_set():
            self._item_done(item_id, rid, sid, katas)

    def _item_done(self, item_id: int, rid: int, sid: int, katas: list[str]) -> None:
        with self.db.session() as session:
            have = set(session.scalars(select(RejudgedResult.kata).where(RejudgedResult.rejudging_id == rid,
                                                                         RejudgedResult.submission_id == sid)))
            session.execute(update(RejudgeItem).where(RejudgeItem.id == item_id).values(
                status="graded" if have >= set(katas) else "queued"))
            left = session.scalar(select(func.count(RejudgeItem.id)).where(RejudgeItem.rejudging_id == rid,
                                                                           RejudgeItem.status != "graded"))
            if not left:
                session.execute(update(Rejudging).where(Rejudging.id == rid, Rejudging.status == "queued")
                                .values(status="ready"))

    def rejudge_failed(self, item_id: int) -> None:
        """As `failed` for a submission: queued again up to MAX_ATTEMPTS, then its katas without a verdict fail."""
        with self.db.session() as session:
            item = session.get(RejudgeItem, item_id)
            rid, sid, katas, attempts = item.rejudging_id, item.submission_id, list(item.katas), item.attempts
            if attempts < MAX_ATTEMPTS:
                item.status = "queued"
                return
        for kata in katas:
            self.store(sid, kata, failed_grading("crashed", f"the grading backend failed {attempts} times"), rejudging=rid)
        self._item_done(item_id, rid, sid, katas)

    def grade(self, sid: int) -> None:
        with self.db.session() as session:
            team, files, seed, speed = self._inputs(session, sid)
            katas = list(session.get(Submission, sid).katas)
            done = set(session.scalars(select(KataResult.kata).where(KataResult.submission_id == sid)))
        missing = [k for k in katas if k not in done]
        absent = [k for k in missing if f"{k}/solution.py" not in files]
        for kata in absent:  # nothing uploaded for it: no grading needed
            self.store(sid, kata, failed_grading("not submitted", f"no {kata}/solution.py in this submission"))
        todo = [k for k in missing if k not in absent]
        if todo:
            self.grader.grade(team, files, todo, seed, speed=speed,
                              on_result=lambda _team, kata, summary: self.store(sid, kata, summary, files))
        if self.stopping.is_set():  # stopped mid-grading: left `running`, graded again at the next start
            return
        with self.db.session() as session:
            results = session.scalars(select(KataResult).where(KataResult.submission_id == sid)).all()
            if {r.kata for r in results} >= set(katas):
                session.execute(update(Submission).where(Submission.id == sid).values(
                    status="graded", graded_at=now(), total_points=sum(r.points for r in results)))
            else:  # the backend returned without some kata: queue it again rather than lose it
                session.execute(update(Submission).where(Submission.id == sid).values(status="queued"))

    def failed(self, sid: int, exc: Exception) -> None:
        """The backend raised: queue the submission again, up to MAX_ATTEMPTS gradings; then its katas
        without a result get a failed grading (points 0, the reason), so the queue never sticks on it."""
        with self.db.session() as session:
            submission = session.get(Submission, sid)
            attempts, katas = submission.attempts, list(submission.katas)
            done = set(session.scalars(select(KataResult.kata).where(KataResult.submission_id == sid)))
            if attempts < MAX_ATTEMPTS:
                submission.status = "queued"
                return
        for kata in katas:
            if kata not in done:
                self.store(sid, kata, failed_grading("crashed", f"the grading backend failed {attempts} times: {exc}"))
        with self.db.session() as session:
            results = session.scalars(select(KataResult).where(KataResult.submission_id == sid)).all()
            session.execute(update(Submission).where(Submission.id == sid).values(
                status="graded", graded_at=now(), total_points=sum(r.points for r in results)))

    def store(self, sid: int, kata: str, summary: dict, files: dict[str, bytes] | None = None, *,
              rejudging: int | None = None) -> None:
        """A kata's verdict, scanned, stored once: on the board, or beside it for a rejudging."""
        if self.stopping.is_set():  # a kata whose grading process this server just killed: not a verdict
            log.warning("submission %s kata %s: stopping, its result is not stored", sid, kata)
            return
        summary = dict(summary)
        source = (files or {}).get(f"{kata}/solution.py")
        if source is not None:  # the static scan reads the source as text; it never runs it
            apply_scan({kata: summary}, {kata: scan_source(source.decode(errors="replace"), f"{kata}/solution.py", kata)})
        try:
            with self.db.session() as session:
                points = float(summary.get("points", 0.0))
                session.add(KataResult(submission_id=sid, kata=kata, points=points, summary=summary) if rejudging is None
                            else RejudgedResult(rejudging_id=rejudging, submission_id=sid, kata=kata, points=points,
                                                summary=summary))
        except IntegrityError:  # stored already (a grading resumed after it was stored): never counted twice
            log.warning("submission %s kata %s: result stored already, kept the first", sid, kata)
