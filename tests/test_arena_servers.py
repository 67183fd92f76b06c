"""Several arena servers on one database, as a service that scales out runs them: each submission is graded
by one server at a time (a server takes over only what a dead server held: graders/arena/grading.py, the
lease), and a team's rate limit holds across servers (graders/arena/db.py, `lock_team`). Real server
processes on 127.0.0.1, one database between them: a SQLite file, and a real PostgreSQL server
(tests/postgres_support.py) where one can be started."""
from __future__ import annotations

import datetime
import sqlite3
import threading
import time

import pytest
from sqlalchemy import create_engine

from arena_support import Server, add_team, create, solution, sql, tar_of
from graders.arena.db import now
from postgres_support import Postgres

# The reference's 04_dce, except that graded by server "a" (its files staged under a/server-tmp/, the
# server's TMPDIR) it waits: a grading that lasts until that server is killed. Server "b" grades it at once.
HANGS_ON_A = solution("04_dce") + b'''

import time as _time

_eliminate = eliminate_dead_code


def eliminate_dead_code(gm):
    if "/a/server-tmp/" in __file__:
        _time.sleep(600)
    return _eliminate(gm)
'''


def as_datetime(value) -> datetime.datetime:
    """A lease_until read back: a datetime from PostgreSQL, a string from SQLite."""
    return value if isinstance(value, datetime.datetime) else datetime.datetime.fromisoformat(value)


@pytest.fixture
def servers(tmp_path):
    started: list[Server] = []

    def start(db: str, name: str, *args: str) -> Server:
        server = Server(db, tmp_path / name, *args)
        started.append(server)
        return server.start()

    yield start
    for server in started:  # passed or failed
        server.stop()


