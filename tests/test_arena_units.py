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
import time
import types

import pytest
from tabulate import tabulate

from graders.arena import grading, uploads
from graders.arena.db import Competition, Database, KataResult, Submission, SubmittedFile, Team
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
    def __init__(self, fail: bool = False):
        self.asked, self.fail = [], fail

    def grade(self, team, files, katas, seed, *, speed=True, on_result=None):
        self.asked.append(list(katas))
        if self.fail:
            raise RuntimeError("the cluster is gone")
        out = {}
        for kata in katas:
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


@pytest.mark.parametrize("name, kept", [("04_dce/solution.py", "04_dce/solution.py"), ("./04_dce//solution.py", "04_dce/solution.py"),
                                        ("conftest.py", None), ("04_dce/other.py", None)])
def test_paths_kept_or_ignored(name, kept):
    assert uploads.check_path(name) == kept


@pytest.mark.parametrize("name", ["/etc/passwd", "../04_dce/solution.py", "04_dce/../../x", "C:/x", "\\\\server\\x"])
def test_paths_refused(name):
    with pytest.raises(uploads.UploadRefused):
        uploads.check_path(name)


def two_members(zeros: int) -> bytes:
    from arena_support import solution, tar_of
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


def test_unpacking_stops_at_its_deadline(tmp_path):
    """With no byte budget to speak of, a 480 MiB gzip bomb (seconds to unpack whole) is refused when
    unpacking passes its time budget, not when it is unpacked."""
    from arena_support import bomb
    data = bomb(tmp_path / "bomb.tar.gz", "gzip", 480 << 20).read_bytes()
    started = time.perf_counter()
    with pytest.raises(uploads.UploadRefused, match="unpacking the archive took over 0.2 s") as refused:
        uploads.from_tar(data, ["04_dce"], max_bytes=1 << 40, max_seconds=0.2)
    assert refused.value.status == 413 and time.perf_counter() - started < 1.0


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
    from graders.arena.client import submit
    from graders.cli.score import parse_args

    monkeypatch.delenv("ARENA_TOKEN", raising=False)
    with pytest.raises(SystemExit):
        parse_args(["--submit", "http://127.0.0.1:1"])
    assert "--submit needs the team's token" in capsys.readouterr().err
    assert submit(f"http://127.0.0.1:{free_port()}", "token", tmp_path, timeout=5) == 1
    assert "Refused: cannot reach" in capsys.readouterr().err


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
