"""The live competition service against a real server (uvicorn in a subprocess on 127.0.0.1) and a real
SQLite file: the organiser's commands, teams submitting through `score.py --submit`, the pages and the
API, the close; a server killed mid-grading and started again; and each security case on its own."""
from __future__ import annotations

import html
import itertools
import json
import socket
import sqlite3
import threading
import time
import urllib.request

import pytest

from arena_support import (NO_OP_01, Server, add_team, add_teams, arena, bomb, create, free_port, http, multipart,
                           score_submit, solution, sql, tar_of, tree)
from graders.competition.store import load_runs
from graders.frame.catalogue import REPO_ROOT
from postgres_support import Postgres

pytestmark = pytest.mark.timeout(900)

LONE_SURROGATE = r"a lone surrogate: \ud800 in the message"  # as it reads once stored: its escape
RAISES_01 = NO_OP_01.replace("return gm  # no rewrite at all", 'raise ValueError("a lone surrogate: \\ud800 in the message")')


@pytest.fixture
def running(tmp_path):
    servers = []

    def start(db: str, *args: str) -> Server:
        server = Server(db, tmp_path, *args)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:  # passed or failed
        server.stop()


def test_create_teams_submit_through_the_cli_read_results_and_close(tmp_path, running):
    db = f"sqlite:///{tmp_path / 'arena.db'}"
    organiser = create(db, "--kata", "01_linear_relu", "--no-speed", "--rate", "5/600")
    alpha, beta, gamma = add_teams(db, "Alpha", "Beta", "Gamma")
    server = running(db)

    done = score_submit(server.url, alpha, tree(tmp_path / "alpha", {
        "01_linear_relu/solution.py": solution("01_linear_relu"), "conftest.py": b"raise SystemExit"}))
    assert done.returncode == 0, done.stderr
    assert "Submission 1 acknowledged for team Alpha: 01_linear_relu/solution.py." in done.stdout
    assert "  01_linear_relu: 80.0 points (L1 20/20, L2 40/40, L3 0/20, L4 20/20)" in done.stdout  # L3 off
    assert "Team Alpha: 80.0 points, rank 1 of 1." in done.stdout

    done = score_submit(server.url, beta, tree(tmp_path / "beta", {"01_linear_relu/solution.py": NO_OP_01.encode()}))
    assert done.returncode == 0, done.stderr
    assert "Submission 2 acknowledged for team Beta" in done.stdout and "rank 2 of 2." in done.stdout

    board = server.get("/api/board").json()
    assert [(r["rank"], r["team"]) for r in board["rows"]] == [(1, "Alpha"), (2, "Beta")]
    assert board["rows"][0]["katas"] == {"01_linear_relu": 80.0}
    assert [r["team"] for r in server.get("/api/katas/01_linear_relu").json()["rows"]] == ["Alpha", "Beta"]
    history = server.get("/api/teams/Beta").json()["submissions"]
    assert [(s["id"], s["status"]) for s in history] == [(2, "graded")]

    # A pass whose exception's message holds a lone surrogate: its texts are stored and served as UTF-8,
    # the surrogate as its escape (before: 500 for its page and API, and `score.py --submit` said 'Refused: 500').
    done = score_submit(server.url, gamma, tree(tmp_path / "gamma", {"01_linear_relu/solution.py": RAISES_01.encode()}))
    assert done.returncode == 0, done.stderr
    assert "Submission 3 acknowledged for team Gamma" in done.stdout and LONE_SURROGATE in done.stdout
    for token in (gamma, organiser):
        shown = server.get("/api/submissions/3", token=token)
        assert shown.status == 200 and LONE_SURROGATE in shown.json()["katas_graded"]["01_linear_relu"]["message"]
        page = server.get("/submissions/3", token=token)
        assert page.status == 200 and LONE_SURROGATE in page.body.decode("utf-8")

    mine = server.get("/submissions/2", token=beta).text  # its team reads the sentence and sees the graphs
    assert "first failing check: L1" in mine and "after fuse_linear_relu" in mine
    assert mine.count("<svg") == 2 and "graph before the pass" in mine
    public = server.get("/submissions/2").text
    assert "L1 pattern" in public and "after fuse_linear_relu" not in public
    assert server.get("/api/submissions/2", token=beta).json()["katas_graded"]["01_linear_relu"]["levels"]["1"][0] < 20
    for page in ("/", "/katas/01_linear_relu", "/teams/Alpha", "/submissions/1"):
        assert server.get(page).status == 200, page

    closed = arena("close", "--db", db, "--results-dir", str(tmp_path / "results"),
                   "--leaderboard", str(tmp_path / "LEADERBOARD.md")).stdout
    seed = int(closed.split("The seed was ")[1].split(":")[0])
    assert server.get("/api/competition").json()["seed"] == seed
    runs, problems = load_runs(tmp_path / "results")
    points = {r["team"]: r["total_points"] for r in runs}
    assert not problems and sorted((r["team"], r["seed"]) for r in runs) == [("Alpha", seed), ("Beta", seed), ("Gamma", seed)]
    assert points["Alpha"] == 80.0
    board_md = (tmp_path / "LEADERBOARD.md").read_text()
    assert board_md.index("| 1      | Alpha") < board_md.index("| 2      | Beta")
    assert "after fuse_linear_relu" in server.get("/submissions/2").text  # everyone reads it after the close
    assert LONE_SURROGATE in server.get("/api/submissions/3").json()["katas_graded"]["01_linear_relu"]["message"]
    assert LONE_SURROGATE in server.get("/submissions/3").body.decode("utf-8")
    refused = server.submit(alpha, tar_of([("01_linear_relu/solution.py", solution("01_linear_relu"), "file")]))
    assert refused.status == 403 and "closed" in refused.text


