"""The organiser's controls over a live competition (graders/arena/controls.py), end to end on a real server:
freeze (the public board stops, teams see their own results, the organiser's board stays live, the close
reveals), exclude and include a submission with a reason, announcements, rejudging (reviewed side by side,
applied or discarded; the replaced verdict kept), the log; from the API and from the arena.py commands alike."""
from __future__ import annotations

import json

from arena_support import Server, add_teams, arena, create, http, solution, sql, tar_of


def post(server: Server, path: str, token: str | None, payload: dict | None = None):
    return http(server.url + path, token=token, data=json.dumps(payload or {}).encode(), kind="application/json")


def board(server: Server, token: str | None = None) -> dict:
    return {row["team"]: row["points"] for row in server.get("/api/board", token=token).json()["rows"]}


def history(server: Server, team: str, token: str | None = None, field: str = "points") -> list:
    """A field of each submission on the team's page (/api/teams/NAME), newest first, as this reader sees it."""
    return [s[field] for s in server.get(f"/api/teams/{team}", token=token).json()["submissions"]]


def test_freeze_exclude_announce_rejudge_and_the_close_that_reveals(tmp_path):
    db = f"sqlite:///{tmp_path / 'arena.db'}"
    organiser = create(db, "--kata", "04_dce", "--no-speed", "--rate", "5/600")
    red, blue = add_teams(db, "Red", "Blue")
    server = Server(db, tmp_path).start()
    try:
        archive = tar_of([("04_dce/solution.py", solution("04_dce"), "file")])
        assert server.submit(red, archive).status == 201
        server.wait_for(lambda: server.get("/api/submissions/1").json()["status"] == "graded", 300, "Red graded")

        assert post(server, "/api/admin/freeze", None).status == 401
        assert post(server, "/api/admin/freeze", blue).status == 403
        frozen = post(server, "/api/admin/freeze", organiser)
        assert frozen.status == 200 and frozen.json()["frozen_at"]
        assert server.submit(blue, archive).status == 201  # after the freeze
        # an announcement while Blue's submission is graded (the command's seconds overlap the grading's)
        said = arena("announce", "--db", db, "Kata 04's hidden models are regenerated at 18:00.")
        assert "is on the board" in said.stdout
        assert [a["text"] for a in server.get("/api/announcements").json()] == [
            "Kata 04's hidden models are regenerated at 18:00."]
        assert "Kata 04&#x27;s hidden models are regenerated" in server.get("/").text
        server.wait_for(lambda: server.get("/api/submissions/2", token=blue).json()["status"] == "graded", 300,
                        "Blue graded")
        public = server.get("/api/board").json()
        assert public["frozen_at"] == frozen.json()["frozen_at"] and not public["live"]
        assert board(server) == {"Red": 80.0}                       # Blue's points are the close's secret
        assert board(server, organiser) == {"Red": 80.0, "Blue": 80.0}  # the organiser's board stays live
        assert server.get("/api/submissions/2", token=blue).json()["total_points"] == 80.0  # Blue sees its own
        assert server.get("/api/submissions/2").json()["total_points"] is None
        assert server.get("/api/submissions/2", token=red).json()["katas_graded"] == {}
        # the team's page keeps the same secret
        assert history(server, "Blue") == history(server, "Blue", red) == [None]
        assert history(server, "Blue", blue) == history(server, "Blue", organiser) == [80.0]
        assert "The board is frozen since" in server.get("/").text

        assert post(server, "/api/admin/submissions/1/exclude", organiser, {}).status == 400  # no reason
        assert post(server, "/api/admin/submissions/99/exclude", organiser, {"reason": "x"}).status == 404
        excluded = post(server, "/api/admin/submissions/1/exclude", organiser, {"reason": "copied from Blue"})
        assert excluded.status == 200
        assert board(server) == {} and board(server, organiser) == {"Blue": 80.0}
        assert server.get("/api/submissions/1", token=red).json()["excluded"] == "copied from Blue"
        assert server.get("/api/submissions/1").json()["excluded"] is True  # others: that it is, not why
        assert history(server, "Red", red, "excluded") == ["copied from Blue"]
        assert history(server, "Red", blue, "excluded") == [True]
        assert "Excluded by the organiser: copied from Blue" in server.get("/submissions/1", token=red).text
        assert post(server, "/api/admin/submissions/2/include", organiser).status == 409  # never excluded
        assert "counts again" in arena("include", "--db", db, "1").stdout
        assert board(server) == {"Red": 80.0}

        log = server.get("/api/admin/log", token=organiser).json()
        assert [entry["action"] for entry in log] == ["freeze", "announce", "exclude", "include"]
        assert log[2]["reason"] == "copied from Blue" and "submission 1 of Red" in log[2]["target"]
        assert server.get("/api/admin/log", token=red).status == 403
        assert "exclude" in arena("log", "--db", db).stdout

        # Rejudging: Red's verdict as an earlier, wrong grader left it (0 points), graded again with today's.
        sql(db, """update kata_result set points = 0, summary = replace(summary, '"points": 80.0', '"points": 0.0')
                   where submission_id = 1""")
        sql(db, "update submission set total_points = 0 where id = 1")
        assert board(server, organiser)["Red"] == 0.0
        assert "Rejudging #1 is queued" in arena("rejudge", "--db", db, "--kata", "04_dce", "--team", "Red").stdout
        ready = lambda rid: server.get(f"/api/admin/rejudgings/{rid}", token=organiser).json()["status"] == "ready"  # noqa: E731
        server.wait_for(lambda: ready(1), 300, "rejudging 1 graded")
        shown = server.get("/api/admin/rejudgings/1", token=organiser).json()
        assert [(v["submission"], v["kata"], v["old"], v["new"], v["changed"]) for v in shown["verdicts"]] == [
            (1, "04_dce", 0.0, 80.0, True)]
        assert board(server, organiser)["Red"] == 0.0  # nothing changes before it is applied
        second = post(server, "/api/admin/rejudgings", organiser, {"submissions": [1]})
        assert second.status == 201 and second.json()["id"] == 2
        assert "0.0 -> 80.0 changed" in arena("rejudging", "--db", db, "show", "1").stdout  # while 2 is graded
        server.wait_for(lambda: ready(2), 300, "rejudging 2 graded")
        assert post(server, "/api/admin/rejudgings/2/discard", organiser).status == 200
        assert post(server, "/api/admin/rejudgings/2/apply", organiser).status == 409  # discarded
        assert post(server, "/api/admin/rejudgings", organiser, {"katas": ["99_nope"]}).status == 404
        applied = post(server, "/api/admin/rejudgings/1/apply", organiser)
        assert applied.status == 200 and applied.json()["changed"] == 1
        assert post(server, "/api/admin/rejudgings/1/apply", organiser).status == 409  # applied already
        rows = {r["team"]: r for r in server.get("/api/board", token=organiser).json()["rows"]}
        assert rows["Red"]["points"] == 80.0 and rows["Red"]["rejudged"] and not rows["Blue"]["rejudged"]
        assert server.get("/api/submissions/1", token=red).json()["superseded"] == [
            {"kata": "04_dce", "points": 0.0, "rejudging": 1}]
        assert server.get("/api/submissions/1", token=red).json()["total_points"] == 80.0  # the submission's total too
        assert [e["action"] for e in server.get("/api/admin/log", token=organiser).json()][-4:] == [
            "rejudge", "rejudge", "discard", "apply"]

        arena("close", "--db", db, "--results-dir", str(tmp_path / "results"), "--leaderboard",
              str(tmp_path / "LEADERBOARD.md"), "--wait", "60")
        revealed = server.get("/api/board").json()
        assert revealed["frozen_at"] is None and board(server) == {"Red": 80.0, "Blue": 80.0}
        assert server.get("/api/submissions/2").json()["total_points"] == 80.0
        assert post(server, "/api/admin/freeze", organiser).status == 409  # a closed board shows everything
    finally:
        server.stop()
