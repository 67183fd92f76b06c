"""score.py end to end, and the leaderboard it regenerates."""
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import types

import pytest

from graders.batch import processes
from graders.frame.catalogue import REPO_ROOT
from graders.competition.leaderboard import regenerate, render
from graders.competition.store import SCHEMA, load_runs, locked, store_run

KATA = "03_conv_bn"


def score(tmp_path, *args, timeout=600):
    command = [sys.executable, str(REPO_ROOT / "graders" / "score.py"), "--kata", KATA, "--seed", "0",
               "--results-dir", str(tmp_path / "results"), "--leaderboard", str(tmp_path / "LEADERBOARD.md"), *args]
    env = {**os.environ, "FX_KATAS_STATE": str(tmp_path / "state")}  # the learner's progress and hints
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=timeout, env=env)


def tree_with(tmp_path, source: str):
    solution = tmp_path / "tree" / KATA / "solution.py"
    solution.parent.mkdir(parents=True)
    solution.write_text(source)
    return solution.parent.parent


def test_reference_tree_scores_and_is_stored_for_the_team(tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(REPO_ROOT / "reference" / KATA, tree / KATA)
    proc = score(tmp_path, "--solutions", str(tree), "--no-speed", "--team", "team a", "--json", str(tmp_path / "run.json"))
    assert proc.returncode == 0, proc.stderr
    run = json.loads((tmp_path / "run.json").read_text())
    kata = run["katas"][KATA]
    assert kata["points"] == pytest.approx(80.0) and kata["levels"]["3"] == [0.0, 20.0]
    assert run["seed"] == 0 and run["team"] == "team a" and len(run["solutions_hash"]) == 64
    assert "not yet available" in proc.stdout or len(run["katas"]) == 1
    assert "| team a" in (tmp_path / "LEADERBOARD.md").read_text()
    assert len(list((tmp_path / "results").glob("*/*.json"))) == 1
    assert "1/1 katas complete, 80/100 points" in proc.stdout  # every check that ran passed (--no-speed)
    assert "Next:" not in proc.stdout


def test_stub_tree_scores_zero_and_says_where_to_start(tmp_path):
    proc = score(tmp_path, "--no-speed")
    assert proc.returncode == 0, proc.stderr
    assert "still the stub" in proc.stdout
    # the shipped stub is reported from its bytes: no grading process started ("[1/1] ..." is one's progress)
    assert f"{KATA}: not started (solution.py is the shipped stub; not graded)" in proc.stderr
    assert "[1/" not in proc.stderr, proc.stderr
    assert f"Next: kata {KATA}" in proc.stdout and f"uv run pytest katas/{KATA}`" in proc.stdout
    assert "0/1 katas complete, 0/100 points" in proc.stdout
    assert "No team has been graded yet" in (tmp_path / "LEADERBOARD.md").read_text()


def test_hints_come_one_more_each_time(tmp_path):
    first, second = score(tmp_path, "--hint", KATA).stdout, score(tmp_path, "--hint", KATA).stdout
    assert first.startswith(f"Hint 1 of 3 for {KATA}") and second.startswith(f"Hint 2 of 3 for {KATA}")
    assert first.splitlines()[1] != second.splitlines()[1]
    assert "Seen before:" not in first and f"  1. {first.splitlines()[1].strip()}" in second.splitlines()  # history
    assert score(tmp_path, "--hints-reset", KATA).stdout.startswith(f"Hints of {KATA} start again")
    assert score(tmp_path, "--hint", KATA).stdout.startswith(f"Hint 1 of 3 for {KATA}")


def test_broken_solutions_cost_their_kata_with_a_reason(tmp_path):
    """A file that does not compile, one that raises on import, one that allocates more than the grading
    process may: each costs its own kata, with a reason, in one grading process that goes on to the next."""
    tree = tree_with(tmp_path, "def fuse_conv_bn(gm)\n    return gm\n")
    for kata, source in (("04_dce", "import torch\nHOARD = torch.empty(6 * 2**30, dtype=torch.uint8)\n"),
                         ("05_cse", "raise ImportError('half done')\n")):
        (tree / kata).mkdir()
        (tree / kata / "solution.py").write_text(source)
    proc = score(tmp_path, "--solutions", str(tree), "--kata", "04_dce", "--kata", "05_cse", "--no-speed", "--jobs", "1",
                 "--kata-memory", "4", "--json", str(tmp_path / "run.json"))
    assert proc.returncode == 0, proc.stderr
    katas = json.loads((tmp_path / "run.json").read_text())["katas"]
    assert all(kata["points"] == 0 and kata["status"] == "graded" for kata in katas.values()), katas
    assert "does not compile" in katas[KATA]["message"] and "line 1" in katas[KATA]["message"]
    assert "importing" in katas["04_dce"]["message"] and "RuntimeError" in katas["04_dce"]["message"]  # the memory cap
    assert "ImportError: half done" in katas["05_cse"]["message"]
    # The next step names the first kata to fix, in the tree graded.
    assert f"uv run pytest katas/{KATA} --solutions {tree}" in proc.stdout, proc.stdout


def test_hanging_solution_is_stopped_and_costs_only_that_kata(tmp_path):
    # It hangs without spinning, so the CPU stays with the tests running beside this one.
    tree = tree_with(tmp_path, "import queue\n\nqueue.Queue().get()  # waits for an item that never comes\n")
    shutil.copytree(REPO_ROOT / "reference" / "04_dce", tree / "04_dce")  # graded after it, in the same process
    proc = score(tmp_path, "--solutions", str(tree), "--kata", "04_dce", "--no-speed", "--jobs", "1",
                 "--kata-timeout", "12", "--json", str(tmp_path / "run.json"), timeout=180)
    assert proc.returncode == 0, proc.stderr
    katas = json.loads((tmp_path / "run.json").read_text())["katas"]
    assert katas[KATA]["status"] == "timed out" and katas[KATA]["points"] == 0
    assert "did not finish within 12s" in proc.stdout
    assert katas["04_dce"]["points"] == pytest.approx(80.0), katas["04_dce"]["message"]
    # 04_dce, never reached in the process that hung, is graded again alone; the kata that hung is not (it would
    # hang again: a second kata timeout for nothing)
    again = [line for line in proc.stderr.splitlines() if "grading again" in line]
    assert len(again) == 1 and again[0].startswith("04_dce") and KATA not in again[0], proc.stderr


def test_a_katas_clock_starts_at_its_first_check_not_at_the_process_start(tmp_path, monkeypatch):
    # The hang test's kata graded again alone must not pay for its process's start-up (import torch takes
    # over 12 s on a loaded machine): before the first kata starts, the process has STARTUP_SECONDS.
    now = [1000.0]
    monkeypatch.setattr(processes.time, "monotonic", lambda: now[0])
    progress = processes.Progress(tmp_path / "progress")
    now[0] += 60
    assert not progress.overdue(12)
    now[0] += processes.STARTUP_SECONDS
    assert progress.overdue(12)  # a process that never starts a kata is still stopped
    (tmp_path / "progress").write_text(json.dumps({"kata": KATA, "started": "check"}) + "\n")
    assert progress.read() == [] and progress.current == KATA
    now[0] += 11
    assert not progress.overdue(12)
    now[0] += 2
    assert progress.overdue(12)


@pytest.mark.parametrize("returncode, tampering, vouches", [(0, None, True), (1, None, True), (3, None, False),
                                                            (-9, None, False), (1, "the grader changed", False)])
def test_a_grading_process_vouches_for_its_records_only_when_it_ended_as_pytest_does(tmp_path, returncode, tampering,
                                                                                     vouches):
    """Records a process wrote stand for its katas only if it then exited as pytest exits (0: all passed, 1: some
    failed) and its guard saw no tampering: a solution that found the records file could write its own there and
    leave with another code (tests/cheats/rewrites_the_records_at_exit.py finds it)."""
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"results": [], "tampering": tampering}))
    process = types.SimpleNamespace(returncode=returncode, pid=0)
    graded = processes.GradingProcess(process, processes.Progress(tmp_path / "progress"), results, tmp_path / "out")
    assert graded.vouches() is vouches


