"""Cheats (tests/cheats/) are rejected: by the checks, the static scan, the runtime guard, the
implausible-speedup ceiling, or the organiser's staging of submissions; and, isolated (--isolate, as in
organiser mode), every one is rejected or harmless: the solution runs in a worker, the judge trusts data.

In process, a tampering cheat is graded in a grading process of its own, forked by the zygote as in
organiser mode (it patches the process it runs in), the others in the test's process. Isolated, the
judge is the test's process and the workers come from one nursery (see
test_isolated_cheat_is_rejected_or_harmless).
"""
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from graders.batch.zygote import ForkedProcess
from graders.run.session import grade
from graders.frame.catalogue import REPO_ROOT
from graders.isolation.guard import Guard
from graders.isolation.scan import scan_source
from graders.isolation.worker import sandbox_problem
from nursery_support import warm_nursery
from waiting import wait_for

KATA = "03_conv_bn"
CHEATS = Path(__file__).parent / "cheats"


@dataclass(frozen=True)
class Cheat:
    name: str
    levels: str            # the levels graded (fewer levels, faster tests)
    caught_at: int | None  # the level whose checks reject it (None: tampering, every record is disqualified)
    says: str              # what the learner-facing sentence of the failing check contains
    scanned: bool          # whether the static scan flags it too
    isolated: int | None   # isolated: the level whose checks reject it, or None: it gets an honest pass's grade
    in_process: bool = True  # whether the in-process defences reject it too (the newer cheats defeat them)
    isolated_levels: str = ""  # the levels graded isolated, where they differ
    lingers: bool = False  # leaves a process running after grading: wait for it before reading the records


CASES = [
    Cheat("noop", "1,3", 1, "BatchNorm2d", scanned=False, isolated=1),
    Cheat("returns_zeros", "2", 2, "does not compute what the original does", scanned=False, isolated=2),
    Cheat("mutates_shared_modules", "2", 2, "does not compute what the original does", scanned=False, isolated=2),
    Cheat("special_cases_visible_models", "1,2,4", 4, "BatchNorm2d", scanned=False, isolated=4),
    Cheat("memoises_by_address", "3", 3, "does not compute what the original does", scanned=False, isolated=3),
    Cheat("memoises_by_identity", "3", 3, "implausible", scanned=False, isolated=None),
    Cheat("slows_the_baseline", "1", None, "torch.nn.BatchNorm2d.forward was added", scanned=True, isolated=None,
          isolated_levels="1,3"),
    Cheat("patches_the_timer", "1", None, "torch.utils.benchmark.Timer.blocked_autorange was replaced", scanned=True,
          isolated=None, isolated_levels="1,3"),
    Cheat("patches_the_grader", "1", None, "graders.run.session.GradingSession.run was replaced", scanned=True, isolated=None),
    Cheat("replaces_a_module", "1", None, "sys.modules['time'] was replaced", scanned=True, isolated=None),
    Cheat("sets_the_environment", "1", None, "environment variable OMP_NUM_THREADS was changed", scanned=True,
          isolated=None),
    # Written against the in-process defences (issue: "the solution never runs in the process that judges it").
    Cheat("rewrites_the_records_at_exit", "1", None, "", scanned=True, isolated=1, in_process=False, lingers=True),
    Cheat("caches_the_forward", "3", None, "", scanned=False, isolated=None, in_process=False),
    Cheat("hooks_every_batchnorm", "3", None, "", scanned=True, isolated=None, in_process=False),
    Cheat("slows_batch_norm_in_a_mode", "3", None, "", scanned=True, isolated=None, in_process=False),
    Cheat("reaches_the_grader_through_torch", "3", None, "", scanned=False, isolated=None, in_process=False),
]
# What the honest fold leaves on the L3 benchmark, counted exactly: aten ops per call and the bytes its fresh
# tensors take per call (the original: 32 ops, 98304 bytes). A cheat that skips work (a cached forward, a
# memo) changes both; the clock is no test of that (the honest fold read 1.4x-2.7x here, under load).
HONEST_ATEN_OPS_AFTER, HONEST_BYTES_WRITTEN_AFTER = 16, 65536