def count(db_file, sql: str, *args):
    with sqlite3.connect(db_file) as connection:
        return connection.execute(sql, args).fetchone()[0]


def test_a_server_killed_mid_grading_resumes_without_losing_or_counting_twice(tmp_path, running):
    """Submission 1 holds two katas: 04_dce (the reference, graded in a sandbox: seconds) and 01_linear_relu's
    shipped stub (judged from its bytes as the grading starts: graders/competition/fleet.py). So the server is
    killed when one of the submission's katas is stored and the other is being graded, every time (before,
    both were real gradings, one graded before the kill, and the kill came after seconds of grading); the
    second submission, the same files again, waits behind it. The server started again grades what is left:
    04_dce of the first (not the stub again) and the second, none lost and none twice. (The same files are
    the same tree: the second's grading finds the team's nursery started, graders/competition/nurseries.py.)"""
    db_file = tmp_path / "arena.db"
    db = f"sqlite:///{db_file}"
    create(db, "--kata", "04_dce", "--kata", "01_linear_relu", "--no-speed", "--rate", "5/600")
    team = add_team(db, "Phoenix")
    server = running(db, "--lease", "3")
    both = tar_of([("04_dce/solution.py", solution("04_dce"), "file"),
                   ("01_linear_relu/solution.py", (REPO_ROOT / "katas" / "01_linear_relu" / "solution.py").read_bytes(), "file")])
    first, second = server.submit(team, both), server.submit(team, both)
    assert (first.status, second.status) == (201, 201)
    server.wait_for(lambda: server.get("/api/submissions/1", token=team).json()["graded"] >= 1, 300, "the stub judged")
    server.kill()
    assert count(db_file, "select status from submission where id = 1") == "running"  # 04_dce unfinished
    assert count(db_file, "select count(*) from kata_result where submission_id = 1") == 1
    assert count(db_file, "select kata from kata_result where submission_id = 1") == "01_linear_relu"
    assert count(db_file, "select status from submission where id = 2") == "queued"

    server.start()  # a server of its own: what the killed one held is free once its lease (3 s) runs out
    server.wait_for(lambda: all(server.get(f"/api/submissions/{n}", token=team).json()["status"] == "graded"
                                for n in (1, 2)), 600, "both graded")
    assert count(db_file, "select count(*) from submission") == 2
    assert count(db_file, "select count(*) from kata_result") == 4  # 2 katas x 2 submissions, none twice
    assert count(db_file, "select count(*) from (select distinct submission_id, kata from kata_result)") == 4
    assert count(db_file, "select attempts from submission where id = 1") == 2  # resumed once
    assert count(db_file, "select attempts from submission where id = 2") == 1
    assert "stopped renewing its lease" in server.log.read_text()
    # the stub's verdict, stored before the kill, is not judged again (the store would keep the first, and say so)
    assert "stored already" not in "".join(log.read_text() for log in tmp_path.glob("server*.log"))
    state = server.get("/api/submissions/1", token=team).json()
    assert {k: v["points"] for k, v in state["katas_graded"].items()} == {"04_dce": 80.0, "01_linear_relu": 0.0}
    assert state["total_points"] == 80.0
    state = server.get("/api/submissions/2", token=team).json()
    assert {k: v["points"] for k, v in state["katas_graded"].items()} == {"04_dce": 80.0, "01_linear_relu": 0.0}


