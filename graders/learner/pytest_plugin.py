"""pytest front end of the graders: one test per check, ids such as test_L2_exact[depthwise].

A kata's test file is one line (see katas/03_conv_bn/test_03_conv_bn.py):

    test_L1_pattern, test_L2_exact, test_L3_fast, test_L4_hidden = kata_level_tests("03_conv_bn")

Options: --solutions DIR (or env KATA_SOLUTIONS) grades DIR/<kata>/solution.py instead of the file
beside the test; --seed, --device, --threads and --no-speed as in score.py; --results-json FILE
writes the check records (score.py reads them), --progress FILE
follows a run of several katas, --machine-lock FILE shares the machine with other grading processes.

May import: graders.frame, graders.isolation (the guard, the sandbox's probe), graders.run (the session).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tabulate import tabulate

from graders.frame.levels import LEVELS, level_points, resolve_seed
from graders.run.session import GradingSession
from graders.isolation.guard import Guard
from graders.frame.catalogue import load_grader
from graders.frame.machinelock import MachineLock
from graders.run.timing import run_alone_with

_SEED = pytest.StashKey[int]()
_SESSIONS = pytest.StashKey[dict]()
_GUARD = pytest.StashKey[Guard]()
_LOCK = pytest.StashKey[MachineLock]()


def pytest_addoption(parser):
    group = parser.getgroup("fx-katas", "grading options")
    group.addoption("--solutions", default=os.environ.get("KATA_SOLUTIONS"), metavar="DIR",
                    help="solution tree to grade: DIR/<kata>/solution.py (default: the kata folder of each test; "
                         "env KATA_SOLUTIONS)")
    group.addoption("--seed", type=int, default=None, help="grading seed for random models (default: random, printed)")
    group.addoption("--device", choices=["cpu", "cuda"], default="cpu", help="device for models and timing")
    group.addoption("--threads", type=int, default=1, help="CPU threads while timing (default 1)")
    group.addoption("--no-speed", action="store_true", help="skip the speed level (L3)")
    group.addoption("--isolate", action="store_true",
                    help="run the solution in a sandboxed worker process and judge only the data it sends back "
                         "(always on in score.py --submissions; print() still shows, breakpoint() does not work)")
    group.addoption("--check-timeout", type=float, default=None, metavar="S",
                    help="seconds one check may take (default: each check's own, 60 s or 300 s for speed)")
    group.addoption("--worker-memory", type=float, default=None, metavar="GB",
                    help="with --isolate, the memory each worker process may take (score.py passes its "
                         "--kata-memory; default 8; the address space on the CPU, the data segment on CUDA)")
    group.addoption("--results-json", default=None, metavar="FILE", help="write the check records to FILE")
    group.addoption("--claims", default=None, metavar="DIR",
                    help="(score.py) grading processes that share DIR share out the katas: each grades the next "
                         "kata no other has claimed")
    group.addoption("--progress", default=None, metavar="FILE",
                    help="(score.py) append a JSON line to FILE as each check starts and as it ends, with the "
                         "kata's points so far")
    group.addoption("--levels", default=None, metavar="1,2,4", help="run only these levels (score.py --jobs uses it)")
    group.addoption("--nursery", default=None, metavar="SOCKET",
                    help="(the fleet) with --isolate, ask the team's nursery at SOCKET for worker processes, forked "
                         "warm, instead of starting each one (graders/isolation/nursery.py)")
    group.addoption("--machine-lock", default=None, metavar="FILE",
                    help="(the fleet) share the machine lock FILE with the other grading processes of this machine: "
                         "held shared while checks run, alone while a speed level times (graders/frame/machinelock.py; "
                         "env FX_KATAS_LOCK_LOG: log each take and release)")
    group.addoption("--seed-file", default=None, metavar="FILE",
                    help="read the grading seed from FILE and delete it, so solution code never sees it "
                         "(score.py --submissions uses it)")


def pytest_configure(config):
    seed = config.getoption("seed")
    seed_file = config.getoption("seed_file")
    if seed_file:
        seed = int(Path(seed_file).read_text())
        Path(seed_file).unlink()
    config.stash[_SEED] = resolve_seed(seed)  # one seed for the whole run
    config.stash[_SESSIONS] = {}
    if config.getoption("machine_lock"):
        # Grading shares the machine with other grading processes (the fleet's jobs): hold the lock shared
        # from here on, and alone for every timed stretch (graders.run.timing.alone).
        lock = MachineLock(config.getoption("machine_lock"), log=os.environ.get("FX_KATAS_LOCK_LOG"))
        lock.take(exclusive=False)
        config.stash[_LOCK] = lock
        run_alone_with(lambda: lock.hold(exclusive=True))


def pytest_unconfigure(config):
    lock = config.stash.get(_LOCK, None)
    if lock is not None:
        run_alone_with(None)
        lock.close()


def pytest_collection_modifyitems(config, items):
    levels = config.getoption("levels")
    if levels:
        wanted = {int(level) for level in levels.split(",")}
        keep = [item for item in items if getattr(getattr(item, "function", None), "level", None) in wanted]
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep


def pytest_collection_finish(session):
    # Solution files load lazily inside the tests, so this snapshot predates all learner code. The
    # hooks below were registered before that code too: patching this module cannot unhook them.
    session.config.stash[_GUARD] = Guard()


def pytest_report_header(config):
    seed = config.stash[_SEED]
    device = config.getoption("device")
    # On CUDA the session holds full float32 (graders/isolation/precision.py): TF32 would blur the comparisons.
    precision = ", full float32 (TF32 off in cuBLAS and cuDNN)" if device == "cuda" else ""
    where = ""
    if config.getoption("isolate"):
        from graders.isolation.sandbox import bwrap

        where = (", isolated: the solution runs in a worker process, " +
                 ("sandboxed (bubblewrap: no network, read-only system)" if bwrap() else
                  "not sandboxed (bubblewrap cannot create namespaces on this machine)"))
    return f"fx-katas: grading seed {seed} (reproduce with --seed {seed}), device {device}{precision}{where}"


def kata_level_tests(kata: str):
    """The four level tests of a kata, for its test file to bind at module level."""
    def make(level: int):
        def test(kata_check, kata_session):
            result = kata_session.run(kata_check)
            if result.skipped:
                pytest.skip(result.message)
            if not result.passed:
                pytest.fail(f"{kata} {kata_check.test_id}: {result.message}", pytrace=False)

        test.__name__ = test.__qualname__ = f"test_L{level}_{LEVELS[level].name}"
        test.__doc__ = f"Level {level} ({LEVELS[level].name}): {LEVELS[level].meaning}."
        test.kata, test.level = kata, level
        return test

    return tuple(make(level) for level in LEVELS)


def pytest_generate_tests(metafunc):
    if "kata_check" not in metafunc.fixturenames:
        return
    function = metafunc.function
    checks = load_grader(function.kata).checks_at(function.level)
    override = metafunc.config.getoption("check_timeout")
    metafunc.parametrize("kata_check", [
        pytest.param(check, id=check.name, marks=pytest.mark.timeout(override or check.timeout)) for check in checks
    ])


@pytest.fixture
def kata_session(request) -> GradingSession:
    """One grading session per solution tree, shared by every check in this pytest run."""
    config = request.config
    solutions = config.getoption("solutions") or request.path.parent.parent
    solutions = Path(solutions).resolve()
    sessions = config.stash[_SESSIONS]
    if solutions not in sessions:
        sessions[solutions] = GradingSession(
            solutions, seed=config.stash[_SEED], device=config.getoption("device"),
            threads=config.getoption("threads"), speed=not config.getoption("no_speed"),
            isolate=config.getoption("isolate"), nursery=config.getoption("nursery"),
            check_timeout=config.getoption("check_timeout"), worker_memory=config.getoption("worker_memory"))
    return sessions[solutions]


def _kata(item) -> str | None:
    return getattr(getattr(item, "function", None), "kata", None)


def _claimed(items, claims: Path):
    """The items of the katas this process claims, a kata at a time: a kata is claimed (atomically, by
    creating claims/KATA) only when this process is about to grade it, so a free process takes the
    next kata and none waits on a long one another process holds."""
    decided: dict[str, bool] = {}
    for item in items:
        kata = _kata(item)
        if kata not in decided:
            try:
                (claims / str(kata)).mkdir()
                decided[kata] = True
            except FileExistsError:
                decided[kata] = False
        if decided[kata]:
            yield item


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    """With --claims, pytest's own loop over only the claimed katas' items."""
    claims = session.config.getoption("claims")
    if claims is None or session.config.option.collectonly:
        return None
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        raise session.Interrupted(f"{session.testsfailed} errors during collection")
    items = _claimed(session.items, Path(claims))
    item = next(items, None)
    while item is not None:
        nextitem = next(items, None)  # claims the next kata before the last item of this one ends
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        if session.shouldfail:
            raise session.Failed(session.shouldfail)
        if session.shouldstop:
            raise session.Interrupted(session.shouldstop)
        item = nextitem
    return True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    """With --progress, score.py follows a run of several katas: which kata is being graded (its time
    limit is per kata) and the points of each one as it finishes."""
    lock = item.config.stash.get(_LOCK, None)
    if lock is not None:  # between two checks: a timing that waits for the machine goes first
        lock.label = item.nodeid
        lock.let_others_in()
    path, kata = item.config.getoption("progress"), _kata(item)
    if not path or kata is None:
        yield
        return
    with open(path, "a") as progress:
        progress.write(json.dumps({"kata": kata, "started": item.name}) + "\n")
    yield
    points = sum(r.points for r in _all_results(item.config) if r.kata == kata)
    with open(path, "a") as progress:
        progress.write(json.dumps({"kata": kata, "ended": item.name, "points": points}) + "\n")


def _all_results(config):
    return [r for s in config.stash.get(_SESSIONS, {}).values() for r in s.results]


def pytest_terminal_summary(terminalreporter, config):
    results = _all_results(config)
    if not results:
        return
    seed = config.stash[_SEED]
    write = terminalreporter.write_line
    terminalreporter.section("fx-katas: points per level")
    for kata in dict.fromkeys(r.kata for r in results):
        kata_results = [r for r in results if r.kata == kata]
        points = level_points(kata_results)
        rows = []
        for level, (earned, possible) in points.items():
            at_level = [r for r in kata_results if r.level == level]
            if at_level:
                passed = sum(r.passed for r in at_level)
                rows.append([f"L{level} {LEVELS[level].name}", f"{passed}/{len(at_level)}",
                             f"{earned:.1f} / {possible:.1f}"])
        total = sum(e for e, _ in points.values()), sum(p for _, p in points.values())
        rows.append(["total", "", f"{total[0]:.1f} / {total[1]:.1f}"])
        write(f"{kata}:")
        write(tabulate(rows, headers=["level", "checks passed", "points"]))
        for line in speed_lines(kata, kata_results, config.getoption("device")):
            write(line)
    write(f"grading seed {seed}: rerun with --seed {seed} to reproduce the hidden models.")
    tampering = _tampering(config)
    if tampering:
        terminalreporter.section("fx-katas: DISQUALIFIED", red=True)
        write(tampering)


def speed_lines(kata: str, kata_results, device: str) -> list[str]:
    """The summary's lines about a kata's speed level: each measured speedup, and whether its verdict is
    provisional (the threshold was never calibrated on this device: graders/frame/kata.py)."""
    lines = []
    for r in kata_results:
        if r.level == 3 and "speedup" in r.figures:
            f = r.figures
            lines.append(f"speed: {f['speedup']:.2f}x (needs {f['threshold']:.2f}x"
                         f"{', provisional' if f.get('provisional') else ''}; rounds {f['speedup_low']:.2f}x-"
                         f"{f['speedup_high']:.2f}x); aten ops {f['aten_ops_before']} -> {f['aten_ops_after']}, "
                         f"fresh-tensor bytes {f['bytes_written_before']:,} -> {f['bytes_written_after']:,}")
    if any(r.level == 3 and r.figures.get("provisional") for r in kata_results):
        lines.append(f"provisional: {kata}'s {device} speed threshold has not been calibrated on this device "
                     f"(bench/calibrate.py --device {device}); its L3 verdict is not a measured standard.")
    return lines


def _tampering(config) -> str | None:
    guard = config.stash.get(_GUARD, None)
    return guard.describe() if guard else None


def pytest_sessionfinish(session):
    for grading in session.config.stash.get(_SESSIONS, {}).values():
        grading.close()
    results = [r.to_dict() for r in _all_results(session.config)]
    # Only a run that graded katas ran solution code in this process; the project's own tests (tests/) change
    # the graders' state themselves (a zygote started in process sets Zygote._current) and grade nothing here.
    tampering = _tampering(session.config) if session.config.stash.get(_SESSIONS, {}) else None
    if tampering:  # whatever the checks said, a run that changed the grader proves nothing
        for r in results:
            r.update(passed=False, points=0.0, disqualified=True, message=tampering)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    path = session.config.getoption("results_json")
    if path:
        Path(path).write_text(json.dumps({"seed": session.config.stash[_SEED], "tampering": tampering,
                                          "results": results}, indent=1))
