"""Load: 20 teams submit 40 times at once (two submissions each, one kata, the speed level off). Every
submission is acknowledged while grading runs, stored, and graded exactly once, through the real grading
backend (the fleet on the server's own Dask cluster, two grading threads); the acknowledgement latency
(median, p95) and the time the queue took to drain are printed (run with -s to see them).

The claim is about the service, not about grading: one team submits the reference (two real gradings in
sandboxed workers, each several seconds, so grading is still running when the last submission is
acknowledged), the other nineteen the kata's shipped stub, which the fleet judges from its bytes at once
(graders/competition/fleet.py). So forty submissions go through the queue's claims, two threads at a time,
in about the time of two gradings; full gradings through the fleet are tested in tests/test_arena.py and
tests/test_fleet.py. (A team's tree is graded in a nursery of its own, a sandboxed Python importing torch,
about 5 s of CPU: a second team submitting the reference added more for nothing the claim needs. The graded
team sends the same file twice, so the same tree (graders/competition/nurseries.py): its two gradings share
one nursery; before, a tag told them apart and each started its own.)"""
from __future__ import annotations

import json
import sqlite3
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from arena_support import Server, create, http, solution, tar_of
from graders.frame.catalogue import REPO_ROOT

TEAMS, EACH, KATA, GRADED = 20, 2, "01_linear_relu", 1  # the first GRADED teams submit the reference

pytestmark = pytest.mark.timeout(600)


def stub() -> bytes:
    return (REPO_ROOT / "katas" / KATA / "solution.py").read_bytes()


def test_forty_submissions_at_once_are_acknowledged_stored_and_graded_once(tmp_path):
    db_file = tmp_path / "arena.db"
    db = f"sqlite:///{db_file}"
    organiser = create(db, "--kata", KATA, "--no-speed", "--rate", "5/600")
    server = Server(db, tmp_path, "--grading-threads", "2")
    try:
        server.start()
        tokens = [http(server.url + "/api/admin/teams", token=organiser, data=json.dumps({"name": f"team{n:02d}"}).encode(),
                       kind="application/json").json()["token"] for n in range(TEAMS)]
        jobs = [(token, tar_of([(f"{KATA}/solution.py", solution(KATA, f"team {n}") if n < GRADED else stub(), "file")]))
                for n, token in enumerate(tokens) for k in range(EACH)]
        start = threading.Barrier(len(jobs))

        def submit(job):
            token, archive = job
            start.wait()
            began = time.perf_counter()
            answer = server.submit(token, archive, timeout=120)
            return answer.status, answer.json(), time.perf_counter() - began, time.perf_counter()

        began = time.perf_counter()
        with ThreadPoolExecutor(len(jobs)) as pool:
            answers = list(pool.map(submit, jobs))
        acked = time.perf_counter()
        states = [s["status"] for s in server.get("/api/admin/submissions", token=organiser).json()]
        assert [status for status, *_ in answers] == [201] * len(jobs)
        ids = sorted(body["id"] for _, body, *_ in answers)
        assert ids == list(range(1, len(jobs) + 1))
        # acknowledged without waiting for grading: when the last acknowledgement came, the real gradings had
        # not all finished (each takes seconds in a sandboxed worker). Whether any had started by then is a
        # race (an upload is acknowledged in milliseconds now), so it is not asserted; the queue's draining is.
        assert states.count("graded") < len(jobs), states
        with sqlite3.connect(db_file) as connection:  # stored: the row and the file, before the answer
            assert connection.execute("select count(*) from submitted_file").fetchone()[0] == len(jobs)

        def drained():
            listed = server.get("/api/admin/submissions", token=organiser).json()
            return all(s["status"] == "graded" for s in listed) and listed

        listed = server.wait_for(drained, 500, "every submission graded", every=1)
        drain = time.perf_counter() - began
        with sqlite3.connect(db_file) as connection:
            per_submission = dict(connection.execute("select submission_id, count(*) from kata_result group by submission_id"))
        assert per_submission == {sid: 1 for sid in ids}  # graded exactly once
        assert [s["attempts"] for s in listed] == [1] * len(jobs)
        teams = {s["id"]: s["team"] for s in listed}
        expected = {f"team{n:02d}": 80.0 if n < GRADED else 0.0 for n in range(TEAMS)}  # the reference with L3 off; the stub
        assert {(teams[s["id"]], s["points"]) for s in listed} == set(expected.items())
        with sqlite3.connect(db_file) as connection:
            messages = dict(connection.execute("select submission_id, summary from kata_result"))
        assert all(("still the stub" in json.loads(messages[s["id"]])["message"]) == (expected[teams[s["id"]]] == 0.0)
                   for s in listed)
        latencies = sorted(seconds for _, _, seconds, _ in answers)
        p95 = latencies[max(0, round(0.95 * len(latencies)) - 1)]
        print(f"\nload: {len(jobs)} submissions from {TEAMS} teams at once, kata {KATA}, speed level off, "
              f"{GRADED * EACH} graded in sandboxes, 2 grading threads: acknowledgement latency median {statistics.median(latencies) * 1000:.0f} ms, "
              f"p95 {p95 * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms (all acknowledged {acked - began:.2f} s after "
              f"the start); the queue drained {drain:.0f} s after the start ({drain / len(jobs):.1f} s a submission).")
    finally:
        server.stop()