# The security cases, each a test, against one server that stores submissions and grades none
# (--grading-threads 0): what is refused or hidden does not depend on grading.

@pytest.fixture(scope="module")
def postgres():
    server = Postgres()
    yield server
    server.stop()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def secure(request, tmp_path_factory, postgres):
    """One server per database kind: every security case runs on SQLite and on a real PostgreSQL server
    (tests/postgres_support.py; skipped with its sentence where none can be started)."""
    tmp = tmp_path_factory.mktemp("secure")
    if request.param == "postgresql" and postgres.problem:
        pytest.skip(postgres.problem)
    db = f"sqlite:///{tmp / 'arena.db'}" if request.param == "sqlite" else postgres.database()
    organiser = create(db, "--kata", "04_dce", "--kata", "01_linear_relu", "--rate", "3/600")
    names = ("Red", "Blue", "<script>alert(1)</script>", "Limited")
    server = Server(db, tmp, "--grading-threads", "0", "--read-timeout", "1")
    try:
        server.start()
        # through the organiser's API (`arena.py team add` is tested above; a command is a Python start)
        added = [http(server.url + "/api/admin/teams", token=organiser, data=json.dumps({"name": name}).encode(),
                      kind="application/json").json() for name in names]
        assert [a["team"] for a in added] == list(names), added
        teams = {a["team"]: a["token"] for a in added}
        yield server, db, organiser, teams
    finally:
        server.stop()


def good_tar(tag="") -> bytes:
    return tar_of([("04_dce/solution.py", solution("04_dce", tag), "file")])


_numbers = itertools.count(1)


def new_team(secure) -> tuple[str, str]:
    """(name, token) of a team added for one test: a refused upload counts against its team's rate (3 in
    600 s here), so each test that is refused spends a rate of its own."""
    server, _, organiser, _ = secure
    name = f"fresh{next(_numbers)}"
    added = http(server.url + "/api/admin/teams", token=organiser, data=json.dumps({"name": name}).encode(),
                 kind="application/json")
    assert added.status == 201, added.text
    return name, added.json()["token"]


def test_wrong_token_is_refused(secure):
    server, _, organiser, teams = secure
    assert server.submit("not-a-token", good_tar()).status == 401
    assert server.submit(None, good_tar()).status == 401
    assert server.get("/api/me", token="not-a-token").status == 401
    assert server.get("/api/admin/submissions", token=teams["Red"]).status == 403  # a team is not the organiser
    assert http(server.url + "/api/admin/teams", token=teams["Red"], data=b'{"name": "Mallory"}',
                kind="application/json").status == 403
    added = http(server.url + "/api/admin/teams", token=organiser, data=b'{"name": "Green"}', kind="application/json")
    assert added.status == 201 and server.get("/api/me", token=added.json()["token"]).json()["team"] == "Green"