# What every cheat may use: the reference's honest pass, and a way to put any module behind a graph.
CHEAT_PREAMBLE = '''
_honest_fuse = fuse_conv_bn


def _served_by(module):
    """A GraphModule whose forward is module(x): the cheat's module answers every call."""
    graph = fx.Graph()
    graph.output(graph.call_module("served", (graph.placeholder("x"),)))
    return fx.GraphModule(torch.nn.ModuleDict({"served": module}), graph)
'''


def cheat_source(name: str) -> str:
    """The reference solution, then CHEAT_PREAMBLE, then the cheat."""
    reference = (REPO_ROOT / "reference" / KATA / "solution.py").read_text()
    return f"{reference}\n{CHEAT_PREAMBLE}\n\n{(CHEATS / f'{name}.py').read_text()}"


def cheat_tree(tmp_path: Path, cheat: Cheat) -> Path:
    (tmp_path / KATA).mkdir()
    (tmp_path / KATA / "solution.py").write_text(cheat_source(cheat.name))
    return tmp_path


@dataclass
class Graded:
    returncode: int
    output: str  # the grading process's stdout and stderr


def grade_cheat(tmp_path: Path, cheat: Cheat, *options: str, levels: str = "") -> tuple[Graded, list[dict]]:
    """The cheat graded by `pytest katas/03_conv_bn` in a grading process of its own, forked by the zygote
    as organiser mode's grading processes are (graders/batch/zygote.py): its records and its exit."""
    cheat_tree(tmp_path, cheat)
    records, output = tmp_path / "records.json", tmp_path / "output.txt"
    process = ForkedProcess([f"katas/{KATA}", "-p", "no:cacheprovider", "--solutions", str(tmp_path), "--seed", "0",
                             "--levels", levels or cheat.levels, "--results-json", str(records), *options],
                            output, {**os.environ, "OMP_NUM_THREADS": "1"}, memory_gb=8.0)
    returncode = process.wait(timeout=600)
    graded = Graded(returncode, output.read_text())
    assert records.exists(), graded.output
    if cheat.lingers:  # what the cheat left running has done what it could (or is gone) before the records are read
        wait_for(lambda: not processes_naming(str(tmp_path)), 90, "the processes the cheat left running to end")
    return graded, json.loads(records.read_text())["results"]


def processes_naming(text: str) -> list[int]:
    """The live processes (not this one) whose command line holds `text`: a worker of a tree under it, a process
    a worker forked (a zombie's command line is empty)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if text.encode() in open(f"/proc/{entry}/cmdline", "rb").read():
                    found.append(int(entry))
            except OSError:
                pass
    return found


def test_every_cheat_file_has_a_case():
    assert sorted(p.stem for p in CHEATS.glob("*.py")) == sorted(c.name for c in CASES)


def levels_of(levels: str) -> tuple[int, ...]:
    return tuple(int(level) for level in levels.split(","))


def in_process_marks(levels: str) -> list:
    """Graded in this test's process: it locks per check, and it times where the speed level is graded."""
    return [pytest.mark.locks_per_check, *([pytest.mark.timing] if 3 in levels_of(levels) else [])]


@pytest.mark.parametrize("cheat", [pytest.param(c, id=c.name, marks=[] if c.caught_at is None else in_process_marks(c.levels))
                                   for c in CASES if c.in_process])
