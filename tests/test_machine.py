"""What a fleet worker machine runs its grading with: the machine lock (graders/frame/machinelock.py) and
grading processes forked from the zygote (graders/batch/zygote.py), with real processes and real files."""
import argparse
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from graders.batch.processes import run_katas
from graders.frame.catalogue import REPO_ROOT
from graders.frame.machinelock import MachineLock
from waiting import running, wait_for


def events(log: Path) -> list[tuple[str, str]]:
    return [(line["by"], line["event"]) for line in map(json.loads, log.read_text().splitlines())]


def test_a_timing_waits_for_the_checks_that_run_and_goes_before_those_that_start_after(tmp_path):
    """Three holders of one machine lock (each its own open file, as three processes have): a check holds it
    shared; a timing asks for it alone and waits; a check that starts after the timing asked waits behind
    it (the turnstile), so the timing runs as soon as the first check ends."""
    path, log = tmp_path / "machine.lock", tmp_path / "lock.log"
    check, timing, later = (MachineLock(path, log) for _ in range(3))
    check.label, timing.label, later.label = "check", "timing", "later"
    check.take(exclusive=False)
    timer = threading.Thread(target=lambda: (timing.take(exclusive=True), time.sleep(0.2), timing.release()))
    timer.start()
    wait_for(lambda: held(timing.turnstile), 15, "the timing to wait in the turnstile")
    follower = threading.Thread(target=lambda: (later.take(exclusive=False), later.release()))
    follower.start()
    time.sleep(0.3)
    assert timing.exclusive is None and later.exclusive is None  # both still wait
    check.release()
    timer.join(10)
    follower.join(10)
    assert events(log) == [("check", "shared"), ("timing", "wait"), ("check", "release"), ("timing", "exclusive"),
                           ("timing", "release"), ("later", "shared"), ("later", "release")]


def held(path: Path) -> bool:
    """Whether an open file holds `path`'s flock: a try of our own that must not wait fails."""
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_CREAT, 0o666), "rb") as probe:
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False  # closing the probe lets go


def test_holding_it_shared_a_process_turns_it_exclusive_and_back(tmp_path):
    """hold(exclusive=True) inside a shared hold lets go first (no deadlock with another timing that waits),
    and holds it shared again after; a hold it already has is a no-op."""
    lock = MachineLock(tmp_path / "machine.lock", tmp_path / "lock.log")
    lock.take(exclusive=False)
    with lock.hold(exclusive=True):
        assert lock.exclusive is True
        with lock.hold(exclusive=False):
            assert lock.exclusive is True
    assert lock.exclusive is False
    lock.close()
    assert [event for _, event in events(tmp_path / "lock.log")] == [
        "shared", "release", "wait", "exclusive", "release", "shared", "release"]


def grading_args(**options) -> argparse.Namespace:
    return argparse.Namespace(**{"device": "cpu", "threads": 1, "no_speed": True, "isolate": True, "kata_timeout": 900.0,
                                 "kata_memory": 8.0, **options})


def test_a_forked_grading_process_grades_as_a_started_one(tmp_path):
    """The same kata, solution and seed: a grading process forked from the zygote and one started with
    `python -m pytest` give the same records, check by check. Not isolated: where the solution runs is not
    what differs (a forked grading process's sandboxed workers: tests/test_fleet.py, tests/test_cheats.py),
    and two sandboxed workers started one by one would double the test's CPU."""
    tree = tmp_path / "tree"
    (tree / "05_cse").mkdir(parents=True)
    (tree / "05_cse" / "solution.py").write_text((REPO_ROOT / "reference" / "05_cse" / "solution.py").read_text())
    started, _ = run_katas(["05_cse"], tree, grading_args(isolate=False), 11, None)
    forking = grading_args(isolate=False, fork=True, machine_lock=tmp_path / "machine.lock")
    forked, again = run_katas(["05_cse"], tree, forking, 11, None)
    assert again == []
    as_data = lambda records: [(r.test_id, r.passed, r.points, r.message) for r in records]  # noqa: E731
    assert as_data(forked["05_cse"]) == as_data(started["05_cse"])
    assert round(sum(r.points for r in forked["05_cse"]), 6) == 80.0