def test_a_team_cannot_read_another_teams_code_or_pending_results(secure):
    server, db, organiser, teams = secure
    sid = server.submit(teams["Red"], good_tar("red's secret")).json()["id"]
    # a kata graded, the submission still running: pending
    sql(db, "update submission set status = 'running' where id = :sid", sid=sid)
    sql(db, "insert into kata_result (submission_id, kata, points, summary, graded_at) values (:sid, '04_dce', 77.0, "
            ":summary, CURRENT_TIMESTAMP)", sid=sid, summary=json.dumps({"status": "graded", "points": 77.0,
            "levels": {"1": [20, 20]}, "message": "red's sentence", "checks": []}))
    assert server.get(f"/api/submissions/{sid}/files", token=teams["Blue"]).status == 403
    assert server.get(f"/api/submissions/{sid}/files").status == 403
    assert "red's secret" in server.get(f"/api/submissions/{sid}/files", token=teams["Red"]).json()["04_dce/solution.py"]
    assert server.get(f"/api/submissions/{sid}/files", token=organiser).status == 200
    theirs = server.get(f"/api/submissions/{sid}", token=teams["Blue"]).json()
    assert theirs["katas_graded"] == {} and theirs["total_points"] is None and theirs["files"] is None
    for reader in (teams["Blue"], None):
        assert "red's sentence" not in server.get(f"/submissions/{sid}", token=reader).text
        assert "77" not in json.dumps(server.get(f"/api/teams/Red", token=reader).json()["submissions"])
    mine = server.get(f"/api/submissions/{sid}", token=teams["Red"]).json()
    assert mine["katas_graded"]["04_dce"]["points"] == 77.0 and mine["katas_graded"]["04_dce"]["message"] == "red's sentence"


def test_an_oversize_upload_is_refused(secure):
    server = secure[0]
    name, team = new_team(secure)
    big = server.submit(team, b"x" * (600 * 1024))
    assert big.status == 413
    one_big_file = server.submit(team, tar_of([("04_dce/solution.py", b"#" * (300 * 1024), "file")]))
    assert one_big_file.status == 413
    body, kind = multipart({f"{n:02d}_x/solution.py": b"pass" for n in range(70)})
    assert http(server.url + "/api/submissions", token=team, data=body, kind=kind).status == 413
    assert server.get(f"/api/teams/{name}").json()["submissions"] == []  # nothing stored


@pytest.mark.parametrize("name", ["../04_dce/solution.py", "04_dce/../../etc/solution.py", "/etc/04_dce/solution.py"])
def test_a_path_outside_the_tree_is_refused(secure, name):
    server = secure[0]
    team_name, team = new_team(secure)
    refused = server.submit(team, tar_of([(name, b"pass", "file")]))
    assert refused.status == 400 and ("'..'" in refused.text or "absolute" in refused.text)
    body, kind = multipart({name: b"pass"})
    assert http(server.url + "/api/submissions", token=team, data=body, kind=kind).status == 400
    assert server.get(f"/api/teams/{team_name}").json()["submissions"] == []


@pytest.mark.parametrize("kind", ["symlink", "hardlink"])
def test_a_link_is_refused(secure, kind):
    server = secure[0]
    name, team = new_team(secure)
    refused = server.submit(team, tar_of([("04_dce/solution.py", b"/etc/passwd", kind)]))
    assert refused.status == 400 and "is a link" in refused.text
    assert server.get(f"/api/teams/{name}").json()["submissions"] == []


def test_only_solution_files_are_kept(secure):
    server, _, _, teams = secure
    ack = server.submit(teams["Red"], tar_of([("conftest.py", b"raise SystemExit", "file"),
                                              ("graders/frame/levels.py", b"x = 1", "file"),
                                              ("04_dce/helper.py", b"x = 1", "file"),
                                              ("99_unknown/solution.py", b"x = 1", "file"),
                                              ("./01_linear_relu/solution.py", solution("01_linear_relu"), "file")]))
    assert ack.status == 201 and ack.json()["files"] == ["01_linear_relu/solution.py"]
    assert list(server.get(f"/api/submissions/{ack.json()['id']}/files", token=teams["Red"]).json()) == ["01_linear_relu/solution.py"]
    assert server.submit(teams["Red"], tar_of([("conftest.py", b"x", "file")])).status == 400  # nothing left


