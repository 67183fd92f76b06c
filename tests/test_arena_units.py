"""The arena's parts in process, no server: the one switch between grading backends, the queue's resume
and retry against a fake backend, the uploads' path rules and unpacking budgets, the grading texts kept
valid UTF-8, and the graph picture."""
from __future__ import annotations

import bz2
import gzip
import json
import lzma
import sqlite3
import sys
import types

import pytest
from tabulate import tabulate

from arena_support import tar_of
from graders.arena import grading, uploads
from graders.arena.db import Competition, Database, KataResult, RejudgeItem, Submission, SubmittedFile, Team
from graders.arena.graphs import split_message, svg


def test_the_grading_backend_is_the_fleet(monkeypatch):
    """`serve` grades through the fleet: on the cluster --cluster names, or on a local cluster of its own.
    (A stand-in Fleet records how it was made; the real one is exercised by the server tests.)"""
    made = []
    fleet = types.ModuleType("graders.competition.fleet")
    fleet.Fleet = type("Fleet", (), {"__init__": lambda self, address=None, **kw: made.append((address, kw)),
                                     "close": lambda self: None})
    monkeypatch.setitem(sys.modules, "graders.competition.fleet", fleet)
    assert isinstance(grading.make_grader("tcp://10.0.0.5:8786"), grading.FleetGrader)
    assert isinstance(grading.make_grader(None), grading.FleetGrader)  # the fleet's own local cluster
    assert made == [("tcp://10.0.0.5:8786", {"device": "cpu", "certificates": None}),
                    (None, {"device": "cpu", "certificates": None})]
    # a server that grades nothing (--grading-threads 0) starts no fleet, and says so if asked to grade
    idle = grading.make_grader(None, grades=False)
    assert len(made) == 2 and not isinstance(idle, grading.FleetGrader)
    with pytest.raises(RuntimeError, match="grades nothing"):
        idle.grade("team", {}, ["04_dce"], 1)



class FakeGrader:
    """Grades each kata 50 points; with `fail`, raises; it returns without the katas in `skip`."""

    def __init__(self, fail: bool = False, skip: tuple = ()):
        self.asked, self.fail, self.skip = [], fail, set(skip)

    def grade(self, team, files, katas, seed, *, speed=True, on_result=None):
        self.asked.append(list(katas))
        if self.fail:
            raise RuntimeError("the cluster is gone")
        out = {}
        for kata in [k for k in katas if k not in self.skip]:
            out[kata] = {"status": "graded", "points": 50.0, "levels": {}, "message": "ok", "checks": []}
            on_result(team, kata, out[kata])
        return out

    def close(self):
        pass


def database(tmp_path, status="queued") -> Database:
    db = Database(f"sqlite:///{tmp_path / 'unit.db'}")
    with db.session() as session:
        session.add(Competition(katas=["01_linear_relu", "04_dce"], rate_limit=5, rate_window=60, speed=False, seed=7,
                                organiser_hash="x"))
        session.add(Team(id=1, name="T", token_hash="h"))
        session.flush()
        session.add(Submission(id=1, team_id=1, katas=["01_linear_relu", "04_dce"], files_hash="f", status=status))
        session.flush()
        session.add_all([SubmittedFile(submission_id=1, path=f"{k}/solution.py", content=b"x = 1")
                         for k in ("01_linear_relu", "04_dce")])
    return db


def test_an_interrupted_grading_resumes_with_the_katas_left(tmp_path):
    db = database(tmp_path, status="running")
    with db.session() as session:  # graded before the crash
        session.add(KataResult(submission_id=1, kata="01_linear_relu", points=20.0, summary={"points": 20.0}))
    fake = FakeGrader()
    queue = grading.GradingQueue(db, fake, threads=0)
    queue.start()  # re-queues what was running
    assert queue.claim() == 1 and queue.claim() is None
    queue.grade(1)
    assert fake.asked == [["04_dce"]]
    with db.session() as session:
        s = session.get(Submission, 1)
        assert (s.status, s.total_points, s.attempts) == ("graded", 70.0, 1)
    queue.store(1, "04_dce", {"points": 99.0})  # a duplicate result is never counted twice
    with db.session() as session:
        assert [r.points for r in session.query(KataResult).order_by(KataResult.kata)] == [20.0, 50.0]