def test_cheat_is_rejected(tmp_path, cheat):
    """A tampering cheat patches the process it runs in: it is graded in a pytest process of its own, whose
    every record it disqualifies. The others are graded here, as any solution is."""
    if cheat.caught_at is None:
        proc, results = grade_cheat(tmp_path, cheat)
        assert proc.returncode == 1, proc.output
        assert results and all(r["disqualified"] and not r["passed"] and r["points"] == 0 for r in results), results
        assert all(r["message"].startswith("tampering:") and cheat.says in r["message"] for r in results), results
        assert "DISQUALIFIED" in proc.output
        return
    results = [r.to_dict() for r in grade(KATA, cheat_tree(tmp_path, cheat), seed=0, levels=levels_of(cheat.levels))]
    failed = [r for r in results if not r["passed"]]
    assert failed and min(r["level"] for r in failed) == cheat.caught_at, failed
    assert any(cheat.says in r["message"] for r in failed if r["level"] == cheat.caught_at), failed
    assert not any(r["message"].startswith("tampering") for r in results)


@pytest.fixture(scope="module")
def nursery(tmp_path_factory):
    """A nursery (graders/isolation/nursery.py) over one folder, where each isolated test below writes its
    cheat's tree: every worker is forked from it warm, as organiser mode's fleet starts a team's workers,
    instead of each test starting a sandboxed Python that imports torch (3 s of CPU) of its own."""
    root = tmp_path_factory.mktemp("isolated")
    with warm_nursery(root, "fx-katas-cheats-") as socket_path:
        yield root, socket_path


@pytest.mark.parametrize("cheat", [
    pytest.param(c, id=c.name, marks=[] if c.lingers else in_process_marks(c.isolated_levels or c.levels))
    for c in CASES])
def test_isolated_cheat_is_rejected_or_harmless(tmp_path, cheat, nursery):
    """Isolated, the cheat's code runs only in the worker: whatever it does there, the judge grades the
    graph it sent back. Rejected at its level, or graded as the honest pass it wraps: the same aten ops
    and fresh bytes on the benchmark, never disqualified (that is the static scan's job).

    The judge is this test's own process, as safe as a grading process of its own since the cheat never
    runs in it, and the worker is forked by the module's nursery, as in a competition; except for the cheat
    that goes after the grading process's records file, which needs a grading process (`--isolate`, whose
    workers are started one by one, as a learner's are)."""
    levels = cheat.isolated_levels or cheat.levels
    if cheat.lingers:  # what it leaves running goes after the grading process's records file
        if sandbox_problem():
            pytest.skip(f"needs the sandbox, which this machine lacks: {sandbox_problem()}")
        graded, results = grade_cheat(tmp_path, cheat, "--isolate", levels=levels)
        assert "isolated: the solution runs in a worker process, sandboxed" in graded.output  # the header says so
    else:
        root, socket_path = nursery
        (root / cheat.name).mkdir()
        results = [r.to_dict() for r in grade(KATA, cheat_tree(root / cheat.name, cheat), seed=0, isolate=True,
                                              nursery=socket_path, levels=levels_of(levels))]
    assert results and not any(r["disqualified"] or r["message"].startswith("tampering") for r in results), results
    failed = [r for r in results if not r["passed"] and not r["skipped"]]
    if cheat.isolated is not None:
        assert failed and min(r["level"] for r in failed) == cheat.isolated, results
        return
    # The speed level's verdict is the clock's (the honest fold's reading can dip under the threshold on a loaded
    # machine, and a test bounds no clock from below): that the judge timed the honest fold's graph is proven by
    # its exact counts, the same aten ops and fresh bytes.
    assert not [r for r in failed if r["level"] != 3], failed
    for r in results:
        if r["level"] == 3:
            assert r["figures"]["aten_ops_after"] == HONEST_ATEN_OPS_AFTER, r["figures"]
            assert r["figures"]["bytes_written_after"] == HONEST_BYTES_WRITTEN_AFTER, r["figures"]