def test_a_kata_that_kills_or_tampers_with_the_grading_process_costs_only_itself(tmp_path):
    """Katas share grading processes; one whose process dies or is tampered with cannot vouch for the
    katas it graded, and each is graded again in a process of its own."""
    tree = tmp_path / "tree"
    shutil.copytree(REPO_ROOT / "reference" / KATA, tree / KATA)
    (tree / "04_dce").mkdir()
    (tree / "04_dce" / "solution.py").write_text(
        (REPO_ROOT / "reference" / "04_dce" / "solution.py").read_text()
        + "\nimport torch.nn.functional as F\n_relu = F.relu\nF.relu = lambda *a, **k: _relu(*a, **k)\n")
    (tree / "05_cse").mkdir()
    (tree / "05_cse" / "solution.py").write_text("import os\nos._exit(3)\n")
    proc = score(tmp_path, "--solutions", str(tree), "--kata", "04_dce", "--kata", "05_cse", "--no-speed",
                 "--jobs", "1", "--json", str(tmp_path / "run.json"))
    assert proc.returncode == 0, proc.stderr
    katas = json.loads((tmp_path / "run.json").read_text())["katas"]
    assert katas[KATA]["points"] == pytest.approx(80.0) and not katas[KATA]["disqualified"], katas[KATA]["message"]
    assert katas["04_dce"]["disqualified"] and "torch.nn.functional.relu was replaced" in katas["04_dce"]["message"]
    assert katas["05_cse"]["status"] == "crashed" and katas["05_cse"]["points"] == 0
    assert "grading again, one process per kata" in proc.stderr