def test_a_backend_that_raises_is_retried_then_recorded_as_failed(tmp_path):
    db = database(tmp_path)
    queue = grading.GradingQueue(db, FakeGrader(fail=True), threads=0)
    for attempt in range(grading.MAX_ATTEMPTS):
        sid = queue.claim()
        assert sid == 1, attempt
        with pytest.raises(RuntimeError):
            queue.grade(sid)
        queue.failed(sid, RuntimeError("the cluster is gone"))
    assert queue.claim() is None
    with db.session() as session:
        s = session.get(Submission, 1)
        assert (s.status, s.total_points) == ("graded", 0.0)
        assert {r.summary["status"] for r in session.query(KataResult)} == {"crashed"}


def test_an_upload_is_stored_only_while_the_competition_is_open(tmp_path):
    """An upload admitted while the competition was open is still refused if it closed while the upload was
    unpacked (the close's `arena.py close` and an upload's unpacking overlap): store_submission checks again, under
    the team's lock. Admission itself refuses once closed."""
    from fastapi import HTTPException

    from graders.arena.api import admit_upload, store_submission
    from graders.arena.db import token_hash

    db = database(tmp_path)
    with db.session() as session:
        session.get(Team, 1).token_hash = token_hash("team-token")
    files = {"04_dce/solution.py": b"x = 2"}
    upload, _ = admit_upload(db, "team-token")
    assert store_submission(db, upload, files)["id"] == 2  # open: stored
    upload, _ = admit_upload(db, "team-token")
    with db.session() as session:
        db.competition(session).closed = True  # what `arena.py close` does first
    with pytest.raises(HTTPException) as refused:
        store_submission(db, upload, files)
    assert refused.value.status_code == 403 and "closed" in refused.value.detail
    with pytest.raises(HTTPException) as refused:
        admit_upload(db, "team-token")
    assert refused.value.status_code == 403
    with db.session() as session:
        assert [s.id for s in session.query(Submission).order_by(Submission.id)] == [1, 2]


def test_until_the_close_the_latest_graded_submission_counts_and_at_the_close_the_last(tmp_path):
    """docs/organisers.md: a team's latest graded submission counts until the close, its last one at the close
    (graded or not yet)."""
    from graders.arena.board import counted, standings

    db = database(tmp_path, status="graded")
    with db.session() as session:
        session.add(Submission(id=2, team_id=1, katas=["04_dce"], files_hash="g", status="queued"))
    with db.session() as session:
        c = db.competition(session)
        assert {team: (s.id, last.id) for team, (s, last) in counted(session, c).items()} == {"T": (1, 2)}
        c.closed = True
        session.flush()
        assert {team: (s.id, last.id) for team, (s, last) in counted(session, c).items()} == {"T": (2, 2)}
        row, = standings(session, c)
        assert (row["submission"], row["grading"]) == (2, True)


def test_a_grading_that_returns_without_a_kata_is_queued_again_for_it(tmp_path):
    """A backend that returns without some kata's verdict leaves the submission queued, not graded on what came
    back: the next claim grades the missing kata alone."""
    db = database(tmp_path)
    fake = FakeGrader(skip=("04_dce",))
    queue = grading.GradingQueue(db, fake, threads=0)
    queue.grade(queue.claim())
    with db.session() as session:
        assert session.get(Submission, 1).status == "queued"
        assert [r.kata for r in session.query(KataResult)] == ["01_linear_relu"]
    fake.skip = set()
    queue.grade(queue.claim())
    assert fake.asked == [["01_linear_relu", "04_dce"], ["04_dce"]]
    with db.session() as session:
        assert (session.get(Submission, 1).status, session.get(Submission, 1).total_points) == ("graded", 100.0)