def test_a_script_team_name_and_messages_are_escaped(secure):
    server, db, _, teams = secure
    name = "<script>alert(1)</script>"
    sid = server.submit(teams[name], good_tar()).json()["id"]
    # a check's sentence that quotes the team's code
    sql(db, "insert into kata_result (submission_id, kata, points, summary, graded_at) values (:sid, '04_dce', 0.0, "
            ":summary, CURRENT_TIMESTAMP)", sid=sid, summary=json.dumps({
                "status": "graded", "points": 0.0, "levels": {}, "message": "<script>steal()</script>",
                "checks": [{"level": 1, "check": "<img src=x>", "passed": False, "skipped": False,
                            "message": "got <script>steal()</script>\n\nGraph before the pass:\nopcode  name\n"
                                       "------  ----\nplaceholder  <b>x</b>"}]}))
    sql(db, "update submission set status = 'graded', total_points = 0 where id = :sid", sid=sid)
    from urllib.parse import quote
    pages = ["/", f"/teams/{quote(name, safe='')}", f"/submissions/{sid}", "/katas/04_dce"]
    for page in pages:
        text = server.get(page, token=teams[name]).text
        assert "<script>alert(1)" not in text and "<script>steal()" not in text and "<img src=x>" not in text, page
        assert "<b>x</b>" not in text, page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in server.get("/").text
    assert "&lt;script&gt;steal()" in server.get(f"/submissions/{sid}", token=teams[name]).text


def test_the_rate_limit_answers_429_with_retry_after(secure):
    server, _, _, teams = secure
    for n in range(3):
        assert server.submit(teams["Limited"], good_tar(str(n))).status == 201
    refused = server.submit(teams["Limited"], good_tar("one too many"))
    assert refused.status == 429 and 0 < int(refused.headers["Retry-After"]) <= 600
    assert len(server.get("/api/teams/Limited").json()["submissions"]) == 3


def test_a_bzip2_bomb_is_refused_at_the_cap_and_holds_up_no_other_team(secure, tmp_path):
    """A 25 KiB bzip2 tar that unpacks to 8 GiB of zeros (then a solution) stops at the unpacked cap, and
    another team's upload sent while it unpacks is acknowledged at once. (Before: the bomb unpacked whole
    under the server-wide submit lock, 5 s a GiB here, and the other team waited behind it.)"""
    server = secure[0]
    (_, bomber), (_, other) = new_team(secure), new_team(secure)
    began = time.perf_counter()
    data = bomb(tmp_path / "bomb.tar.bz2", "bzip2", 8 << 30).read_bytes()
    assert time.perf_counter() - began < 5 and len(data) < 32 * 1024  # cheap to build: the zeros are never held
    answers = {}

    def send_bomb():
        started = time.perf_counter()
        answers["bomb"] = server.submit(bomber, data, timeout=300), time.perf_counter() - started

    sender = threading.Thread(target=send_bomb)
    sender.start()
    time.sleep(0.2)  # the bomb is in: the old server was unpacking it, holding the lock
    started = time.perf_counter()
    ack = server.submit(other, good_tar("sent while a bomb unpacks"), timeout=300)
    acked = time.perf_counter() - started
    sender.join(300)
    refused, unpacked = answers["bomb"]
    assert ack.status == 201 and acked < 5, (ack.status, acked)
    assert refused.status == 413 and unpacked < 5, (refused.status, unpacked)
    assert refused.json() == {"detail": "refused: the archive unpacks to over 16777216 bytes"}


def test_a_gzip_bomb_is_refused_at_the_cap(secure, tmp_path):
    """480 MiB of zeros (then a solution) in a 481 KiB gzip tar: refused at the cap, not after unpacking it
    all (which the old server did, and then accepted the solution behind the zeros)."""
    server = secure[0]
    name, team = new_team(secure)
    data = bomb(tmp_path / "bomb.tar.gz", "gzip", 480 << 20).read_bytes()
    started = time.perf_counter()
    refused = server.submit(team, data, timeout=300)
    assert refused.status == 413 and "unpacks to over" in refused.text and time.perf_counter() - started < 5
    assert server.get(f"/api/teams/{name}").json()["submissions"] == []