def test_the_records_cheat_rewrites_the_records_of_a_grading_it_runs_in(tmp_path):
    """The control of the isolated test above: where the cheat runs in the grading process itself (a learner's
    own grading; organiser mode never grades so), its detached process finds the records file and rewrites it,
    full marks and 9.99x. So the records that come back unchanged isolated are the sandbox's doing, not a cheat
    that never found them (a grading process forked by the zygote keeps the zygote's command line, where the
    cheat once looked for the file alone)."""
    cheat = next(c for c in CASES if c.name == "rewrites_the_records_at_exit")
    graded, _ = grade_cheat(tmp_path, cheat)
    assert graded.returncode == 1 and "1 failed" in graded.output, graded.output  # as graded, L1 fails: a no-op fold

    def rewritten() -> list:
        try:
            records = json.loads((tmp_path / "records.json").read_text())["results"]
        except ValueError:  # read while the cheat writes it
            return []
        return records if records and all(r["passed"] and r["figures"].get("speedup") == 9.99 for r in records) else []

    wait_for(rewritten, 60, "the cheat to rewrite the records")


def test_the_grader_cheat_fakes_the_speed_verdict_of_a_grading_it_runs_in(tmp_path):
    """The control of its isolated test: where the cheat runs in the grading process itself, its fake verdict
    stands (9.99x, and none of the exact counts the judge's own verdict carries), so that isolated, where the
    speed level carries the honest fold's counts, the judge is out of its reach, not the cheat disarmed."""
    cheat = next(c for c in CASES if c.name == "reaches_the_grader_through_torch")
    graded, results = grade_cheat(tmp_path, cheat)
    speed = [r for r in results if r["level"] == 3]
    assert speed and all(r["passed"] and r["figures"].get("speedup") == 9.99 and "aten_ops_after" not in r["figures"]
                         for r in speed), (results, graded.output)


# In a process of its own (the cheats patch the process they are loaded in): each cheat's module, with its
# _busy counted instead of spent; then one BatchNorm call, and a folded module called three times on one input.
CLOCK_CHEATS_ACT = """
import importlib.util, json, sys
import torch, torch.fx as fx

modules = {}
for path in sys.argv[1:]:
    spec = importlib.util.spec_from_file_location(path.rsplit("/", 2)[-2], path)
    modules[spec.name] = module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
counted = {}
for name, module in modules.items():
    if hasattr(module, "_busy"):
        counted[name] = 0
        module._busy = lambda seconds, name=name: counted.__setitem__(name, counted[name] + 1)
torch.nn.BatchNorm2d(3).eval()(torch.randn(1, 3, 4, 4))
model = torch.nn.Sequential(torch.nn.Conv2d(3, 3, 3), torch.nn.BatchNorm2d(3)).eval()
folded = modules["caches_the_forward"].fuse_conv_bn(fx.symbolic_trace(model))
runs = []
for m in folded.modules():
    if isinstance(m, torch.nn.Conv2d):
        m.register_forward_hook(lambda *args: runs.append(1))
x = torch.randn(1, 3, 8, 8)
for _ in range(3):
    folded(x)
print(json.dumps({**counted, "convolutions_in_three_calls": len(runs)}))
"""


def test_the_clock_cheats_still_act_where_they_run(tmp_path):
    """The control of the isolated tests of the cheats that act on the clock alone (no test bounds a clock from
    below): loaded in a process, as the grading process loads a solution, the hook and the torch function mode
    each run their slowing on a BatchNorm call, and the cached forward runs the convolution for two calls of
    three on one input. Counted, not timed; so the honest counts isolated are the judge out of their reach."""
    paths = []
    for name in ("hooks_every_batchnorm", "slows_batch_norm_in_a_mode", "caches_the_forward"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "solution.py").write_text(cheat_source(name))
        paths.append(str(tmp_path / name / "solution.py"))
    done = subprocess.run([sys.executable, "-c", CLOCK_CHEATS_ACT, *paths], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"hooks_every_batchnorm": 1, "slows_batch_norm_in_a_mode": 1,
                                       "convolutions_in_three_calls": 2}, done.stdout