def test_a_rejudging_is_ready_only_once_every_kata_it_covers_has_a_new_verdict(tmp_path):
    from graders.arena.controls import rejudge, rejudging_of

    db = database(tmp_path, status="graded")
    with db.session() as session:
        session.add_all(KataResult(submission_id=1, kata=k, points=20.0, summary={"points": 20.0})
                        for k in ("01_linear_relu", "04_dce"))
    rid = rejudge(db)
    fake = FakeGrader(skip=("04_dce",))
    queue = grading.GradingQueue(db, fake, threads=0)
    queue.rejudge(queue.claim(RejudgeItem))
    assert rejudging_of(db, rid)["status"] == "queued" and rejudging_of(db, rid)["graded"] == 0
    fake.skip = set()
    queue.rejudge(queue.claim(RejudgeItem))
    shown = rejudging_of(db, rid)
    assert (shown["status"], shown["graded"]) == ("ready", 1)
    assert sorted((v["kata"], v["old"], v["new"]) for v in shown["verdicts"]) == [("01_linear_relu", 20.0, 50.0),
                                                                                  ("04_dce", 20.0, 50.0)]


def test_a_stored_verdict_carries_the_static_scan_of_its_source(tmp_path):
    """The service scans each kata's source as it stores the verdict, as organiser mode does: a finding
    disqualifies the kata (its points still shown); a clean source is left as graded."""
    db = database(tmp_path)
    queue = grading.GradingQueue(db, FakeGrader(), threads=0)
    for kata, source in [("04_dce", b"import subprocess\n"), ("01_linear_relu", b"x = 1\n")]:
        queue.store(1, kata, {"status": "graded", "points": 50.0, "message": "ok"}, {f"{kata}/solution.py": source})
    with db.session() as session:
        stored = {r.kata: r.summary for r in session.query(KataResult)}
    assert stored["04_dce"]["disqualified"].startswith("static scan: 04_dce/solution.py line 1: imports subprocess")
    assert stored["04_dce"]["points"] == 50.0
    assert "disqualified" not in stored["01_linear_relu"]


@pytest.mark.parametrize("name, kept", [("04_dce/solution.py", "04_dce/solution.py"), ("./04_dce//solution.py", "04_dce/solution.py"),
                                        ("conftest.py", None), ("04_dce/other.py", None)])
def test_paths_kept_or_ignored(name, kept):
    assert uploads.check_path(name) == kept


@pytest.mark.parametrize("name", ["/etc/passwd", "../04_dce/solution.py", "04_dce/../../x", "C:/x", "\\\\server\\x"])
def test_paths_refused(name):
    with pytest.raises(uploads.UploadRefused):
        uploads.check_path(name)


KATAS = ["04_dce"]
BIG = b"#" * (uploads.MAX_FILE_BYTES + 1)


@pytest.mark.parametrize("upload, refusal", [
    (lambda: uploads.from_tar(tar_of([(f"x{i}", None, "dir") for i in range(uploads.MAX_FILES + 1)]), KATAS),
     f"more than {uploads.MAX_FILES} archive members"),
    (lambda: uploads.from_tar(tar_of([("04_dce/solution.py", None, "fifo")]), KATAS), "is not a regular file"),
    # the member's size, refused from its header before anything of it is read: cut short after the header
    (lambda: uploads.from_tar(tar_of([("04_dce/solution.py", BIG, "file")])[:1024], KATAS), "bytes, over the"),
    (lambda: uploads.from_parts([(f"x{i}", b"x") for i in range(uploads.MAX_FILES + 1)], KATAS),
     f"more than {uploads.MAX_FILES} files"),
    (lambda: uploads.from_parts([("04_dce/solution.py", BIG)], KATAS), "bytes, over the"),
], ids=["archive members", "a FIFO member", "archive member's bytes", "form parts", "form file's bytes"])
def test_an_upload_over_a_cap_or_holding_no_regular_file_is_refused(upload, refusal):
    """Each cap of uploads.py on its own: the members of an archive, the parts of a form, one file's bytes in
    either; and an archive member that is neither a file nor a folder (a FIFO here, a device alike)."""
    with pytest.raises(uploads.UploadRefused, match=refusal):
        upload()