PROBE = """
import os
import sys
from pathlib import Path

from graders.frame.catalogue import REPO_ROOT
from graders.run.session import grade


def test_probe():
    before = set(sys.modules)
    results = grade("05_cse", REPO_ROOT / "reference", levels=(1, 2, 4), seed=1)
    assert results and all(r.passed for r in results), [r.message for r in results if not r.passed]
    Path(os.environ["PROBE_OUT"]).write_text("\\n".join(sorted(set(sys.modules) - before)))
"""


def test_a_forked_grading_process_imports_nothing_the_zygote_could_have(tmp_path):
    """The zygote pays torch's lazy first uses once (graders/batch/zygote.py): a grading in a forked process
    imports no module but the solution's (before, the first comparison imported torch.distributed.tensor,
    sympy and 500 more: 1.4 s of CPU in each grading process)."""
    from graders.batch.zygote import ForkedProcess

    (tmp_path / "test_probe.py").write_text(PROBE)
    out = tmp_path / "imported.txt"
    process = ForkedProcess(["-q", "-p", "no:cacheprovider", str(tmp_path / "test_probe.py")], tmp_path / "log.txt",
                            {**os.environ, "PROBE_OUT": str(out)}, 8.0)
    assert process.wait(120) == 0, (tmp_path / "log.txt").read_text()
    assert [name for name in out.read_text().split() if not name.startswith("kata_solution_")] == []


def workers(tree: Path) -> list[int]:
    """The pids of the sandboxed worker processes running a solution of `tree`."""
    found = subprocess.run(["pgrep", "-f", f"graders.isolation.serve {tree}"], capture_output=True, text=True).stdout
    return [int(pid) for pid in found.split()]


def test_a_forked_grading_process_that_hangs_is_stopped_with_its_worker(tmp_path):
    """A solution that hangs in every call: the kata's time-out stops the forked grading process's whole
    group (judge and sandboxed worker), and says so."""
    tree = tmp_path / "tree"
    (tree / "04_dce").mkdir(parents=True)
    (tree / "04_dce" / "solution.py").write_text("import time\n\ndef eliminate_dead_code(gm):\n    time.sleep(3600)\n")
    started = time.monotonic()
    outcomes, _ = run_katas(["04_dce"], tree, grading_args(fork=True, kata_timeout=8.0), 3, None)
    assert time.monotonic() - started < 30
    assert outcomes["04_dce"]["status"] == "timed out" and "did not finish within 8s" in outcomes["04_dce"]["message"]
    assert workers(tree) == []


CLIENT = """
import os, sys, time
from pathlib import Path
from graders.batch.zygote import ForkedProcess
process = ForkedProcess(["-q", "-p", "no:cacheprovider", "katas/04_dce/test_04_dce.py", "--solutions", sys.argv[1],
                         "--isolate", "--no-speed"], Path(sys.argv[2]), dict(os.environ), 8.0)
print(process.zygote.process.pid, process.pid, flush=True)
time.sleep(3600)
"""