def fake_run(team: str, points: float, speedup: float, timestamp="2026-11-22T10:00:00+00:00", **fields) -> dict:
    return {"schema": SCHEMA, "team": team, "timestamp": timestamp, "seed": 1, "device": "cpu",
            "device_name": "test cpu", "torch": "2.x", "solutions_hash": "ab" * 32, "total_points": points,
            "katas": {KATA: {"status": "graded", "points": points, "speedup": speedup, "speedup_threshold": 1.3}},
            **fields}


def board_rows(board: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.split("|")[1:-1]] for line in board.splitlines()
            if line.startswith("|") and "rank" not in line and "---" not in line]


def test_leaderboard_ranks_by_points_then_speedup_and_keeps_latest_run(tmp_path):
    for run in [fake_run("slow", 90, 1.2), fake_run("fast", 90, 1.6), fake_run("best", 100, 1.0),
                fake_run("fast", 10, 1.0, timestamp="2026-11-21T10:00:00+00:00")]:
        store_run(tmp_path, run)
    board = render(load_runs(tmp_path)[0])
    assert [row[1] for row in board_rows(board)] == ["best", "fast", "slow"]


def test_teams_equal_on_points_and_speed_share_a_rank(tmp_path):
    """Twenty teams on equal points were ranked alphabetically: a name orders a tie, it never wins one."""
    for run in [fake_run("zeta", 90, 1.2), fake_run("alpha", 90, 1.2), fake_run("best", 100, 1.0),
                fake_run("last", 80, 1.5), fake_run("mid", 90, 1.2)]:
        store_run(tmp_path, run)
    rows = board_rows(render(load_runs(tmp_path)[0]))
    assert [(row[0], row[1]) for row in rows] == [("1", "best"), ("2", "alpha"), ("2", "mid"), ("2", "zeta"),
                                                  ("5", "last")]


def test_disqualified_team_is_listed_with_its_reason_but_not_ranked(tmp_path):
    store_run(tmp_path, fake_run("cheater", 100, 1.6, disqualified=["03_conv_bn: tampering: time.perf_counter was replaced"]))
    store_run(tmp_path, fake_run("honest", 60, 1.4))
    rows = board_rows(render(load_runs(tmp_path)[0]))
    assert [row[:3] for row in rows] == [["1", "honest", "60.0"], ["DQ", "cheater", "100.0"]]
    assert rows[1][-1] == "disqualified: 03_conv_bn: tampering: time.perf_counter was replaced"