def test_refused_uploads_count_against_the_rate_limit(secure, tmp_path):
    """Three refused uploads (a bomb, an archive that is no archive, a body over the cap) spend the team's
    rate (3 in 600 s) as three stored ones do: the next upload, a good one, is answered 429. A refusal
    through the page's form counts too."""
    server = secure[0]
    name, team = new_team(secure)
    assert server.submit(team, bomb(tmp_path / "bomb.tar.bz2", "bzip2", 32 << 20).read_bytes()).status == 413
    assert server.submit(team, b"not an archive at all").status == 400
    assert server.submit(team, b"x" * (600 * 1024)).status == 413
    limited = server.submit(team, good_tar("after three refusals"))
    assert limited.status == 429 and 0 < int(limited.headers["Retry-After"]) <= 600
    assert server.get(f"/api/teams/{name}").json()["submissions"] == []

    _, other = new_team(secure)
    body, kind = multipart({"token": other, "conftest.py": b"raise SystemExit"})
    for _ in range(3):
        page = http(server.url + "/submit", data=body, kind=kind)
        assert page.status == 400 and "holds no NN_name/solution.py" in page.text
    assert http(server.url + "/submit", data=body, kind=kind).status == 429


def test_the_seed_is_in_no_response_before_the_close(secure):
    server, db, _, teams = secure
    seed = str(sql(db, "select seed from competition")[0])
    sid = server.submit(teams["Blue"], good_tar("seed")).json()["id"]
    paths = ["/", "/api/competition", "/api/board", "/api/katas/04_dce", "/katas/04_dce", "/api/teams/Blue",
             "/teams/Blue", f"/api/submissions/{sid}", f"/submissions/{sid}", f"/api/submissions/{sid}/files", "/api/me"]
    for path in paths:
        for token in (None, teams["Blue"]):
            assert seed not in server.get(path, token=token).text, path
    assert "seed" not in server.get("/api/competition").json()
    with urllib.request.urlopen(server.url + "/events", timeout=10) as events:  # a long stream: its first events
        first = b"".join(events.readline() for _ in range(4))
    assert b"event: board" in first and seed.encode() not in first


def test_after_the_closing_time_submissions_are_refused(tmp_path, running):
    db = f"sqlite:///{tmp_path / 'arena.db'}"
    create(db, "--kata", "04_dce", "--closes", "2020-01-01T00:00")
    team = add_team(db, "Late")
    server = running(db, "--grading-threads", "0")
    refused = server.submit(team, good_tar())
    assert refused.status == 403 and "closed" in refused.text
    page = server.get("/").text
    assert "closed for submissions since 2020-01-01T00:00:00Z UTC" in page and "id='upload'" not in page


def add_by_api(secure, name: str):
    server, _, organiser, _ = secure
    return http(server.url + "/api/admin/teams", token=organiser, data=json.dumps({"name": name}).encode(),
                kind="application/json")


def test_a_team_name_with_a_slash_has_its_pages_and_api(secure):
    """A `/` in a team's name: its link on the board is URL-encoded (%2F), and its page and its API answer
    under that address. (Before: both 404, the decoded `/` split the path.)"""
    server = secure[0]
    added = add_by_api(secure, "AC/DC")
    assert added.status == 201 and added.json()["team"] == "AC/DC"
    sid = server.submit(added.json()["token"], good_tar("a slash")).json()["id"]
    assert "<a href='/teams/AC%2FDC'>AC/DC</a>" in server.get("/").text  # its row, pending
    page = server.get("/teams/AC%2FDC")
    assert page.status == 200 and "<h1>Team AC/DC</h1>" in page.text and f"href='/submissions/{sid}'" in page.text
    api = server.get("/api/teams/AC%2FDC")
    assert api.status == 200 and api.json()["team"] == "AC/DC" and [s["id"] for s in api.json()["submissions"]] == [sid]
    assert "<a href='/teams/AC%2FDC'>AC/DC</a>" in server.get(f"/submissions/{sid}").text


def test_a_name_that_reads_like_a_teams_is_refused(secure):
    """The organiser's API stores a name normalised (NFKC, no invisible characters, whitespace collapsed)
    and refuses one that reads like an existing team's: other case, full-width letters, a zero-width space,
    a Cyrillic look-alike. (Before: each was a new team beside Red.)"""
    for twin in ("red", "Ｒｅｄ", "R\u200bed", "R\u0435d", " Red\u00a0"):
        refused = add_by_api(secure, twin)
        assert refused.status == 409, (twin, refused.text)
        assert refused.json()["detail"].startswith("a team named 'Red' exists already"), twin
    added = add_by_api(secure, "  Team\u200d   \uff37ide ")
    assert added.status == 201 and added.json()["team"] == "Team Wide"
    assert add_by_api(secure, "bell\x07").json() == {"detail": "a team name may not hold control characters (it holds U+0007)"}