def two_members(zeros: int) -> bytes:
    from arena_support import solution
    return tar_of([("04_dce/zeros.bin", bytes(zeros), "file"), ("04_dce/solution.py", solution("04_dce"), "file")])


COMPRESS = {"plain": lambda b: b, "gzip": gzip.compress, "bzip2": bz2.compress, "xz": lzma.compress,
            # streams written one after another (pigz, pbzip2) read as one archive
            "gzip, two streams": lambda b: gzip.compress(b[:5000]) + gzip.compress(b[5000:]),
            "bzip2, two streams": lambda b: bz2.compress(b[:5000]) + bz2.compress(b[5000:])}


@pytest.mark.parametrize("compression", list(COMPRESS))
def test_an_archive_is_unpacked_as_it_streams_within_its_byte_budget(compression):
    """2 MiB of zeros before the solution: within a 4 MiB budget the solution is kept; with 1 MiB the
    upload is refused (413) the moment the unpacked bytes pass it."""
    data = COMPRESS[compression](two_members(2 << 20))
    assert list(uploads.from_tar(data, ["04_dce"], max_bytes=4 << 20)) == ["04_dce/solution.py"]
    with pytest.raises(uploads.UploadRefused, match="unpacks to over 1048576 bytes") as refused:
        uploads.from_tar(data, ["04_dce"], max_bytes=1 << 20)
    assert refused.value.status == 413
    assert uploads.MAX_UNPACKED_BYTES == uploads.MAX_FILES * uploads.MAX_FILE_BYTES  # the default: what may be stored


