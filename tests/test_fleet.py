"""The grading fleet (graders/competition/fleet.py) with real processes on this machine: a `dask scheduler`
and `dask worker` subprocesses, score.py --submissions over them, a worker killed mid-job, a worker at
another project version, an organiser killed and resumed, a solution that takes its machine down again
and again, speed levels pinned to one machine, and the machine lock's log that shows every timed stretch
alone on its machine.

Katas are small (04_dce, 05_cse) and most runs skip the speed level; every subprocess a test starts is
killed when it ends, passed or failed."""
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from graders.frame.catalogue import REPO_ROOT
from waiting import wait_for

KATAS = ["04_dce", "05_cse"]


@pytest.fixture
def processes():
    """Start subprocesses (each leading its own process group); all are killed at the end of the test."""
    started = []

    def start(command, **options):
        process = subprocess.Popen(command, start_new_session=True, **options)
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


class Cluster:
    """A scheduler and its workers, as subprocesses of this test."""

    def __init__(self, start, tmp_path, lock=None):
        self.start, self.tmp = start, tmp_path
        self.lock = lock or tmp_path / "machine.lock"  # the workers' machine lock (FX_KATAS_MACHINE_LOCK)
        self.file = tmp_path / "scheduler.json"
        self.log = tmp_path / "jobs.log"
        self.workers = {}
        self.scheduler = start([sys.executable, "-m", "distributed.cli.dask_scheduler", "--scheduler-file",
                                str(self.file), "--port", "0", "--no-dashboard", "--host", "127.0.0.1"],
                               stdout=subprocess.DEVNULL, stderr=open(tmp_path / "scheduler.err", "w"))
        self.address = wait_for(lambda: self.file.exists() and json.loads(self.file.read_text() or "{}").get("address"),
                                60, "the scheduler")

    def add_worker(self, name: str, root=REPO_ROOT, threads: int = 2, nanny: bool = False):
        """`dask worker` as docs/organisers.md starts it, run from `root` (a clone of the project); with a nanny, a
        worker process that dies is started again."""
        env = {**os.environ, "FX_KATAS_JOB_LOG": str(self.log), "PYTHONPATH": str(root),
               "FX_KATAS_MACHINE_LOCK": str(self.lock), "FX_KATAS_LOCK_LOG": str(self.tmp / "lock.log")}
        self.workers[name] = self.start(
            [sys.executable, "-m", "distributed.cli.dask_worker", self.address, "--name", name, "--nthreads",
             str(threads), "--nanny" if nanny else "--no-nanny", "--no-dashboard", "--host", "127.0.0.1",
             "--local-directory", str(self.tmp / name)],
            cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=open(self.tmp / f"{name}.err", "w"))

    def stop_worker(self, name: str, timeout: float = 30):
        """Stop a worker as `kill` or Ctrl-C would (SIGTERM to its process group) and wait until the group is gone.
        A worker with a nanny stops so at the end of its test: the nanny's multiprocessing resource tracker ignores
        SIGTERM and, once the rest have gone, unlinks the semaphores of the worker processes killed before. The
        fixture's SIGKILL of the group takes the tracker too, and left them in /dev/shm: 12 files each run."""
        process = self.workers[name]
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout)

        def group_gone():
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                return True
            return False

        wait_for(group_gone, timeout, f"worker {name}'s process group to end")

    def wait_for_workers(self, n: int):
        from distributed import Client

        with Client(self.address, timeout=30) as client:
            client.wait_for_workers(n, timeout=120)


EDITED_STUB = "edited stub"  # the shipped stub and a comment: graded (the stub itself is judged from its bytes)


def submissions(tmp_path, teams: dict[str, dict[str, str]]):
    """teams: {team: {kata: "reference" | "stub" | EDITED_STUB | source}}."""
    root = tmp_path / "submissions"
    for team, katas in teams.items():
        (root / team).mkdir(parents=True)
        for kata, what in katas.items():
            (root / team / kata).mkdir()
            source = {"reference": REPO_ROOT / "reference" / kata / "solution.py",
                      "stub": REPO_ROOT / "katas" / kata / "solution.py"}.get(what)
            if what == EDITED_STUB:
                what = (REPO_ROOT / "katas" / kata / "solution.py").read_text() + "# edited\n"
            (root / team / kata / "solution.py").write_text(source.read_text() if source else what)
    return root