def test_one_outlier_speedup_is_capped_in_the_tie_break(tmp_path):
    steady = fake_run("steady", 100, 2.0)
    steady["katas"]["01_linear_relu"] = {"status": "graded", "points": 0, "speedup": 2.0, "speedup_threshold": 1.1}
    outlier = fake_run("outlier", 100, 50.0)   # capped at 2 x 1.3 = 2.6
    outlier["katas"]["01_linear_relu"] = {"status": "graded", "points": 0, "speedup": 1.2, "speedup_threshold": 1.1}
    store_run(tmp_path, steady)
    store_run(tmp_path, outlier)
    rows = board_rows(render(load_runs(tmp_path)[0]))
    assert [(row[1], row[-5]) for row in rows] == [("steady", "2.00x"), ("outlier", "1.77x")]


def test_results_file_with_a_malformed_disqualified_field_is_rejected_by_name(tmp_path):
    (tmp_path / "team").mkdir()
    (tmp_path / "team" / "run.json").write_text(json.dumps(fake_run("team", 10, 1.0, disqualified="yes")))
    runs, problems = load_runs(tmp_path)
    assert runs == [] and problems == [f"{tmp_path / 'team' / 'run.json'}: field 'disqualified' must be a list of "
                                       f"reasons. It was left out of the leaderboard."]


def test_corrupt_results_file_is_named_and_the_rest_still_ranks(tmp_path):
    store_run(tmp_path, fake_run("good", 50, 1.1))
    (tmp_path / "evil").mkdir()
    (tmp_path / "evil" / "broken.json").write_text("{not json")
    (tmp_path / "evil" / "foreign.json").write_text(json.dumps({"hello": 1}))
    (tmp_path / "good" / ".tmp-killed.json").write_text("{half written by a writer killed before its rename")
    # whole runs, each with one field that is not what the results format says
    wrong = {"schema": {"schema": "fx-katas/results/0"}, "disqualified": {"disqualified": [1]},
             "points": {"katas": {KATA: {"status": "graded", "points": "80"}}}}
    for name, field in wrong.items():
        (tmp_path / "evil" / f"{name}.json").write_text(json.dumps({**fake_run(name, 50, 1.1), **field}))
    problems = regenerate(tmp_path, tmp_path / "LEADERBOARD.md")
    assert len(problems) == 5 and all("evil" in p for p in problems), problems
    said = {name: next(p for p in problems if f"{name}.json" in p) for name in wrong}
    assert "schema 'fx-katas/results/1' expected" in said["schema"]
    assert "field 'disqualified' must be a list of reasons" in said["disqualified"]
    assert f"kata {KATA!r} has no points" in said["points"]
    assert "| good" in (tmp_path / "LEADERBOARD.md").read_text()


def _store_and_regenerate(results_dir, team):
    with locked(results_dir):
        store_run(results_dir, fake_run(team, 10, 1.0))
        regenerate(results_dir, results_dir / "LEADERBOARD.md")


def test_teams_whose_names_differ_only_in_unsafe_characters_keep_their_own_results(tmp_path):
    from graders.competition.store import RunFolder, safe_team_dir

    names = ["team a", "team_a", "team/a", "team_a_"]
    assert len({safe_team_dir(name) for name in names}) == len(names) and safe_team_dir("team_a") == "team_a"
    folder = RunFolder.create(tmp_path, {"seed": 1})
    for points, name in enumerate(names):
        folder.save(name, "04_dce", "all", {"points": points}, b"a solution")
    assert {team: result["points"] for (team, _, _), result in folder.saved()[0].items()} == {
        name: points for points, name in enumerate(names)}