def test_the_runtime_guard_sees_a_patch_after_the_runtime_changed_a_class_itself(monkeypatch):
    """Python's own caches (copyreg's __slotnames__, added on a deepcopy) change a class without a
    solution: no violation, and the guard's fast pass starts from there; a patch made later, even one that
    swaps such a name for a shadowing method (the class's size unchanged), is still named."""
    import torch

    guard = Guard()
    monkeypatch.setattr(torch.nn.Identity, "__slotnames__", [], raising=False)
    assert guard.violations() == []
    monkeypatch.delattr(torch.nn.Identity, "__slotnames__")
    monkeypatch.setattr(torch.nn.Identity, "extra_repr", lambda self: "", raising=False)
    assert guard.violations() == ["torch.nn.Identity.extra_repr was added"]
    monkeypatch.undo()
    monkeypatch.setattr(torch.nn.Identity, "forward", lambda self, x: x)
    assert guard.violations() == ["torch.nn.Identity.forward was replaced"]


@pytest.mark.parametrize("cheat", CASES, ids=lambda c: c.name)
def test_static_scan_flags_exactly_the_tampering_cheats(cheat):
    findings = scan_source((CHEATS / f"{cheat.name}.py").read_text(), f"{cheat.name}.py", KATA)
    assert bool(findings) == cheat.scanned, findings


def test_static_scan_passes_every_reference_and_stub():
    for tree in ("reference", "katas"):
        for path in sorted((REPO_ROOT / tree).glob("*/solution.py")):
            assert scan_source(path.read_text(), str(path), path.parent.name) == [], path


def test_static_scan_sees_through_aliases_and_names_the_line():
    source = "import torch\nm = torch.nn\nrelu = m.ReLU\n\ndef f(gm):\n    relu.forward = None\n    return gm\n"
    assert scan_source(source) == ["solution.py line 6: assigns to relu.forward, part of an imported module: that "
                                   "monkeypatches it for the grader too."]
    assert scan_source("import time\n", kata="10_verify_harness") == []
    assert scan_source("import time\n", kata=KATA) == ["solution.py line 1: imports time: a graph pass has no use "
                                                       "for timers."]


def test_staging_takes_each_teams_solution_files_and_nothing_else(tmp_path):
    """What organiser mode grades of a team's folder (graders/competition/organiser.py): its NN_name/solution.py
    files for the katas graded, regular files only; no conftest.py, package, helper module or other kata, and no
    solution.py that is a link (to the organiser's reference, say). A job carries what `read_files` reads of the
    staged tree, so those files are all that ever reaches a grading process. (The test below grades such a folder
    end to end: there the sneaky team's stub scores 0 whatever is staged, so only this one sees the extra files.)"""
    from graders.competition.organiser import read_files, stage_submissions

    team = tmp_path / "submissions" / "sneaky"
    for name in (f"{KATA}/solution.py", f"{KATA}/helper.py", "conftest.py", "graders/__init__.py", "04_dce/solution.py",
                 "notes.txt"):
        (team / name).parent.mkdir(parents=True, exist_ok=True)
        (team / name).write_text(f"# {name}\n")
    (team / "01_linear_relu").mkdir()
    (team / "01_linear_relu" / "solution.py").symlink_to(REPO_ROOT / "reference" / "01_linear_relu" / "solution.py")
    (tmp_path / "staging").mkdir()
    trees = stage_submissions(tmp_path / "submissions", [KATA, "01_linear_relu"], tmp_path / "staging")
    staged = sorted(p.relative_to(trees["sneaky"]).as_posix() for p in trees["sneaky"].rglob("*") if p.is_file())
    assert staged == [f"{KATA}/solution.py"]
    assert read_files(trees["sneaky"]) == {f"{KATA}/solution.py": f"# {KATA}/solution.py\n".encode()}