def test_requests_the_server_cannot_use_answer_a_sentence_never_500(secure):
    """An admin body that is not JSON (without a token, with one), a name holding NUL, an id over 64 bits,
    an id that is no number: each answers 400, 401, 404 or 422 with a sentence. (Before: 500 for the
    first three, FastAPI's 422 dump for the last.)"""
    server, _, organiser, _ = secure
    admin = server.url + "/api/admin/teams"
    no_token = http(admin, data=b"not json", kind="application/json")
    assert no_token.status == 401 and "the organiser's token" in no_token.json()["detail"]
    for body in (b"not json", b"\xff\xfe", b"[1, 2]", b'{"name": 7}'):
        bad = http(admin, token=organiser, data=body, kind="application/json")
        assert bad.status == 400 and 'send {"name": "Team Name"}' in bad.json()["detail"], body
    nul = add_by_api(secure, "nul\x00team")
    assert nul.status == 400 and "control characters" in nul.json()["detail"]
    assert server.get("/api/teams/nul%00team").json() == {"detail": "no such team"}
    for path in (f"/api/submissions/{2**63}", f"/api/submissions/{2**64}/files", f"/api/submissions/-{2**63 + 1}"):
        answer = server.get(path)
        assert answer.status == 404 and answer.json()["detail"].startswith("no such submission: #"), path
    not_a_number = server.get("/api/submissions/abc")
    assert not_a_number.status == 422
    assert not_a_number.json() == {"detail": "sid 'abc': Input should be a valid integer, unable to parse string as an integer"}


def test_a_page_answers_its_errors_as_a_page(secure):
    """Not under /api/, an error is a small HTML page with its sentence and its status (before: the JSON
    {"detail": ...} or FastAPI's 422 dump); under /api/ it stays JSON."""
    server = secure[0]
    for path, status, sentence in [("/submissions/999999", 404, "no such submission: #999999"),
                                   (f"/submissions/{2**64}", 404, "no such submission"),
                                   ("/submissions/abc", 422, "sid 'abc': Input should be a valid integer"),
                                   ("/teams/Nobody", 404, "no such team"),
                                   ("/katas/99_none", 404, "no kata '99_none' in this competition"),
                                   ("/nowhere", 404, "no such page: /nowhere")]:
        answer = server.get(path)
        assert answer.status == status and answer.headers["Content-Type"].startswith("text/html"), path
        assert sentence in html.unescape(answer.text) and "detail" not in answer.text, path
    assert server.get("/api/nowhere").json() == {"detail": "no such endpoint: /api/nowhere"}


def test_every_response_has_the_security_headers_and_every_page_a_viewport(secure):
    """X-Frame-Options, X-Content-Type-Options and a Content-Security-Policy on pages, API answers, errors,
    the static files and the event stream; every page has a viewport and no inline script or style (the
    policy allows only the site's own files: the browser test runs the board under it). Before: none."""
    server, _, _, teams = secure
    answers = {path: server.get(path, token=teams["Red"]) for path in
               ["/", "/katas/04_dce", "/teams/Red", "/submissions/1", "/submissions/999999", "/nowhere",
                "/api/board", "/api/me", "/api/nowhere", "/static/board.js", "/static/arena.css"]}
    answers["/submit"] = http(server.url + "/submit", data=b"", kind="multipart/form-data; boundary=x")
    with urllib.request.urlopen(server.url + "/events", timeout=10) as events:
        answers["/events"] = events
    for path, answer in answers.items():
        assert answer.headers["X-Frame-Options"] == "DENY", path
        assert answer.headers["X-Content-Type-Options"] == "nosniff", path
        policy = answer.headers["Content-Security-Policy"]
        assert "default-src 'none'" in policy and "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
        if answer.headers["Content-Type"].startswith("text/html"):
            text = answer.text
            assert "<meta name='viewport' content='width=device-width, initial-scale=1'>" in text, path
            assert "<script>" not in text and "<style>" not in text and " style=" not in text, path
    assert answers["/static/board.js"].headers["Content-Type"].startswith("text/javascript")