def test_a_resumed_run_is_named_safely_and_grades_again_what_a_killed_organiser_half_wrote(tmp_path):
    """`--resume RUN` names a folder under results/.runs/, never a path; a job's result file cut short when the
    organiser died (or not a result at all) is no result: that job is graded again."""
    from graders.competition.store import RunFolder

    for name in ("../../elsewhere", "a/b", ""):
        with pytest.raises(ValueError, match="is not a run name"):
            RunFolder(tmp_path, name)
    folder = RunFolder.create(tmp_path, {"seed": 1})
    folder.save("ada", "04_dce", "all", {"points": 80.0}, b"a solution")
    folder.save("bob", "04_dce", "all", {"points": 0.0}, b"a solution")
    folder.save("eve", "04_dce", "all", {"points": 0.0}, b"a solution")
    (folder.path / "jobs" / "bob" / "04_dce.all.json").write_text('{"team": "bob", "kata": "04_d')
    (folder.path / "jobs" / "eve" / "04_dce.all.json").write_text('{"team": "eve"}')
    assert list(folder.saved()[0]) == [("ada", "04_dce", "all")]


def test_concurrent_runs_lose_no_row(tmp_path):
    teams = [f"team{i}" for i in range(8)]
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        pool.starmap(_store_and_regenerate, [(tmp_path, team) for team in teams])
    board = (tmp_path / "LEADERBOARD.md").read_text()
    assert all(f"| {team} " in board for team in teams), board


def test_committed_leaderboard_is_what_the_renderer_writes():
    # A renderer change must come with a regenerated board (`uv run graders/score.py`).
    runs, problems = load_runs(REPO_ROOT / "results")
    assert not problems
    assert (REPO_ROOT / "LEADERBOARD.md").read_text() == render(runs)


def test_a_kata_with_points_is_not_reported_as_not_started(capsys):
    """Kata 08 with find_elementwise_chains written and fuse_elementwise_chains still the stub earned points,
    yet the table said "not started: solution.py is still the stub"; its total read 229.6 where the
    progress line said 230. The status follows what was graded, and every total is one number."""
    from graders.batch.summary import summarise
    from graders.frame.levels import CheckResult
    from graders.learner.report import print_table

    kata = "08_elementwise_chains"
    stub = "fuse_elementwise_chains is still the stub (it raises NotImplementedError): fill in the TODO(human) parts."
    written = summarise(kata, [CheckResult(kata, 1, "find_basic", True, 10.0, 10.0, "ok"),
                               CheckResult(kata, 1, "fuse_basic", False, 0.0, 10.0, stub)])
    assert written["message"] == f"test_L1_pattern[fuse_basic]: {stub}"
    untouched = summarise(kata, [CheckResult(kata, 1, "find_basic", False, 0.0, 10.0, stub.replace("fuse", "find")),
                                 CheckResult(kata, 1, "fuse_basic", False, 0.0, 10.0, stub)])
    assert untouched["message"] == "not started: solution.py is still the stub"
    katas = {kata: {**written, "points": 29.6}, "09_gelu": untouched}
    print_table(katas, 29.6, 200.0)
    table = capsys.readouterr().out
    assert "29.6/200" in table and "0/2 katas complete, 29.6/200 points" in table
    assert table.splitlines()[0].split()[0] == "done"  # the mark column has a header, not a bare rule


def test_a_kata_solved_in_place_is_no_stub(monkeypatch):
    """A learner solves in katas/ itself (score.py's default tree). The stub was told by comparing a file with
    katas/NN/solution.py, so there every edited kata compared equal to itself and was reported "not started",
    ungraded. The shipped stub is told by the manifest's digest now, without reading the learner's file."""
    import pathlib

    from graders.batch.summary import is_shipped_stub
    from graders.frame.catalogue import KATAS

    learner_files = REPO_ROOT / "katas"
    read_bytes = pathlib.Path.read_bytes

    def guarded(path):
        assert not path.resolve().is_relative_to(learner_files.resolve()), f"read the learner's {path}"
        return read_bytes(path)

    stubs = {kata: read_bytes(learner_files / kata / "solution.py") for kata in KATAS}
    solved = {kata: read_bytes(REPO_ROOT / "reference" / kata / "solution.py") for kata in KATAS}
    monkeypatch.setattr(pathlib.Path, "read_bytes", guarded)
    for kata in KATAS:
        assert is_shipped_stub(kata, stubs[kata]) and not is_shipped_stub(kata, solved[kata])
        assert not is_shipped_stub(kata, stubs[kata] + b"# started\n") and not is_shipped_stub(kata, None)