@pytest.fixture(scope="module")
def postgres():
    server = Postgres()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request, tmp_path, postgres) -> str:
    """A fresh database: a SQLite file, or a database on the module's PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'arena.db'}"
    if postgres.problem:
        pytest.skip(postgres.problem)
    return postgres.database()


def test_a_live_servers_grading_is_never_taken_over_and_a_dead_ones_is_taken_over_once(db, servers):
    create(db, "--kata", "04_dce", "--no-speed", "--rate", "5/600")
    team = add_team(db, "Otter")
    first = servers(db, "a", "--lease", "2")
    assert first.submit(team, tar_of([("04_dce/solution.py", HANGS_ON_A, "file")])).status == 201
    first.wait_for(lambda: sql(db, "select status from submission where id = 1")[0] == "running", 120,
                   "the first server claiming the submission")
    owner, claimed_until = sql(db, "select owner, lease_until from submission where id = 1")
    second = servers(db, "b", "--lease", "2")  # before: a starting server queued every running submission again
    # The first claim's lease has run out, and then the second server, looking for work once a second, has
    # looked three times more (before: a fixed 6 s from its start, most of it before the first lease ran out):
    # only the first server's renewals keep the submission its own.
    time.sleep(max(0.0, (as_datetime(claimed_until) - now()).total_seconds()) + 3)
    assert sql(db, "select status, attempts, owner from submission where id = 1") == ("running", 1, owner)
    assert as_datetime(sql(db, "select lease_until from submission where id = 1")[0]) > as_datetime(claimed_until)
    assert sql(db, "select count(*) from kata_result")[0] == 0

    first.kill()  # mid-grading: its lease runs out, and the second server takes the submission over
    second.wait_for(lambda: sql(db, "select status from submission where id = 1")[0] == "graded", 300,
                    "the second server grading what the first left")
    status, attempts, new_owner = sql(db, "select status, attempts, owner from submission where id = 1")
    assert (status, attempts) == ("graded", 2) and new_owner != owner
    assert sql(db, "select count(*) from kata_result")[0] == 1  # the one kata, once
    assert "stopped renewing its lease" in second.log.read_text()
    assert "stored already" not in first.log.read_text() + second.log.read_text()


def test_the_rate_limit_holds_across_servers(db, servers):
    """Uploads sent at once to two servers on one database: the team's limit (3) counts them all. Before, each
    server counted under a lock of its own process, and two servers let 4 or more through."""
    create(db, "--kata", "04_dce", "--rate", "3/600")
    team = add_team(db, "Heron")
    both = [servers(db, name, "--grading-threads", "0") for name in ("a", "b")]
    archive = tar_of([("04_dce/solution.py", solution("04_dce"), "file")])
    statuses: list[int] = []
    gate = threading.Barrier(12)

    def send(server: Server) -> None:
        gate.wait()
        statuses.append(server.submit(team, archive).status)

    senders = [threading.Thread(target=send, args=(both[n % 2],)) for n in range(12)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(120)
    assert sorted(statuses) == [201] * 3 + [429] * 9, statuses
    assert sql(db, "select count(*) from submission")[0] == 3


def test_a_database_made_before_the_leases_gets_their_columns(tmp_path):
    """A competition's database created by an earlier version keeps working: create_all makes only missing
    tables, so the columns added since (a submission's owner and lease) are added on opening."""
    from graders.arena.db import Database

    db_file = tmp_path / "old.db"
    with sqlite3.connect(db_file) as connection:
        connection.execute("create table submission (id integer primary key, team_id integer, created datetime, "
                           "status varchar(16), katas json, files_hash varchar(64), attempts integer, "
                           "total_points float, graded_at datetime)")
        connection.execute("insert into submission (id, team_id, status, katas, files_hash, attempts) "
                           "values (1, 1, 'running', '[]', 'x', 1)")
    Database(f"sqlite:///{db_file}")
    assert sql(f"sqlite:///{db_file}", "select status, owner, lease_until from submission where id = 1") == ("running", None, None)


def test_the_documented_postgresql_url_uses_the_driver_the_extra_installs():
    """docs/organisers.md: `uv sync --extra postgres`, then `--db postgresql://user@host/arena`. SQLAlchemy
    reads a plain postgresql:// URL with psycopg 3 (before, the docs named psycopg2, and the URL failed with
    "No module named 'psycopg'"); the extra installs exactly that driver."""
    import tomllib

    from graders.frame.catalogue import REPO_ROOT

    extra = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["postgres"]
    assert any(requirement.startswith("psycopg[binary]") for requirement in extra), extra
    assert "uv sync --extra postgres" in (REPO_ROOT / "docs" / "organisers.md").read_text()
    assert create_engine("postgresql://arena@127.0.0.1/arena").dialect.driver == "psycopg"


def test_three_hundred_open_boards_cost_one_database_read_a_tick(tmp_path):
    """Every open board holds an event stream (/events). One watcher per server reads the database once a
    tick and wakes them all (graders/arena/pages.py, BoardChanges): with 300 streams open for 3 s the server
    reads the board's fingerprint about 6 times, not 300 x 6 (before, each stream read it twice a second, and
    300 boards slowed the board past a second). A real uvicorn server on 127.0.0.1, real sockets; the count is
    read from the server's own watcher."""
    import socket

    import uvicorn

    from arena_support import free_port, http
    from graders.arena.app import make_app
    from graders.arena.db import Database
    from graders.arena.grading import NoGrader

    app = make_app(Database(f"sqlite:///{tmp_path / 'arena.db'}"), NoGrader(), grading_threads=0)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    streams: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 60
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        for _ in range(300):
            stream = socket.create_connection(("127.0.0.1", port), timeout=30)
            stream.sendall(b"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            streams.append(stream)
        for stream in streams:  # each is open and has had the board's state
            seen = b""
            while b"event: board" not in seen:
                chunk = stream.recv(4096)
                assert chunk, "a stream closed before its first event"
                seen += chunk
        changes = app.state.board_changes
        assert changes.listeners == 300
        before = changes.reads
        time.sleep(3)
        reads = changes.reads - before
        assert 2 <= reads <= 10, reads  # one read a tick (0.5 s) for all 300
        assert http(f"http://127.0.0.1:{port}/api/board").status in (200, 404)  # answered (no competition made)
    finally:
        for stream in streams:
            stream.close()
        server.should_exit = True
        thread.join(30)


def test_a_request_whose_headers_never_end_is_cut_off(tmp_path):
    """A client that opens a connection and sends a header line now and then, never the blank line that ends
    the headers (slowloris), is disconnected after the server's read time-out (`serve --read-timeout`); before,
    uvicorn held such a connection, and a socket of the server, for as long as the client liked. A request that
    completes on the same server is answered as ever."""
    import socket

    from arena_support import http

    db = f"sqlite:///{tmp_path / 'arena.db'}"
    create(db, "--kata", "04_dce")
    server = Server(db, tmp_path, "--grading-threads", "0", "--read-timeout", "1").start()
    try:
        slow = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        slow.sendall(b"GET /api/board HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        closed = False
        for n in range(20):  # a header line every half second: never idle, never done
            time.sleep(0.5)
            try:
                slow.sendall(f"X-Trickle-{n}: {n}\r\n".encode())
            except OSError:
                closed = True
                break
        if not closed:
            try:
                closed = slow.recv(100) == b""  # the server closed it
            except TimeoutError:  # 30 s and still open
                closed = False
        slow.close()
        assert closed, "the connection stayed open"
        assert http(server.url + "/api/board").status == 200
    finally:
        server.stop()