def test_the_zygote_and_its_grading_processes_die_with_the_process_that_started_them(tmp_path):
    """A fleet worker killed mid-job (SIGKILL) leaves nothing grading on its machine: its zygote sees the
    pipe close and exits, and the grading process it forked dies with it."""
    tree = tmp_path / "tree"
    (tree / "04_dce").mkdir(parents=True)
    (tree / "04_dce" / "solution.py").write_text("import time\n\ndef eliminate_dead_code(gm):\n    time.sleep(3600)\n")
    client = subprocess.Popen([sys.executable, "-c", CLIENT, str(tree), str(tmp_path / "output")], cwd=REPO_ROOT,
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    zygote, grading = map(int, client.stdout.readline().split())
    deadline = time.monotonic() + 60
    while not workers(tree):  # its first check runs: the solution's sandboxed worker is up
        assert time.monotonic() < deadline, "the grading process never started its checks"
        time.sleep(0.2)
    worker = workers(tree)[0]
    client.send_signal(signal.SIGKILL)
    client.wait()

    wait_for(lambda: not any(map(running, (zygote, grading, worker))), 20, "the zygote, the grading process and "
             "its worker to die with the process that started them", every=0.2)


def nursery_tree(tmp_path, kata: str, source: str):
    from graders.isolation.nursery import open_nursery

    tree, sockets = tmp_path / "solutions", tmp_path / "sockets"
    (tree / kata).mkdir(parents=True)
    sockets.mkdir()
    (tree / kata / "solution.py").write_text(source)
    return tree, open_nursery(tree, sockets)


def nursery_processes(nursery) -> int:
    """How many processes run the nursery's command line: the nursery, bubblewrap's around it, its workers."""
    found = subprocess.run(["pgrep", "-f", f"graders.isolation.nursery {nursery.socket_path}"], capture_output=True,
                           text=True).stdout
    return len(found.split())


DAEMON = """import os, time

if os.fork() == 0:
    os.setsid()
    os.execv("/bin/sleep", ["sleep", "4321.5"])


def eliminate_dead_code(gm):
    time.sleep(3600)
"""


def test_a_nursery_worker_dies_when_its_judge_lets_go_and_leaves_nothing_running(tmp_path):
    """A worker forked by a team's nursery, whose solution starts a daemon in a session of its own and then
    hangs in its pass: when the judge stops it (as after a time-out), the nursery kills the worker, and the
    daemon it left goes too (in the sandbox, nothing outlives its worker)."""
    from graders.isolation.nursery import open_nursery  # noqa: F401 - the module under test
    from graders.isolation.sandbox import bwrap
    from graders.isolation.worker import Worker

    tree, nursery = nursery_tree(tmp_path, "04_dce", DAEMON)
    try:
        alone = nursery_processes(nursery)  # the nursery (and bubblewrap's two processes around it)
        worker = Worker(tree / "04_dce" / "solution.py", "04_dce", nursery=nursery.socket_path)
        worker.start(60)
        assert worker.load_failure is None
        daemon = lambda: subprocess.run(["pgrep", "-f", "sleep 4321.5"], capture_output=True).returncode == 0  # noqa: E731
        # The daemon's process carries the nursery's command line until it runs sleep (the worker says hello as soon as
        # its import returns, maybe before the child it forked got that far): counted before, it read one too many.
        wait_for(daemon, 15, "the solution's daemon to run sleep")
        assert nursery_processes(nursery) == alone + 1  # and this worker
        worker.stop()
        wait_for(lambda: nursery_processes(nursery) == alone, 15, "the worker to end")
        if bwrap():  # the sweep needs the sandbox's own process namespace
            wait_for(lambda: not daemon(), 15, "the daemon to be swept")
    finally:
        nursery.close()
        subprocess.run(["pkill", "-f", "sleep 4321.5"])
    assert nursery.process.returncode is not None


NURSERY_PROBE = """import sys
from graders.isolation.torch_private import FIRST_USE_MODULES
LOADED = sum(name in sys.modules for name in FIRST_USE_MODULES)  # when the worker imported this file


def loaded():
    return LOADED
"""


def test_a_nursery_loads_the_torch_internals_of_katas_10_to_13_once_at_its_first_worker_of_one(tmp_path):
    """A kata-13 worker imports Inductor's pattern matcher and Dynamo with its solution (2 s of its start): the
    nursery loads them at its first request for a worker of katas 10-13, and each worker forked after finds them
    loaded before its solution is imported; a nursery asked for other katas' workers only never loads them."""
    from graders.isolation import records
    from graders.isolation.worker import Worker

    tree, nursery = nursery_tree(tmp_path, "04_dce", NURSERY_PROBE)
    (tree / "13_sdpa_pattern").mkdir()
    (tree / "13_sdpa_pattern" / "solution.py").write_text(NURSERY_PROBE)
    found = []
    try:
        for kata in ("04_dce", "13_sdpa_pattern", "04_dce"):
            worker = Worker(tree / kata / "solution.py", kata, nursery=nursery.socket_path)
            worker.start(60)
            reply = worker.request({"kind": "call", "function": "loaded", "args": (), "watch": ()}, 60)
            found.append(records.rebuild_values(reply["values"])["result"])
            worker.stop()
    finally:
        nursery.close()
    assert found == [0, 3, 3]


def test_a_nursery_worker_that_is_killed_is_reported_with_its_signal(tmp_path):
    """A solution that kills its own worker process: the nursery tells the judge how it died."""
    from graders.isolation.worker import Worker

    source = "import os, signal\n\ndef eliminate_dead_code(gm):\n    os.kill(os.getpid(), signal.SIGKILL)\n"
    tree, nursery = nursery_tree(tmp_path, "04_dce", source)
    try:
        worker = Worker(tree / "04_dce" / "solution.py", "04_dce", nursery=nursery.socket_path)
        import torch.fx as fx
        import torch

        gm = fx.symbolic_trace(torch.nn.ReLU())
        from graders.isolation.worker import WorkerFailed

        try:
            worker.request({"kind": "call", "function": "eliminate_dead_code", "args": (gm,), "watch": ()}, 60)
        except WorkerFailed as failure:
            message = str(failure)
        else:
            raise AssertionError("the worker's death went unnoticed")
        assert "died while eliminate_dead_code ran (killed by SIGKILL)" in message
    finally:
        nursery.close()


def test_each_teams_tree_gets_a_nursery_of_its_own_and_idle_ones_are_closed(tmp_path):
    """team_nursery: the same team's tree shares one nursery (and its folder) across jobs; another team, or the
    same team's other tree, gets its own; beyond KEEP_IDLE idle ones, the oldest are closed."""
    from graders.competition import nurseries

    source = (REPO_ROOT / "katas" / "04_dce" / "solution.py").read_bytes()
    seen = {}
    for key in ["ada\0tree1", "ada\0tree1", "bob\0tree1", "ada\0tree2"]:
        with nurseries.team_nursery(key, "04_dce", source) as (tree, socket_path):
            assert (tree / "04_dce" / "solution.py").read_bytes() == source
            assert socket_path is not None and socket_path.exists()
            seen.setdefault(key, set()).add(socket_path)
    assert all(len(paths) == 1 for paths in seen.values())
    assert len({path for paths in seen.values() for path in paths}) == 3
    assert len(nurseries._teams) == nurseries.KEEP_IDLE and "ada\0tree1" not in nurseries._teams
    nurseries.close_all()
    assert not any(path.exists() for paths in seen.values() for path in paths)


def test_jobs_of_one_tree_that_stage_its_file_at_once_each_get_it_whole(monkeypatch):
    """A team that submits one file twice: two jobs of one tree (one key, one folder) stage its kata's solution file
    at the same moment. Each gets the whole file and none fails. Before, both wrote one `solution.part` and the second
    rename found it gone: that job failed and the resubmission scored 0 (tests/test_arena_load.py, once in a full run;
    eight jobs at a barrier failed 49 rounds of 50)."""
    from graders.competition import nurseries

    class Started:  # no sandbox: what is claimed here is the staging
        socket_path = None

        def alive(self):
            return True

        def close(self):
            pass

    monkeypatch.setattr(nurseries, "_start", lambda solutions, sockets, limits: Started())
    source = (REPO_ROOT / "reference" / "04_dce" / "solution.py").read_bytes()
    for round_ in range(5):
        key, barrier, outcomes = f"ada\0one file twice {round_}", threading.Barrier(8), []

        def job():
            barrier.wait()
            try:
                with nurseries.team_nursery(key, "04_dce", source) as (tree, _):
                    outcomes.append(((tree / "04_dce" / "solution.py").read_bytes() == source, tree))
            except Exception as exc:  # noqa: BLE001 - the failure this test is about
                outcomes.append((repr(exc), None))

        threads = [threading.Thread(target=job) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert [whole for whole, _ in outcomes] == [True] * 8, outcomes
        assert len({tree for _, tree in outcomes}) == 1  # one tree, one folder
        assert sorted(p.name for p in (outcomes[0][1] / "04_dce").iterdir()) == ["solution.py"]  # nothing left over
    nurseries.close_all()


def test_without_a_nursery_a_job_still_grades_its_workers_started_one_by_one(tmp_path, monkeypatch):
    """A nursery that cannot start (here: a socket path longer than a Unix socket allows) costs speed, not
    points: team_nursery hands out no socket, and the judge starts each worker itself."""
    from graders.competition import nurseries
    from graders.isolation.nursery import open_nursery

    long = tmp_path / ("x" * 120)
    long.mkdir()
    try:
        open_nursery(tmp_path, long)
    except ValueError as exc:
        assert "longer than a Unix socket's 107 bytes" in str(exc)
    else:
        raise AssertionError("a nursery started on a socket path too long for it")
    monkeypatch.setattr(nurseries, "_start", lambda solutions, sockets: open_nursery(solutions, long))
    source = (REPO_ROOT / "reference" / "05_cse" / "solution.py").read_bytes()
    with nurseries.team_nursery("ada\0long", "05_cse", source) as (tree, socket_path):
        assert socket_path is None
        outcomes, _ = run_katas(["05_cse"], tree, grading_args(fork=True, nursery=socket_path), 11, None)
    assert round(sum(r.points for r in outcomes["05_cse"]), 6) == 80.0
    nurseries.close_all()


def test_a_sockets_folder_left_by_a_killed_process_is_removed_by_the_next_one(tmp_path):
    """A fleet worker killed with its nurseries leaves their socket folders in /tmp; the next process that
    makes one removes every folder whose claim no living process holds, and none that is held."""
    from graders.competition import nurseries

    script = ("import os, signal\nfrom graders.competition.nurseries import _sockets_folder\n"
              "folder, claim = _sockets_folder()\nprint(folder, flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n")
    killed = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    left = Path(killed.stdout.strip())
    assert left.is_dir() and (left / "owner").exists()
    held, claim = nurseries._sockets_folder()  # the sweep runs first, then makes this one
    try:
        assert not left.exists() and held.is_dir()
        again, other = nurseries._sockets_folder()
        assert held.is_dir()  # held by this process: not swept
        other.close()
        shutil.rmtree(again)
    finally:
        claim.close()
        shutil.rmtree(held, ignore_errors=True)


def test_an_idle_nursery_is_closed_though_no_other_job_ends(tmp_path, monkeypatch):
    """An idle team's nursery (~690 MB) stayed until another job ended on its machine; now it goes
    IDLE_SECONDS after its last job whatever else happens, its folder with it."""
    from graders.competition import nurseries

    monkeypatch.setattr(nurseries, "IDLE_SECONDS", 0.5)
    source = (REPO_ROOT / "katas" / "04_dce" / "solution.py").read_bytes()
    with nurseries.team_nursery("ada\0idle", "04_dce", source) as (tree, socket_path):
        nursery = nurseries._teams["ada\0idle"].started.result()
        assert nursery_processes(nursery) > 0
    wait_for(lambda: "ada\0idle" not in nurseries._teams and not tree.exists(), 10, "the idle team to be closed")
    wait_for(lambda: nursery_processes(nursery) == 0, 10, "the idle nursery to end")


ZYGOTE_IDLE = """
import os, sys, time
from pathlib import Path
from graders.batch.zygote import ForkedProcess
def grade(n):
    process = ForkedProcess(["-q", "-p", "no:cacheprovider", sys.argv[1]], Path(sys.argv[2]) / f"log{n}", dict(os.environ), 8.0)
    assert process.wait(120) == 0, (Path(sys.argv[2]) / f"log{n}").read_text()
    return process.zygote
first = grade(1)
first.process.wait(60)  # idle: it exits by itself
second = grade(2)  # and the next grading starts a new one
print(first.process.returncode, first.process.pid != second.process.pid, flush=True)
"""


def test_an_idle_zygote_exits_and_the_next_grading_starts_another(tmp_path):
    """A fleet machine kept its zygote (~650 MB) for as long as its worker lived; now the zygote exits once
    it has had no child and no request for FX_KATAS_ZYGOTE_IDLE seconds, and the next grading forks from a new one."""
    (tmp_path / "test_probe.py").write_text("def test_nothing():\n    pass\n")
    out = subprocess.run([sys.executable, "-c", ZYGOTE_IDLE, str(tmp_path / "test_probe.py"), str(tmp_path)],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=180,
                         env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "FX_KATAS_ZYGOTE_IDLE": "1"})
    assert out.stdout.split() == ["0", "True"], out.stderr[-2000:]


FIRST_USE = """
import os, sys
from pathlib import Path
from graders.batch.zygote import ForkedProcess
probe, folder = sys.argv[1], Path(sys.argv[2])
for n, kata in enumerate(["04_dce", "13_sdpa_pattern", "04_dce"]):
    process = ForkedProcess(["-q", "-p", "no:cacheprovider", probe], folder / f"log{n}",
                            {**os.environ, "PROBE_OUT": str(folder / f"found{n}")}, 8.0, katas=[kata])
    assert process.wait(120) == 0, (folder / f"log{n}").read_text()
    print((folder / f"found{n}").read_text(), flush=True)
"""
FIRST_USE_PROBE = """
import os, sys
from pathlib import Path
from graders.isolation.torch_private import FIRST_USE_MODULES
def test_probe():
    Path(os.environ["PROBE_OUT"]).write_text(str(sum(name in sys.modules for name in FIRST_USE_MODULES)))
"""


def test_a_zygote_loads_the_torch_internals_of_katas_10_to_13_once_at_its_first_grading_of_one(tmp_path):
    """Katas 10-13 import Dynamo (and 13 Inductor's pattern matcher) on first use, about 3 s of CPU in each of
    their grading processes: the zygote loads them before it forks the first grading process of such a kata, and
    every process it forks after that finds them loaded. A zygote that grades other katas only never loads them."""
    (tmp_path / "test_probe.py").write_text(FIRST_USE_PROBE)
    out = subprocess.run([sys.executable, "-c", FIRST_USE, str(tmp_path / "test_probe.py"), str(tmp_path)],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=180,
                         env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert out.stdout.split() == ["0", "3", "3"], out.stderr[-2000:]


def test_run_katas_tells_the_zygote_which_katas_each_process_grades(tmp_path, monkeypatch):
    """What the rule above reads: each forked process's request names the katas it will grade (here a process
    that ends at once, so nothing is graded)."""
    from graders.batch import processes

    asked = []

    class Ended:
        def __init__(self, args, output, env, memory_gb, device="cpu", katas=()):
            asked.append(sorted(katas))
            self.pid, self.returncode = os.getpid(), 1

        def poll(self):
            return self.returncode

        def wait(self, timeout=None):
            return self.returncode

    monkeypatch.setattr(processes, "ForkedProcess", Ended)
    outcomes, _ = run_katas(["04_dce", "13_sdpa_pattern"], tmp_path, grading_args(fork=True), 0, None, processes=2)
    assert asked == [["04_dce", "13_sdpa_pattern"]] * 2
    assert {outcome["status"] for outcome in outcomes.values()} == {"crashed"}


CLAIMER = """
import sys, time
from pathlib import Path
from graders.frame.scratch import claim_folder
folder, claim = claim_folder("fx-katas-test-", Path(sys.argv[1]))
(folder / "solution.py").write_text("a team's file")
print(folder, flush=True)
time.sleep(3600)
"""


def test_a_scratch_folder_of_a_killed_process_is_removed_by_the_next_one_and_a_living_one_is_not(tmp_path):
    """A SIGKILL runs no clean-up: score.py's staging folder (every team's solution.py) and the grading
    processes' scratch (the run's seed) stayed in /tmp. Claimed folders (graders/frame/scratch.py) go at
    the next claim of their prefix once their process is dead, and never while it lives."""
    from graders.frame.scratch import claim_folder, claimed_folder

    def start():
        process = subprocess.Popen([sys.executable, "-c", CLAIMER, str(tmp_path)], cwd=REPO_ROOT, text=True,
                                   stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
        return process, Path(process.stdout.readline().strip())

    killed, killed_folder = start()
    living, living_folder = start()
    killed.kill()
    killed.wait()
    try:
        with claimed_folder("fx-katas-test-", tmp_path) as mine:
            assert not killed_folder.exists() and (living_folder / "solution.py").exists() and mine.exists()
        assert not mine.exists()
    finally:
        living.kill()
        living.wait()
    folder, claim = claim_folder("fx-katas-test-", tmp_path)
    claim.close()
    assert not living_folder.exists() and folder.exists()


HOARDER = """import os

def eliminate_dead_code(gm):
    written = 0
    try:
        with open("/tmp/hoard", "wb") as out:
            for _ in range(1024):
                out.write(bytes(2**20))
                out.flush()
                written += 2**20
    except OSError:
        pass
    try:
        with open(SOCKETS + "/hoard", "wb") as out:
            out.write(bytes(2**20))
        host = "written"
    except OSError as error:
        host = type(error).__name__
    raise RuntimeError(f"tmp {written // 2**20} MiB, sockets folder {host}")
"""


def test_a_team_s_scratch_is_capped_and_nothing_of_the_host_is_writable(tmp_path):
    """A solution wrote 5 GiB into its sandbox's /tmp (memory, capped at half the machine per sandbox) and
    1 GiB into its nursery's socket folder on the host disk. /tmp is capped (sandbox.TMP_BYTES) and the socket
    is handed in as an open descriptor: its folder is not in the sandbox at all."""
    from graders.isolation.sandbox import TMP_BYTES, sandbox_problem
    from graders.run.session import grade

    if sandbox_problem():
        pytest.skip(sandbox_problem())
    sockets = tmp_path / "sockets"
    tree, nursery = nursery_tree(tmp_path, "04_dce", HOARDER.replace("SOCKETS", repr(str(sockets))))
    try:
        results = grade("04_dce", tree, seed=0, isolate=True, nursery=nursery.socket_path, levels=(1,))
    finally:
        nursery.close()
    message = next(r.message for r in results if "MiB" in r.message)
    assert f"tmp {TMP_BYTES // 2**20} MiB" in message or f"tmp {TMP_BYTES // 2**20 - 1} MiB" in message, message
    assert "sockets folder written" not in message and not (sockets / "hoard").exists(), message


LONG_LIVED = """
import gc
from graders.frame.lifetimes import long_lived
with long_lived("imports"):
    assert not gc.isenabled(), "the collector runs inside long_lived"
    import torch
    try:
        import triton  # what Inductor brings: nanobind bindings, which print leaks of what is alive at exit
    except ImportError:
        pass
frozen = gc.get_freeze_count()
assert gc.isenabled() and frozen > 100_000, (gc.isenabled(), frozen)
with long_lived("imports"):  # only a process's first block of a name freezes
    assert gc.isenabled()
    kept = [object() for _ in range(10)]
assert gc.get_freeze_count() == frozen
print("young objects after:", len(gc.get_objects()))
"""


EXIT_NOW = """
import atexit, sys, threading, time
from pathlib import Path
from graders.frame.lifetimes import exit_now
out = Path(sys.argv[1])
class Finalised:
    def __del__(self):
        (out / "finalised").write_text("yes")
kept = Finalised()  # a module's global: the interpreter's teardown finalises it
atexit.register(lambda: (out / "atexit").write_text("yes"))
def late():
    time.sleep(0.3)
    (out / "thread").write_text("yes")
threading.Thread(target=late).start()
sys.stdout.write("not flushed yet")  # stdout is a pipe: block-buffered
END(3)
"""


@pytest.mark.parametrize("end", ["exit_now", "sys.exit"])
def test_exit_now_ends_as_the_interpreter_would_but_finalises_nothing(tmp_path, end):
    """exit_now (graders/frame/lifetimes.py), how a grading process started on its own ends
    (graders/batch/pytest_process.py): the status, the output, the atexit callbacks and a thread still running are
    as sys.exit leaves them; the teardown of modules and objects is skipped. sys.exit is the control: in this
    very script it does finalise, so the missing mark is exit_now's doing."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout buffered, as it usually is
    done = subprocess.run([sys.executable, "-c", EXIT_NOW.replace("END", end), str(tmp_path)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60, env=env)
    assert (done.returncode, done.stdout) == (3, "not flushed yet"), done.stderr[-2000:]
    assert (tmp_path / "atexit").exists() and (tmp_path / "thread").exists()
    assert (tmp_path / "finalised").exists() == (end == "sys.exit")


def test_what_a_grading_imports_is_frozen_once_and_the_process_exits_quietly():
    """long_lived (graders/frame/lifetimes.py): what a block imports is out of the collector's sight after it (a
    full collection walks only what came later), only the first block of a name freezes, and the process exits
    without Triton's bindings printing that their objects leaked (the frozen objects are handed back at exit)."""
    done = subprocess.run([sys.executable, "-c", LONG_LIVED], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "young objects after:" in done.stdout
    assert "leaked" not in done.stderr + done.stdout, (done.stderr + done.stdout)[-2000:]