@pytest.mark.parametrize("compression", ["gzip", "bzip2", "xz"])
def test_a_stream_cut_short_is_refused(compression):
    data = COMPRESS[compression](two_members(1 << 16))
    with pytest.raises(uploads.UploadRefused, match="not a tar archive") as refused:
        uploads.from_tar(data[: len(data) // 2], ["04_dce"])
    assert refused.value.status == 400


def test_unpacking_stops_at_its_deadline(tmp_path, monkeypatch):
    """With no byte budget to speak of, a 480 MiB gzip bomb is refused when unpacking passes its time budget,
    not when it is unpacked: the clock here moves a millisecond each time it is read, so the deadline comes
    after 200 reads whatever the machine's load, and the bytes unpacked by then are counted (no wall clock)."""
    from arena_support import bomb
    data = bomb(tmp_path / "bomb.tar.gz", "gzip", 480 << 20).read_bytes()
    ticks, streams = iter(range(10**9)), []
    monkeypatch.setattr(uploads, "time", types.SimpleNamespace(monotonic=lambda: next(ticks) / 1000))
    unpacking = uploads.Unpacking
    monkeypatch.setattr(uploads, "Unpacking", type("Counted", (unpacking,), {
        "__init__": lambda self, *args: (streams.append(self), unpacking.__init__(self, *args))[1]}))
    with pytest.raises(uploads.UploadRefused, match="unpacking the archive took over 0.2 s") as refused:
        uploads.from_tar(data, ["04_dce"], max_bytes=1 << 40, max_seconds=0.2)
    assert refused.value.status == 413
    assert 0 < streams[0].total < 64 << 20, streams[0].total  # a few MiB of the 480 unpacked: stopped, not finished


def test_grading_texts_are_valid_utf8_as_stored_and_as_read(tmp_path):
    """A summary whose texts hold a lone surrogate (an exception's message) is stored with the surrogate
    as its escape; a row an older server stored with the surrogate itself reads back escaped too."""
    db = database(tmp_path)
    queue = grading.GradingQueue(db, FakeGrader(), threads=0)
    queue.store(1, "04_dce", {"points": 0.0, "message": "raised ValueError: bad \ud800 byte",
                              "checks": [{"check": "c\udcff", "message": "also \ud800"}]})
    with db.session() as session:
        summary = session.query(KataResult).one().summary
    assert summary["message"] == "raised ValueError: bad \\ud800 byte"
    assert summary["checks"] == [{"check": "c\\udcff", "message": "also \\ud800"}]
    with sqlite3.connect(tmp_path / "unit.db") as connection:
        stored = connection.execute("select summary from kata_result").fetchone()[0]
        assert json.loads(stored)["message"] == "raised ValueError: bad \\ud800 byte"  # the row itself
        connection.execute("insert into kata_result (submission_id, kata, points, summary, graded_at) values "
                           "(1, '01_linear_relu', 0, ?, datetime('now'))", (json.dumps({"message": "old \ud800"}),))
    with db.session() as session:
        old = session.query(KataResult).filter_by(kata="01_linear_relu").one().summary
    assert old == {"message": "old \\ud800"}


def test_a_graph_table_drawn_as_svg():
    rows = [["placeholder", "x", "x", "()", "{}"], ["call_module", "lin", "lin", "(x,)", "{}"],
            ["call_function", "relu", "<built-in method relu of type object at 0x1>", "(lin,)", "{}"],
            ["output", "output", "output", "(relu,)", "{}"]]
    table = tabulate(rows, headers=["opcode", "name", "target", "args", "kwargs"])  # as Graph.print_tabular
    message = (f"expected one fused module\n\nGraph before the pass:\n{table}\n\nGraph after the pass:\n"
               "opcode       name\n-----------  -----\nplaceholder  <x>")
    sentence, before, after = split_message(message)
    assert sentence == "expected one fused module"
    picture = svg(before, "before")
    assert picture.startswith("<svg") and picture.count("<rect") == 4 and "call_function: relu<" in picture
    assert picture.count("marker-end") == 3  # x -> lin -> relu -> output
    assert "<x>" not in svg(after, "after")


def test_score_submit_needs_a_token_and_says_when_the_arena_cannot_be_reached(monkeypatch, capsys, tmp_path):
    from arena_support import free_port
    from graders.cli.score import main, parse_args

    monkeypatch.delenv("ARENA_TOKEN", raising=False)
    with pytest.raises(SystemExit):
        parse_args(["--submit", "http://127.0.0.1:1"])
    assert "--submit needs the team's token" in capsys.readouterr().err
    # The client's clock: it moves only as the client sleeps, so the schedule is exact on any machine.
    from graders.arena import client
    clock, slept = [0.0], []
    monkeypatch.setattr(client, "time", types.SimpleNamespace(
        monotonic=lambda: clock[0], sleep=lambda s: (slept.append(s), clock.__setitem__(0, clock[0] + s))))
    attempts = []
    monkeypatch.setattr(client, "call_once", lambda url, *rest, real=client.call_once: (attempts.append(url),
                                                                                      real(url, *rest))[1])
    # through score.py's own flag, as a team types it
    assert main(["--submit", f"http://127.0.0.1:{free_port()}", "--token", "token", "--solutions", str(tmp_path),
                 "--retry-for", "1.5"]) == 1
    err = capsys.readouterr().err
    assert "trying again in 1s (for up to 1.5s in all)" in err and "Refused: cannot reach" in err
    assert "(tried again for 1.5s)" in err
    assert slept == [1.0, 0.5] and len(attempts) == 3  # a pause of 1 s, then the 0.5 s left, then it gives up


def test_score_submit_takes_an_http_refusal_at_once(capsys, tmp_path):
    """Only a connection error is tried again: a server that answers (401 here) is believed at once."""
    import http.server
    import threading

    from graders.arena.client import submit

    asked = []

    class Unauthorised(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"detail": "unknown token"}')

        def log_message(self, *args):
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Unauthorised) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        assert submit(f"http://127.0.0.1:{server.server_address[1]}", "token", tmp_path, retry_for=60) == 1
        server.shutdown()
    err = capsys.readouterr().err
    assert err == "Refused: 401: unknown token\n" and asked == ["/api/competition"]  # asked once, never again


def test_a_server_stopping_mid_grading_stores_no_verdict_from_the_processes_it_killed(tmp_path):
    db = database(tmp_path)
    queue = grading.GradingQueue(db, None, threads=0)

    class Stopped(FakeGrader):
        def grade(self, team, files, katas, seed, *, speed=True, on_result=None):
            on_result(team, katas[0], {"status": "graded", "points": 50.0, "checks": []})
            queue.stopping.set()  # the server stops; its grading processes are killed: they "crash"
            on_result(team, katas[1], {"status": "crashed", "points": 0.0, "checks": []})
            return {}

    queue.grader = Stopped()
    queue.grade(queue.claim())
    with db.session() as session:
        assert session.get(Submission, 1).status == "running"  # graded again at the next start
        assert [r.kata for r in session.query(KataResult)] == ["01_linear_relu"]


def test_a_grading_sentence_names_the_file_as_the_team_knows_it(tmp_path):
    """The fleet stages a team's file in its Dask worker's scratch space (graders/competition/nurseries.py)
    and the grading's sentences name it there; the arena stores NN_name/solution.py instead (and reads an
    older row the same way). Before: the machine's scratch path was on the team's page."""
    staged = "/tmp/dask-scratch-space/worker-3emr1rq1/fx-katas-team-uvho3yrb/01_linear_relu/solution.py"
    db = database(tmp_path)
    queue = grading.GradingQueue(db, FakeGrader(), threads=0)
    queue.store(1, "01_linear_relu", {"points": 0.0, "message": f"test_L1_pattern[fused_module]: {staged} does not "
                                      "compile: invalid syntax at line 1.",
                                      "checks": [{"message": f'importing {staged} raised NameError: x (File "{staged}", line 3)'},
                                                 {"message": "the nursery for /tmp/q/fx-katas-team-abc did not start"}]})
    with db.session() as session:
        summary = session.query(KataResult).one().summary
    assert summary["message"] == ("test_L1_pattern[fused_module]: 01_linear_relu/solution.py does not compile: "
                                  "invalid syntax at line 1.")
    assert [c["message"] for c in summary["checks"]] == [
        'importing 01_linear_relu/solution.py raised NameError: x (File "01_linear_relu/solution.py", line 3)',
        "the nursery for the team's folder did not start"]
    with sqlite3.connect(tmp_path / "unit.db") as connection:
        assert "fx-katas-team" not in connection.execute("select summary from kata_result").fetchone()[0]
        connection.execute("insert into kata_result (submission_id, kata, points, summary, graded_at) values "
                           "(1, '04_dce', 0, ?, datetime('now'))", (json.dumps({"message": f"{staged} is old"}),))
    with db.session() as session:
        assert session.query(KataResult).filter_by(kata="04_dce").one().summary == {"message": "01_linear_relu/solution.py is old"}


def test_team_add_normalises_names_and_refuses_look_alikes(tmp_path, capsys):
    """`arena.py team add` stores a name NFKC-normalised, without zero-width or other invisible characters,
    its whitespace collapsed; refuses control characters (NUL), and a name that reads like an existing
    team's (case, full-width letters, a zero-width space, a Cyrillic or Greek look-alike). Before: each was
    a new team that looked the same on the board."""
    from graders.arena import cli

    db = f"sqlite:///{tmp_path / 'names.db'}"
    assert cli.main(["create", "--db", db, "--kata", "04_dce"]) == 0
    assert cli.main(["team", "add", "--db", db, "  Alpha\u200b  Team ", "\uff22eta", "AC/DC"]) == 0
    out = capsys.readouterr().out
    assert "Team 'Alpha Team' added." in out and "Team 'Beta' added." in out and "Team 'AC/DC' added." in out
    twins = ["alpha team", "Alpha\u00a0Team", "\u0410lpha Team", "\u0391LPHA TEAM", "Alpha\u2060 Team", "BETA", "\u0392eta"]
    for twin in twins:
        assert cli.main(["team", "add", "--db", db, twin]) == 1, twin
        err = capsys.readouterr().err
        assert err.startswith(f"{twin!r} refused: a team named "), err
        assert ("exists already, and" in err and "reads the same" in err) or err.endswith("exists already.\n"), err
    for bad, why in [("nul\x00", "may not hold control characters (it holds U+0000)"), ("\u200b\u200d", "1 to 100 visible"),
                     ("..", "only dots"), ("x" * 101, "1 to 100 visible")]:
        assert cli.main(["team", "add", "--db", db, bad]) == 1
        assert why in capsys.readouterr().err, bad
    with sqlite3.connect(tmp_path / "names.db") as connection:
        assert sorted(n for (n,) in connection.execute("select name from team")) == ["AC/DC", "Alpha Team", "Beta"]


def test_the_database_url_is_printed_without_its_password(tmp_path, capsys, monkeypatch):
    """`create` and `serve` print the database URL with its password masked (SQLAlchemy's
    render_as_string(hide_password=True)). Before: the password in the clear, in the organiser's terminal
    and the server's log."""
    import uvicorn

    from graders.arena import cli

    secret = "postgresql://arena:hunter2@db.example:5432/arena"
    db = Database(f"sqlite:///{tmp_path / 'url.db'}")
    db.url = secret  # a SQLite file underneath: what is printed is what is asked about
    assert cli.create(db, cli.parse_args(["create", "--kata", "04_dce"])) == 0
    assert cli.create(db, cli.parse_args(["create", "--kata", "04_dce"])) == 1  # one competition a database
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: None)
    assert cli.serve(db, cli.parse_args(["serve", "--grading-threads", "0"])) == 0
    printed = capsys.readouterr()
    assert "hunter2" not in printed.out + printed.err
    assert "Created the competition in postgresql://arena:***@db.example:5432/arena" in printed.out
    assert "postgresql://arena:***@db.example:5432/arena holds a competition already" in printed.err
    assert "(database postgresql://arena:***@db.example:5432/arena)." in printed.out