def test_a_job_carries_and_stages_only_its_own_katas_solution_file():
    """The fleet's layer of the same rule (graders/competition/jobs.py), for a team tree holding several katas (as a
    service's submission does): a job sends only its kata's solution.py, and a worker reads nothing else from a job,
    whatever names it carries."""
    from graders.competition.jobs import make_job, solution_of

    files = {f"{KATA}/solution.py": b"ours", "04_dce/solution.py": b"another kata's", "conftest.py": b"x"}
    job = make_job("ada", KATA, files, "correctness", 7)
    assert job["files"] == {f"{KATA}/solution.py": b"ours"}
    assert solution_of(job) == b"ours"
    forged = {**job, "files": {"conftest.py": b"x", f"{KATA}/../conftest.py": b"x", "04_dce/solution.py": b"x",
                               f"{KATA}/solution.py": b"ours"}}
    assert solution_of(forged) == b"ours"
    assert solution_of({**forged, "files": {"04_dce/solution.py": b"x", f"{KATA}/helper.py": b"x"}}) is None


def test_organiser_grades_only_solution_files_with_a_secret_seed(tmp_path):
    submissions = tmp_path / "submissions"
    honest = submissions / "honest" / KATA
    honest.mkdir(parents=True)
    shutil.copy(REPO_ROOT / "reference" / KATA / "solution.py", honest / "solution.py")
    # A team whose solution is the stub, but that ships a conftest forcing every test to pass, its own
    # graders package, and a symlink to the organiser's reference under another kata.
    sneaky = submissions / "sneaky"
    shutil.copytree(REPO_ROOT / "katas" / KATA, sneaky / KATA)
    with open(sneaky / KATA / "solution.py", "a") as stub:  # no longer the shipped stub byte for byte: graded
        stub.write("# edited\n")
    (sneaky / "conftest.py").write_text(
        "import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
        "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n")
    (sneaky / "graders").mkdir()
    (sneaky / "graders" / "core.py").write_text("raise SystemExit('the team graders package was used')\n")
    (sneaky / "01_linear_relu").mkdir()
    (sneaky / "01_linear_relu" / "solution.py").symlink_to(REPO_ROOT / "reference" / "01_linear_relu" / "solution.py")
    flagged = submissions / "flagged" / KATA
    flagged.mkdir(parents=True)
    (flagged / "solution.py").write_text(cheat_source("sets_the_environment"))

    out = tmp_path / "runs.json"
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "graders" / "score.py"), "--submissions", str(submissions),
         "--kata", KATA, "--kata", "01_linear_relu", "--no-speed", "--jobs", "2", "--json", str(out),
         "--results-dir", str(tmp_path / "results"), "--leaderboard", str(tmp_path / "LEADERBOARD.md")],
        cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    runs = {run["team"]: run for run in json.loads(out.read_text())}
    assert runs["honest"]["katas"][KATA]["points"] == 80 and not runs["honest"]["disqualified"]
    assert runs["sneaky"]["total_points"] == 0
    assert "does not exist" in runs["sneaky"]["katas"]["01_linear_relu"]["message"]
    # Organiser mode is isolated: the environment the worker changed is its own; the static scan disqualifies.
    assert "static scan" in " ".join(runs["flagged"]["disqualified"])
    assert "imports os" in runs["flagged"]["katas"][KATA]["scan"][0]
    seeds = {run["seed"] for run in runs.values()}
    assert len(seeds) == 1 and f"The seed was {seeds.pop()}" in proc.stdout
    assert "honest 03_conv_bn: 80.0 points" in proc.stderr  # progress, team by team
    board = (tmp_path / "LEADERBOARD.md").read_text()
    rows = {line.split("|")[2].strip(): line.split("|")[1].strip() for line in board.splitlines()
            if line.startswith("| ") and "team" not in line}
    assert rows == {"honest": "1", "sneaky": "2", "flagged": "DQ"}, board
    assert "disqualified: 03_conv_bn: static scan" in board