def score_command(tmp_path, subs, *args, name="run", katas=KATAS):
    katas = [option for kata in katas for option in ("--kata", kata)]
    return [sys.executable, str(REPO_ROOT / "graders" / "score.py"), "--submissions", str(subs), *katas,
            "--results-dir", str(tmp_path / "results"), "--leaderboard", str(tmp_path / "LEADERBOARD.md"),
            "--json", str(tmp_path / f"{name}.json"), *args]


def score(tmp_path, subs, *args, name="run", env=None, timeout=600, katas=KATAS, lock=None):
    """score.py --submissions; its grading processes share the machine lock `lock` (by default one of this
    test's own)."""
    env = {"FX_KATAS_MACHINE_LOCK": str(lock or tmp_path / "machine.lock"), **(env or {})}
    proc = subprocess.run(score_command(tmp_path, subs, *args, name=name, katas=katas), cwd=tmp_path, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr
    return proc, {run["team"]: run for run in json.loads((tmp_path / f"{name}.json").read_text())}


def points(runs: dict) -> dict:
    return {team: {kata: result["points"] for kata, result in run["katas"].items()} for team, run in runs.items()}


def job_log(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# Two teams: one that solved both katas, one whose katas are the shipped stub and a file that raises on import.
# Each team a machine grades costs it a nursery (a sandboxed Python importing torch, about 4 s of CPU): a third
# team with the same kinds of files proved nothing more.
TEAMS = {"ada": {"04_dce": "reference", "05_cse": "reference"},
         "bob": {"04_dce": "stub", "05_cse": "raise ImportError('half done')\n"}}
STUBS = {("bob", "04_dce")}  # the shipped stub: judged from its bytes, no job (fleet.py)


# Its grading processes take this test run's machine lock (tests/conftest.py): each timed stretch holds the
# machine alone against every test, not the whole test.
@pytest.mark.timing
@pytest.mark.locks_per_check
def test_a_real_cluster_grades_every_job_once_on_both_workers_and_times_on_the_timing_host(tmp_path, processes,
                                                                                             machine_lock_file):
    """score.py --cluster --timing-host w2: the points a grading earns (the local cluster's run gives the
    same: its tests are tests/test_cheats.py's organiser test and the resume test below), each job once,
    the correctness levels on either worker and every speed level on w2 alone, each result naming the
    machine its speed level was timed on, and every timed stretch alone on its machine."""
    cluster = Cluster(processes, tmp_path, lock=machine_lock_file)
    cluster.add_worker("w1")
    cluster.add_worker("w2")
    subs = submissions(tmp_path, TEAMS)
    cluster.wait_for_workers(2)
    remote, remote_runs = score(tmp_path, subs, "--seed", "7", "--cluster", cluster.address, "--timing-host", "w2",
                                name="remote", lock=machine_lock_file)
    assert points(remote_runs) == {"ada": {"04_dce": 100.0, "05_cse": 100.0}, "bob": {"04_dce": 0.0, "05_cse": 0.0}}, \
        remote.stderr
    assert "ImportError: half done" in remote_runs["bob"]["katas"]["05_cse"]["message"]
    # Each job once: correctness on either worker, both of them grading (each team's jobs prefer a worker of
    # their own: ada's on one, bob's on the other); every speed level on w2 alone. The shipped stub (bob's
    # 04_dce) is judged from its bytes, with no job; bob's 05_cse does not load, so it gets no speed job.
    log = job_log(cluster.log)
    graded = [(team, kata) for team in TEAMS for kata in KATAS if (team, kata) not in STUBS]
    ended = Counter((e["team"], e["kata"], e["phase"]) for e in log if e["event"] == "end")
    assert ended == Counter({**{(team, kata, "correctness"): 1 for team, kata in graded},
                             **{(team, kata, "speed"): 1 for team, kata in graded if (team, kata) != ("bob", "05_cse")}})
    assert len({e["worker"] for e in log if e["phase"] == "correctness"}) == 2
    assert {e["pid"] for e in log if e["phase"] == "speed"} == {cluster.workers["w2"].pid}
    # every graded result names its machines; the stubs none
    assert all(bool(result["machine"]) == ((team, kata) not in STUBS)
               for team, run in remote_runs.items() for kata, result in run["katas"].items())
    assert all(remote_runs[t]["katas"][k]["machines"]["speed"]["host"] for t, k in [("ada", "04_dce"), ("ada", "05_cse")])
    # two workers on one host: each result names its worker too
    assert {remote_runs[t]["katas"][k]["machines"]["speed"]["worker"] for t, k in [("ada", "04_dce"), ("ada", "05_cse")]} \
        == {"w2"}
    assert "(worker w2)" in remote.stderr
    assert all("still the stub" in remote_runs[team]["katas"][kata]["message"] for team, kata in STUBS)
    assert "ada 04_dce (levels 1, 2, 4): 80.0 points in" in remote.stderr and " on " in remote.stderr  # progress: ... on HOST
    assert "| ada " in (tmp_path / "LEADERBOARD.md").read_text()
    beside, _ = lock_replay(tmp_path / "lock.log")
    assert not beside, beside[:3]


def test_a_worker_killed_mid_job_costs_no_kata(tmp_path, processes):
    cluster = Cluster(processes, tmp_path)
    cluster.add_worker("w1")
    cluster.add_worker("w2")
    subs = submissions(tmp_path, TEAMS)
    cluster.wait_for_workers(2)
    organiser = processes(score_command(tmp_path, subs, "--no-speed", "--seed", "7", "--cluster", cluster.address),
                          cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # The first job that starts: kill its worker (SIGKILL, no goodbye) while it grades.
    first = wait_for(lambda: next((e for e in job_log(cluster.log) if e["event"] == "start"), None), 180, "a job")
    victim = next(name for name, w in cluster.workers.items() if w.pid == first["pid"])
    os.kill(cluster.workers[victim].pid, signal.SIGKILL)
    out, err = organiser.communicate(timeout=600)
    assert organiser.returncode == 0, err
    runs = {run["team"]: run for run in json.loads((tmp_path / "run.json").read_text())}
    graded = [(team, kata) for team, run in runs.items() for kata, r in run["katas"].items() if r["status"] == "graded"]
    assert sorted(graded) == sorted((team, kata) for team in TEAMS for kata in KATAS), err
    assert points(runs)["ada"] == {"04_dce": 80.0, "05_cse": 80.0}
    # Each (team, kata) reported once, the killed job included; its grading was finished by the other worker.
    reported = Counter(tuple(line.split("] ", 1)[1].split(":")[0].split()) for line in err.splitlines() if line.startswith("["))
    assert reported == Counter({(team, kata): 1 for team in TEAMS for kata in KATAS}), err
    log = job_log(cluster.log)
    assert any(e["event"] == "start" and (e["team"], e["kata"]) == (first["team"], first["kata"]) and
               e["pid"] != first["pid"] for e in log)


def test_a_lost_scheduler_stops_the_run_and_a_resume_grades_the_rest(tmp_path, processes):
    """SIGKILL the scheduler once a job is graded: score.py stops (exit 3) with a sentence naming the run to
    resume, stores no team's result and writes no leaderboard, and saves no verdict for the jobs it lost;
    resumed on a new scheduler, it grades only those, to the points a run without the fault gives. (Before, the
    lost jobs were saved as "crashed in 0s", stored as each team's run, and a resume found nothing to grade.)"""
    cluster = Cluster(processes, tmp_path)
    cluster.add_worker("w1", threads=1)
    subs = submissions(tmp_path, TEAMS)
    cluster.wait_for_workers(1)
    organiser = processes(score_command(tmp_path, subs, "--no-speed", "--seed", "7", "--cluster", cluster.address),
                          cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "FX_KATAS_MACHINE_LOCK": str(tmp_path / "machine.lock")})
    wait_for(lambda: any(e["event"] == "end" for e in job_log(cluster.log)), 180, "a graded job")
    os.killpg(cluster.scheduler.pid, signal.SIGKILL)
    out, err = organiser.communicate(timeout=300)
    assert organiser.returncode == 3, (out, err)
    run = out.split("--resume ")[1].split(")")[0]
    assert "Stopped: the fleet's scheduler was lost" in err and f"--resume {run} --cluster {cluster.address}" in err, err
    assert not (tmp_path / "LEADERBOARD.md").exists() and not list((tmp_path / "results").glob("*/*.json"))
    saved = {(p.parent.name, p.name.split(".")[0]): json.loads(p.read_text())
             for p in (tmp_path / "results" / ".runs" / run / "jobs").glob("*/[!.]*.json")}
    assert len(saved) < len(TEAMS) * len(KATAS) and not [k for k, r in saved.items() if "crashed" in json.dumps(r)]
    second = tmp_path / "second"
    second.mkdir()
    again = Cluster(processes, second)
    again.add_worker("w2")
    again.wait_for_workers(1)
    proc, runs = score(tmp_path, subs, "--resume", run, "--cluster", again.address, name="resumed")
    assert points(runs) == {"ada": {"04_dce": 80.0, "05_cse": 80.0}, "bob": {"04_dce": 0.0, "05_cse": 0.0}}, proc.stderr
    graded_again = {(e["team"], e["kata"]) for e in job_log(again.log) if e["event"] == "end"}
    assert graded_again == {(team, kata) for team in TEAMS for kata in KATAS} - set(saved), (graded_again, saved)
    assert "| ada " in (tmp_path / "LEADERBOARD.md").read_text()


def lock_replay(path) -> tuple[list, int]:
    """Replay a machine lock's log, in the order its holders wrote it (each line is written while the lock
    is held, so the file's order is the lock's): the times a timed stretch held the lock beside another
    holder, and how many times two processes held it shared at once."""
    holders: dict[int, str] = {}  # pid: "shared" | "exclusive"
    beside, together = [], 0
    for e in job_log(path):
        if e["event"] == "release":
            holders.pop(e["pid"])
        elif e["event"] in ("shared", "exclusive"):
            others = {pid: how for pid, how in holders.items() if pid != e["pid"]}
            if e["event"] == "exclusive" and others or "exclusive" in others.values():
                beside.append((e, others))
            together += e["event"] == "shared" and bool(others)
            holders[e["pid"]] = e["event"]
    assert not holders, f"still held at the end: {holders}"
    return beside, together


@pytest.mark.timing
@pytest.mark.locks_per_check  # its grading processes take this test run's machine lock, as above
def test_a_timed_stretch_never_runs_beside_other_grading_on_its_machine(tmp_path, machine_lock_file):
    """The local cluster (one worker, two threads), one job per (team, kata): the machine lock's log, in the
    order its holders wrote it, shows every timed stretch holding the machine alone, while correctness
    checks of two jobs did run side by side. One team's two katas, graded at once, are the two jobs: a
    second team only added a nursery (torch imported in a sandbox) and the same kind of job."""
    subs = submissions(tmp_path, {"ada": {"04_dce": "reference", "05_cse": "reference"}})
    log, locks = tmp_path / "jobs.log", tmp_path / "lock.log"
    proc, runs = score(tmp_path, subs, "--seed", "3", "--jobs", "2", lock=machine_lock_file,
                       env={"FX_KATAS_JOB_LOG": str(log), "FX_KATAS_LOCK_LOG": str(locks)})
    assert Counter(e["phase"] for e in job_log(log) if e["event"] == "end") == Counter({"all": 2})
    beside, together = lock_replay(locks)
    assert not beside, beside[:3]
    timed = [e for e in job_log(locks) if e["event"] == "exclusive"]
    assert len(timed) >= 2 and all("test_L3_fast" in e["by"] for e in timed), timed  # ada's two speed levels
    assert together > 0  # the jobs did share the machine between timings
    assert runs["ada"]["katas"]["04_dce"]["points"] == 100.0, runs["ada"]["katas"]["04_dce"]["message"]
    assert runs["ada"]["katas"]["05_cse"]["points"] == 100.0, runs["ada"]["katas"]["05_cse"]["message"]
    assert runs["ada"]["katas"]["04_dce"]["machine"]["device_name"]  # the machine its speed level was timed on


def test_the_replay_catches_a_timing_beside_other_grading(tmp_path):
    """The replay above, on a log where a second process held the lock shared during a timed stretch (what
    grading without the lock would write), finds it."""
    log = tmp_path / "lock.log"
    lines = [{"pid": 1, "event": "shared"}, {"pid": 2, "event": "shared"}, {"pid": 1, "event": "release"},
             {"pid": 1, "event": "exclusive"}, {"pid": 1, "event": "release"}, {"pid": 2, "event": "release"}]
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    beside, together = lock_replay(log)
    assert len(beside) == 1 and together == 1


def clone_of_the_grading_files(other):
    """The files a grading process imports or collects (graders/competition/jobs.py, grading_files), copied."""
    from graders.competition.jobs import grading_files

    for path in grading_files():
        (other / path.relative_to(REPO_ROOT)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, other / path.relative_to(REPO_ROOT))


def test_the_project_version_covers_what_a_grading_process_imports_or_collects(tmp_path):
    """A worker clone that drops L3 and L4 from a kata's test file would report 60 points as full marks: its
    version differs, as for graders/, the root conftest.py and pyproject.toml; a learner's solution.py does not count."""
    from graders.competition.jobs import project_version

    clone_of_the_grading_files(tmp_path)
    (tmp_path / "katas" / "03_conv_bn" / "solution.py").write_text("# a solution: not part of the version\n")
    first = project_version(tmp_path)
    assert first == project_version(REPO_ROOT)
    for edited in ("graders/frame/levels.py", "katas/03_conv_bn/test_03_conv_bn.py", "conftest.py", "pyproject.toml"):
        path = tmp_path / edited
        before = path.read_bytes()
        path.write_bytes(before + b"\n# a later commit\n")
        assert project_version(tmp_path) != first, edited
        path.write_bytes(before)
    assert project_version(tmp_path) == first


def test_a_worker_at_another_project_version_is_refused(tmp_path, processes):
    other = tmp_path / "other-clone"
    clone_of_the_grading_files(other)
    test_file = other / "katas" / "03_conv_bn" / "test_03_conv_bn.py"  # L3 and L4 dropped: 60 points as full marks
    test_file.write_text(test_file.read_text().replace("test_L3_fast, test_L4_hidden =", "_, _ ="))
    cluster = Cluster(processes, tmp_path)
    cluster.add_worker("stale", root=other)
    subs = submissions(tmp_path, {"ada": {"04_dce": EDITED_STUB}})
    cluster.wait_for_workers(1)
    proc, runs = score(tmp_path, subs, "--no-speed", "--cluster", cluster.address, katas=["04_dce"])
    result = runs["ada"]["katas"]["04_dce"]
    assert result["status"] == "refused" and result["points"] == 0
    assert "refuses ada's 04_dce: its project version (hash of graders/, conftest.py, pyproject.toml and the katas' " \
        "test files) is" in result["message"]
    assert "REFUSED: worker tcp://127.0.0.1:" in proc.stderr and "check out the organiser's commit" in proc.stderr
    assert "is not encrypted and admits any worker" in proc.stderr  # a tcp:// cluster: the warning (tls below)


def test_resume_grades_only_what_the_killed_organiser_had_not(tmp_path, processes):
    subs = submissions(tmp_path, TEAMS)
    log = tmp_path / "jobs.log"
    env = {**os.environ, "FX_KATAS_JOB_LOG": str(log)}
    organiser = processes(score_command(tmp_path, subs, "--no-speed", "--jobs", "2"), cwd=tmp_path, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    run = organiser.stdout.readline().split("--resume ")[1].rstrip(").\n")
    saved = tmp_path / "results" / ".runs" / run / "jobs"
    # the stub is saved at once (judged from its bytes); then one graded job at least
    wait_for(lambda: len(list(saved.glob("*/[!.]*.json"))) >= 2, 300, "two saved results")
    os.killpg(organiser.pid, signal.SIGKILL)  # the organiser and the cluster in it
    organiser.wait()
    before = {(e["team"], e["kata"]) for e in job_log(log) if e["event"] == "end"}
    stored = {(path.parent.name, path.name.split(".")[0]) for path in saved.glob("*/[!.]*.json")}
    assert len(stored) < len(TEAMS) * len(KATAS)
    (saved / "ada").mkdir(exist_ok=True)
    (saved / "ada" / ".tmp-killed.json").write_text('{"team": "ada", "kata": "05_cse", "phase": "correctness", "resu')
    log.rename(tmp_path / "jobs.before.log")
    # bob finishes 04_dce meanwhile: the result saved for its stub no longer describes its file
    (subs / "bob" / "04_dce" / "solution.py").write_bytes((REPO_ROOT / "reference" / "04_dce" / "solution.py").read_bytes())
    proc, runs = score(tmp_path, subs, "--resume", run, env={"FX_KATAS_JOB_LOG": str(log)}, name="resumed")
    again = {(e["team"], e["kata"]) for e in job_log(log) if e["event"] == "start"}
    everything = {(team, kata) for team in TEAMS for kata in KATAS}
    assert again == everything - stored | {("bob", "04_dce")}, (again, stored)
    assert f"Resuming run {run}: {len(stored) - 1} of {len(everything)} jobs already graded" in proc.stderr
    assert f"bob 04_dce: its solution file is not the one run {run} graded" in proc.stderr
    assert points(runs)["ada"] == {"04_dce": 80.0, "05_cse": 80.0} and len({r["seed"] for r in runs.values()}) == 1
    assert points(runs)["bob"] == {"04_dce": 80.0, "05_cse": 0.0}  # its files' points, beside its files' hash
    assert before >= stored - STUBS


def test_the_fleet_grades_one_teams_files_for_a_service():
    """Fleet.grade, as a live service calls it: files in, a summary per kata out, on_result as each finishes."""
    from graders.competition.fleet import Fleet

    files = {"04_dce/solution.py": (REPO_ROOT / "katas" / "04_dce" / "solution.py").read_bytes(),
             "05_cse/solution.py": b"def eliminate(gm)\n"}
    seen = []
    import psutil

    def listening() -> set:
        return {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections() if c.status == "LISTEN"}

    before = listening()
    with Fleet(slots=2) as fleet:
        # the embedded cluster: in-process transport, and whatever Dask opens all the same on loopback alone
        opened = listening() - before
        assert fleet.client.scheduler.address.startswith("inproc://") and opened
        assert {ip for ip, _ in opened} <= {"127.0.0.1", "::1"}, opened
        summaries = fleet.grade("ada", files, KATAS, seed=1, speed=False,
                                on_result=lambda team, kata, summary: seen.append((team, kata, summary["points"])))
    assert sorted(seen) == [("ada", "04_dce", 0.0), ("ada", "05_cse", 0.0)]
    assert "still the stub" in summaries["04_dce"]["message"] and "does not compile" in summaries["05_cse"]["message"]
    assert summaries["05_cse"]["machine"]["host"] and summaries["04_dce"]["levels"]["3"] == [0.0, 20.0]
    assert summaries["04_dce"]["machine"] is None  # the shipped stub: judged from its bytes, no job


def test_a_solution_that_hangs_loading_costs_its_kata_little_and_is_not_loaded_for_speed(tmp_path):
    """It hangs without spinning (the CPU stays with the other tests); its job gives up on it within one
    check's time-out (the organiser's --check-timeout, here 8 s instead of each check's 60 s), and its later
    checks, the speed level's too, fail at once without loading it again."""
    subs = submissions(tmp_path, {"ada": {"04_dce": "import queue\n\nqueue.Queue().get()\n"}})
    log = tmp_path / "jobs.log"
    proc, runs = score(tmp_path, subs, "--seed", "3", "--check-timeout", "8", katas=["04_dce"],
                       env={"FX_KATAS_JOB_LOG": str(log)})
    result = runs["ada"]["katas"]["04_dce"]
    # one check's time-out, not one per check (04_dce has a dozen checks) nor the kata's (900 s)
    assert result["points"] == 0 and result["seconds"] < 40, (result["seconds"], result["message"])
    assert "timed out: importing the solution did not finish" in result["message"]
    assert [e["phase"] for e in job_log(log) if e["event"] == "start"] == ["all"]
    speed = [c for c in result["checks"] if c["level"] == 3]
    assert speed and all("timed out: importing the solution" in c["message"] for c in speed), speed


def test_a_solution_that_takes_its_machine_down_again_and_again_crashes_the_grader_alone(tmp_path, processes):
    """Whenever ada's 04_dce is being graded, its worker process dies (SIGKILL, as the kernel's OOM killer
    would); the nanny starts it again. With the scheduler allowing one such failure, the second comes
    back as "crashed the grader" with its reason, and ada's other kata and bob's are graded as usual."""
    # Dask charges a worker's death to every job it holds, running or queued there (docs/organisers.md, "Faults"): one
    # thread per worker, and the scheduler sends a worker no more jobs than it has threads, so the
    # culprit is the only job a killed worker holds.
    settings = {"DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "1", "DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION": "1.0"}

    def start(command, **options):  # the scheduler reads the settings; workers keep their own environment
        return processes(command, env={**options.pop("env", os.environ), **settings}, **options)

    cluster = Cluster(start, tmp_path)
    cluster.add_worker("w1", nanny=True, threads=1)
    cluster.add_worker("w2", nanny=True, threads=1)
    subs = submissions(tmp_path, {"ada": {"04_dce": "reference", "05_cse": "reference"}, "bob": {"04_dce": "reference"}})
    cluster.wait_for_workers(2)
    organiser = processes(score_command(tmp_path, subs, "--no-speed", "--seed", "7", "--cluster", cluster.address),
                          cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "FX_KATAS_MACHINE_LOCK": str(tmp_path / "machine.lock")})
    killed: set[int] = set()
    while organiser.poll() is None:
        for e in job_log(cluster.log):
            if e["event"] == "start" and (e["team"], e["kata"]) == ("ada", "04_dce") and e["pid"] not in killed:
                killed.add(e["pid"])
                try:
                    os.kill(e["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass
        time.sleep(0.1)
    out, err = organiser.communicate()
    assert organiser.returncode == 0, err
    runs = {run["team"]: run for run in json.loads((tmp_path / "run.json").read_text())}
    crashed = runs["ada"]["katas"]["04_dce"]
    assert crashed["status"] == "crashed the grader" and crashed["points"] == 0, crashed
    assert "04_dce's solution took down the machine grading it again and again" in crashed["message"]
    assert len(killed) == 2  # allowed-failures 1: the second death is final
    others = {(team, kata): runs[team]["katas"][kata] for team, kata in [("ada", "05_cse"), ("bob", "04_dce")]}
    assert all(r["points"] == 80.0 for r in others.values()), {k: (r["status"], r["message"]) for k, r in others.items()}
    for name in cluster.workers:
        cluster.stop_worker(name)


def test_the_fleets_key_is_its_owners_alone_and_missing_certificates_are_named(tmp_path):
    """score.py --make-certificates: fleet.pem holds the fleet's private key, so only its owner may read it (0600,
    whatever the umask, and over an older fleet.pem that was not); ca.pem is the authority's certificate alone, no key in it (the authority's key is not
    kept). --certificates on a folder without them names the missing files and the command that makes them."""
    from graders.competition.certificates import make, security

    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / "fleet.pem").write_text("an older fleet's, left readable")
    (tmp_path / "certs" / "fleet.pem").chmod(0o644)
    old = os.umask(0o022)
    try:
        ca, fleet = make(tmp_path / "certs")  # over the old one: a new fleet makes new certificates
    finally:
        os.umask(old)
    assert fleet.stat().st_mode & 0o777 == 0o600
    assert b"PRIVATE KEY" in fleet.read_bytes() and b"PRIVATE KEY" not in ca.read_bytes()
    assert ca.read_bytes().count(b"BEGIN CERTIFICATE") == 1
    with pytest.raises(FileNotFoundError, match=r"no ca\.pem or fleet\.pem there .*--make-certificates"):
        security(tmp_path / "empty")
    (tmp_path / "half").mkdir()
    shutil.copy(ca, tmp_path / "half" / "ca.pem")
    with pytest.raises(FileNotFoundError, match=r"no fleet\.pem there"):
        security(tmp_path / "half")


def test_a_tls_fleet_admits_only_workers_holding_its_certificate(tmp_path, processes):
    """Across machines the scheduler listens on tls:// and every peer presents the fleet's certificate
    (score.py --make-certificates; graders/competition/certificates.py): a worker without one, or with another
    fleet's, never joins and is never given a job (before, anyone who reached the port could join, read the
    seed and the teams' files and return forged points). score.py grades over it with --certificates (a plain
    tcp:// cluster gets a warning that says what it admits: the version test above)."""
    from distributed import Client

    from graders.competition.certificates import make, security

    ours, theirs = tmp_path / "certs", tmp_path / "other"
    ca, fleet = make(ours)
    other_ca, other_fleet = make(theirs)

    def tls(ca_file, cert):
        return ["--tls-ca-file", str(ca_file), "--tls-cert", str(cert), "--tls-key", str(cert)]

    file = tmp_path / "scheduler.json"
    start = lambda command, log: processes(command, stdout=subprocess.DEVNULL, stderr=open(tmp_path / log, "w"))  # noqa: E731
    start([sys.executable, "-m", "distributed.cli.dask_scheduler", "--protocol", "tls", "--host", "127.0.0.1",
           "--port", "0", "--no-dashboard", "--scheduler-file", str(file), *tls(ca, fleet)], "scheduler.err")
    address = wait_for(lambda: file.exists() and json.loads(file.read_text() or "{}").get("address"), 60, "the scheduler")
    assert address.startswith("tls://127.0.0.1:")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "FX_KATAS_MACHINE_LOCK": str(tmp_path / "machine.lock")}
    workers = {}
    for name, options in (("trusted", tls(ca, fleet)), ("bare", []), ("stranger", tls(other_ca, other_fleet))):
        workers[name] = processes([sys.executable, "-m", "distributed.cli.dask_worker", address, "--name", name, "--nthreads", "2",
                   "--no-nanny", "--no-dashboard", "--host", "127.0.0.1", "--local-directory", str(tmp_path / name),
                   *options], cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL,
                  stderr=open(tmp_path / f"{name}.err", "w"))
    with pytest.raises(Exception):  # noqa: B017 - no certificate, no connection (whatever Dask raises for it)
        Client(address, timeout=3)
    # The failed Client is garbage in a cycle (the traceback). Collected later, its __del__ takes the class-wide lock
    # of Dask's LoopRunner: if the collector happens to run in the next Client's new IO-loop thread while that
    # Client's start() holds the lock, start() gives up after 10 s ("assert loop is not None"; seen on CI, and
    # reproduced by collecting in that thread). Collect it here, in this thread, before any lock is held.
    gc.collect()
    with Client(address, timeout=30, security=security(ours)) as client:
        client.wait_for_workers(1, timeout=120)
        # The others have tried by now: the bare one gave up (no certificate, no connection) and the stranger was
        # refused (it tries again and again, to the end of the test). A fixed 3 s sleep waited here before: on a busy
        # machine the stranger might not have tried yet.
        wait_for(lambda: workers["bare"].poll() is not None and "TLS handshake failed" in
                 (tmp_path / "scheduler.err").read_text(), 120, "the bare worker to give up and the stranger to be refused")
        assert sorted(w["name"] for w in client.scheduler_info()["workers"].values()) == ["trusted"]
    subs = submissions(tmp_path, {"ada": {"05_cse": "reference"}})
    proc, runs = score(tmp_path, subs, "--cluster", address, "--certificates", str(ours), "--no-speed",
                       katas=["05_cse"])
    assert points(runs) == {"ada": {"05_cse": 80.0}} and "Warning" not in proc.stderr
    assert runs["ada"]["katas"]["05_cse"]["machine"]["worker"] == "trusted"