def test_a_request_that_raised_is_answered_500_with_a_sentence_and_the_security_headers():
    """A handler that raises: the API answers JSON, a page an HTML page, both with the security headers
    (the middleware answers it itself, so the 500 has them too)."""
    import asyncio
    import logging

    from graders.arena.app import SecurityHeaders

    async def raises(scope, receive, send):
        raise RuntimeError("a bug")

    async def answer(path: str) -> list[dict]:
        sent = []

        async def send(message):
            sent.append(message)

        async def receive():
            return {"type": "http.request", "body": b""}

        await SecurityHeaders(raises)({"type": "http", "method": "GET", "path": path, "headers": []}, receive, send)
        return sent

    logging.getLogger("arena").disabled = True
    try:
        for path, kind, body in [("/api/board", b"application/json", b'{"detail":"the server failed on this request'),
                                 ("/", b"text/html; charset=utf-8", b"<p id='error'>the server failed on this request")]:
            start, content = asyncio.run(answer(path))
            headers = dict(start["headers"])
            assert start["status"] == 500 and headers[b"content-type"] == kind and body in content["body"], path
            assert headers[b"x-frame-options"] == b"DENY" and b"script-src 'self'" in headers[b"content-security-policy"]
    finally:
        logging.getLogger("arena").disabled = False


def test_no_token_starts_with_a_dash():
    """`score.py --submit URL --token TOKEN` as documented: argparse reads a value starting with '-' as an
    option ("expected one argument"), and token_urlsafe starts 1 token in 64 with one."""
    from graders.arena.db import new_token

    assert not any(new_token().startswith("-") for _ in range(2000))