@pytest.mark.parametrize("path", ["/api/submissions", "/submit", "/api/admin/teams"])
def test_a_body_that_stalls_is_cut_off_with_408(secure, path):
    """A client that declares Content-Length 10000, sends 10 bytes and waits: the server answers 408 after
    its read time-out (--read-timeout 1 here) and closes the connection. (Before: held open for good.)"""
    server, _, organiser, _ = secure
    token = organiser if "admin" in path else new_team(secure)[1]
    with socket.create_connection(("127.0.0.1", server.port), timeout=8) as connection:
        connection.sendall(f"POST {path} HTTP/1.1\r\nHost: arena\r\nAuthorization: Bearer {token}\r\n"
                           "Content-Type: application/x-tar\r\nContent-Length: 10000\r\n\r\n".encode() + b"x" * 10)
        started, answer = time.monotonic(), b""
        try:
            while chunk := connection.recv(65536):  # until the server closes the connection
                answer += chunk
        except TimeoutError:
            pass
        took = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert "the request's body stalled: no byte for 1 s" in html.unescape(answer.decode()) and took < 5, took


def test_the_board_says_when_the_grading_finished(secure):
    """The board's graded_at is when the submission's grading finished, `submitted` when it came (before:
    graded_at was the submission's time)."""
    server, db, _, _ = secure
    name, team = new_team(secure)
    sid = server.submit(team, good_tar("when")).json()["id"]
    sql(db, "update submission set status = 'graded', total_points = 0, created = '2026-01-01 10:00:00', "
            "graded_at = '2026-01-01 10:07:30' where id = :sid", sid=sid)
    row = next(r for r in server.get("/api/board").json()["rows"] if r["team"] == name)
    assert (row["submitted"], row["graded_at"]) == ("2026-01-01T10:00:00Z", "2026-01-01T10:07:30Z")


def test_score_submit_waits_out_a_server_restart(tmp_path, capsys):
    """`score.py --submit`'s client tries an unreachable server again with back-off: started before the
    server, it uploads once the server is up; the server restarted while it follows the grading, it goes
    on and prints the team's rank. (Before: 'Refused: cannot reach' at the first connection error.)"""
    from graders.arena.client import submit

    db_file = tmp_path / "arena.db"
    db = f"sqlite:///{db_file}"
    create(db, "--kata", "04_dce", "--no-speed")
    team = add_team(db, "Patient")
    port, outcome, said = free_port(), {}, []
    server = Server(db, tmp_path, "--grading-threads", "0")
    client = threading.Thread(target=lambda: outcome.update(code=submit(
        f"http://127.0.0.1:{port}", team, tree(tmp_path / "team", {"04_dce/solution.py": solution("04_dce")}),
        timeout=120, poll=0.2, retry_for=60)))

    def printed(text: str) -> bool:
        said.append(capsys.readouterr())
        return any(text in s.out for s in said)

    try:
        client.start()  # it finds no server (a server takes seconds to start), and waits
        server.start(port=port)
        server.wait_for(lambda: printed("Following its grading"), 30, "the acknowledgement")
        server.stop()  # the server goes away while the client follows the grading ...
        with sqlite3.connect(db_file) as connection:  # ... which finishes meanwhile (this server grades nothing)
            connection.execute("insert into kata_result (submission_id, kata, points, summary, graded_at) values "
                               "(1, '04_dce', 60, '{\"points\": 60.0}', datetime('now'))")
            connection.execute("update submission set status = 'graded', total_points = 60, graded_at = datetime('now')")
        server.start(port=port)
        client.join(120)
    finally:
        server.stop()
        client.join(120)
    said.append(capsys.readouterr())
    out, err = "".join(s.out for s in said), "".join(s.err for s in said)
    assert outcome == {"code": 0}, (out, err)
    assert "Submission 1 acknowledged for team Patient" in out and "Team Patient: 60.0 points, rank 1 of 1." in out
    assert err.count(f"cannot reach http://127.0.0.1:{port}/api/competition") >= 1
    assert err.count(f"cannot reach http://127.0.0.1:{port}/api/submissions/1") >= 1
    assert "trying again in 1s (for up to 60s in all)" in err
