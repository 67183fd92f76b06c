"""Watch mode, driven as a learner drives it: in a real terminal (a pty), saving files, pressing keys.

Every grading costs seconds (a pytest subprocess): the tests grade only where grading is what they prove,
and start on stubs, which the watcher judges from their bytes."""
import io
import os
import re
import shutil
import signal
import sys
from pathlib import Path

import pexpect

from graders.frame.catalogue import KATAS, REPO_ROOT
from graders.learner import progress
from waiting import running, wait_for

CLEAR = "\x1b[2J\x1b[H"
FAST = 15  # seconds: a screen that needs no grading (the watcher's own start-up included, on a loaded machine)


def default_interrupt():
    # A test run started in the background of a shell ignores SIGINT, and a child inherits that: Ctrl-C
    # would then do nothing to the watcher.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stubs(tree, *katas):
    for kata in katas:
        shutil.copytree(REPO_ROOT / "katas" / kata, tree / kata)


def reference(tree, kata):
    (tree / kata / "solution.py").write_text((REPO_ROOT / "reference" / kata / "solution.py").read_text())


def stored_complete(monkeypatch, state, tree, kata):
    """A grading of `kata`'s current file at full marks, stored as an earlier session stored it (the reference
    gets full marks: tests/test_katas.py)."""
    monkeypatch.setattr(progress, "STATE_DIR", state)
    progress.remember(tree, {kata: {"status": "graded", "points": 100.0, "max_points": 100.0, "checks": []}})


def spawn(tmp_path, tree, *options, env=None):
    env = {**os.environ, "FX_KATAS_STATE": str(tmp_path / "state"), "COLUMNS": "80", "LINES": "40", **(env or {})}
    child = pexpect.spawn(sys.executable, [str(REPO_ROOT / "graders" / "watch.py"), "--solutions", str(tree),
                                           *options], cwd=str(tmp_path), env=env, encoding="utf-8",
                          timeout=120, dimensions=(40, 80), preexec_fn=default_interrupt)
    child.logfile_read = io.StringIO()
    return child


def lines(child) -> list[str]:
    return child.logfile_read.getvalue().replace(CLEAR, "\n").replace("\r\n", "\n").splitlines()


def last_screen(child) -> list[str]:
    return child.logfile_read.getvalue().split(CLEAR)[-1].replace("\r\n", "\n").splitlines()


def assert_80_columns(child):
    # A line may pass 80 columns only when it is one word (a path longer than the screen is never cut).
    wide = [line for line in lines(child) if len(line) > 80 and len(line.split()) > 1]
    assert not wide, wide


def assert_whole(child, path):
    """`path` is on one line, never cut at a hyphen or a column (issue 34: ".../fx-" then "katas/katas/...")."""
    assert any(str(path) in line for line in lines(child)), f"{path} is cut:\n" + "\n".join(lines(child))


def quit_cleanly(child, key=None):
    if key:
        child.send(key)
    else:
        child.sendintr()  # Ctrl-C
    child.expect("bye")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, (child.exitstatus, child.signalstatus)


def zygotes_of(pid: int) -> list[int]:
    """The zygote processes (graders/batch/zygote.py) that `pid` started and that still run."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            parent = int(entry.joinpath("stat").read_text().rsplit(")", 1)[1].split()[1])
            command = entry.joinpath("cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if parent == pid and b"graders.batch.zygote" in command and running(int(entry.name)):
            found.append(int(entry.name))
    return found


def test_full_marks_show_the_speed_figures_wait_for_n_and_move_past_complete_katas(tmp_path, monkeypatch):
    """Saving the reference regrades (the speed level too) to a full marks screen with the L3 speedup, its
    threshold and the bytes written; it waits for a key; r grades the same file again; n then skips the kata
    already complete for its file (05) to the next one (06, the stub: judged without grading).

    Every grading process is forked from the session's zygote, not started as a new interpreter: the solution,
    loaded in it, finds the zygote as its parent, the same one after the learner waited past FX_KATAS_ZYGOTE_IDLE
    (the idle time of other clients' zygotes). Ctrl-C ends the watcher and, with it, the zygote, and prints no
    traceback of the zygote's."""
    tree, parents = tmp_path / "tree", tmp_path / "parents"
    stubs(tree, "04_dce", "05_cse", "06_constant_folding")
    reference(tree, "05_cse")
    stored_complete(monkeypatch, tmp_path / "state", tree, "05_cse")
    child = spawn(tmp_path, tree, "--kata", "04_dce", env={"FX_KATAS_ZYGOTE_IDLE": "1"})
    zygote = None
    try:
        child.expect("fx-katas watch · 04_dce", timeout=FAST)
        child.expect(r"First failing check: test_L1_pattern\[stub\]")
        child.expect("still the stub")
        child.expect("Save solution.py to regrade")
        child.send("h")
        child.expect("Hint 1 of 3 for 04_dce")
        child.expect("Save solution.py to regrade")
        assert "Grading" not in child.logfile_read.getvalue()  # the stub was never graded

        (tree / "04_dce" / "solution.py").write_text(
            (REPO_ROOT / "reference" / "04_dce" / "solution.py").read_text() +
            f"\nimport os\nwith open({str(parents)!r}, 'a') as _file:\n    _file.write(f'{{os.getppid()}}\\n')\n")
        child.expect("Grading")
        child.expect(r"L3 fast +20/20 +✓")
        child.expect(r"04_dce is complete: full marks, 100/100 points\.")
        child.expect(r"Speed \(L3 \w+\):\s+([\d.]+)x the traced original on cpu; this level needs at least 2\.50x")
        assert float(child.match.group(1)) >= 2.5
        child.expect(r"fresh tensors written per call: 1 MiB before, 256 KiB after")
        child.expect("Press n for the next kata not yet complete: 06_constant_folding")
        child.expect("Save solution.py to regrade")
        assert_whole(child, tree / "04_dce" / "solution.py")
        # It waits: nothing more is drawn, nothing graded, until a key (and past FX_KATAS_ZYGOTE_IDLE).
        assert child.expect_exact([CLEAR, pexpect.TIMEOUT], timeout=2) == 1
        child.send("r")  # the same file, graded again on request
        child.expect("Grading")
        child.expect(r"04_dce is complete: full marks, 100/100 points\.")
        child.expect("Save solution.py to regrade")
        seen = set(parents.read_text().split())
        assert len(seen) == 1, f"the gradings' parents: {seen}"
        zygote = int(seen.pop())
        assert b"graders.batch.zygote" in Path(f"/proc/{zygote}/cmdline").read_bytes()

        child.send("n")
        child.expect("fx-katas watch · 06_constant_folding", timeout=FAST)
        child.expect("still the stub")
        child.expect("Save solution.py to regrade")
        assert "05_cse" not in "".join(child.logfile_read.getvalue().split(CLEAR)[-1:])
        assert child.logfile_read.getvalue().count("Grading") == 2  # 04 only: not 05 (complete), not 06 (stub)
        assert_80_columns(child)
        quit_cleanly(child)
        assert "Traceback" not in child.logfile_read.getvalue()
        # Its pipe closed with the watcher: it ends within its next select (0.1 s).
        wait_for(lambda: not running(zygote), 10, "the zygote to end with the watcher")
    finally:
        child.close(force=True)
        if zygote and running(zygote):
            os.kill(zygote, signal.SIGKILL)


def test_n_p_and_l_move_at_once_without_grading(tmp_path, monkeypatch):
    """n, p and the list (l, then a number) open stubs and a stored grading without grading anything; n skips
    the complete kata, p does not; a long clone path with hyphens stays whole; a wrapped hint keeps its indent.
    The watcher has started its zygote all the same, so that the first save finds it warm."""
    tree = tmp_path / "my-fx-katas-clone" / "katas"
    stubs(tree, *KATAS)
    reference(tree, "03_conv_bn")
    stored_complete(monkeypatch, tmp_path / "state", tree, "03_conv_bn")
    child = spawn(tmp_path, tree, "--no-speed", "--kata", "02_matmul_bias_relu")
    child.timeout = FAST
    try:
        child.expect("fx-katas watch · 02_matmul_bias_relu")
        child.expect(f"1/{len(KATAS)} katas complete")
        child.expect("still the stub")
        child.expect("Save solution.py to regrade")
        assert_whole(child, tree)

        child.send("n")  # 03 is complete: on to 04
        child.expect("fx-katas watch · 04_dce")
        child.expect("Save solution.py to regrade")
        child.send("p")  # the previous kata, complete or not: its stored grading
        child.expect("fx-katas watch · 03_conv_bn")
        child.expect(r"✓ 03_conv_bn is complete, at the last grading of\s+this\s+same")
        child.expect(r"\(stored,\s+not\s+regraded")
        child.expect("Press n for the next kata not yet complete: 04_dce")
        child.expect("Save solution.py to regrade")
        child.send("p")
        child.expect("fx-katas watch · 02_matmul_bias_relu")
        child.expect("Save solution.py to regrade")

        child.send("l")
        child.expect("fx-katas watch · the katas")
        child.expect(r"  1  01_linear_relu +not started")
        child.expect(r"> 2  02_matmul_bias_relu +not started")
        child.expect(r"  3  03_conv_bn +✓ complete")
        child.expect(r"  0  10_verify_harness +not started")
        child.expect("Press a kata's number")
        child.send("0")
        child.expect("fx-katas watch · 10_verify_harness")
        child.expect("Save solution.py to regrade")
        child.send("h")
        child.expect("Hint 1 of 3 for 10_verify_harness")
        child.expect(r"\(ask again for hint 2")
        child.expect("Save solution.py to regrade")
        screen = last_screen(child)
        start = next(i for i, line in enumerate(screen) if line.startswith("Hint 1 of 3")) + 1
        hint = screen[start:next(i for i, line in enumerate(screen) if i >= start and line.startswith("("))]
        assert len(hint) > 1 and all(line.startswith("  ") for line in hint), hint  # wrapped, indented

        child.send("l")
        child.expect("Press a kata's number")
        child.send("1")
        child.expect("fx-katas watch · 01_linear_relu")
        child.expect("Save solution.py to regrade")
        child.send("p")
        child.expect("This is the first kata")
        child.expect("Save solution.py to regrade")
        assert "Grading" not in child.logfile_read.getvalue()
        assert_whole(child, tree)
        assert_80_columns(child)
        assert len(zygotes_of(child.pid)) == 1  # started with the watcher: loading while the learner reads
        quit_cleanly(child, "q")
    finally:
        child.close(force=True)


def test_each_function_shows_its_first_failure(tmp_path):
    """Kata 08 with find_elementwise_chains written (the reference's, but blind to nn-module spellings) and
    fuse_elementwise_chains still the stub: find's failure shows, then fuse's stub failure, not the stub's
    alone. The clone's path has hyphens: the file's path stays whole in the sentences."""
    kata = "08_elementwise_chains"
    tree = tmp_path / "fx-katas" / "katas"
    stubs(tree, kata)
    ref = (REPO_ROOT / "reference" / kata / "solution.py").read_text()
    stub = (tree / kata / "solution.py").read_text()
    find = ref[:ref.index("\nclass _ChainValue")]  # the reference's imports, tables, elementwise_kind, find
    blind, replaced = re.subn(r"^MODULE_KINDS = .*$", "MODULE_KINDS = {}", find, flags=re.M)
    assert replaced == 1
    (tree / kata / "solution.py").write_text(blind + "\n\n" + stub[stub.index("def fuse_elementwise_chains"):])
    child = spawn(tmp_path, tree, "--no-speed", "--kata", kata)
    try:
        child.expect("Grading")
        child.expect(r"First failing check of find_elementwise_chains:\s+test_L2_exact\[find_module_spellings\]")
        child.expect(r"find_elementwise_chains on model module_spellings returned \[\]")
        child.expect(r"First failing check of fuse_elementwise_chains:\s+test_L\d_\w+\[fuse_\w+\]")
        child.expect("fuse_elementwise_chains is still the stub")
        child.expect("Save solution.py to regrade")
        assert_whole(child, tree / kata / "solution.py")
        assert_80_columns(child)
        quit_cleanly(child, "q")
    finally:
        child.close(force=True)


def test_progress_counts_complete_katas_as_the_learner_earned_them(tmp_path, monkeypatch):
    """graders/learner/progress.py, what watch mode and score.py show between gradings: full marks within the float
    sums of shares count as complete, a grading that did not finish never does, a kata not available is not counted,
    points show one decimal at most, and what is remembered holds for the file graded only."""
    monkeypatch.setattr(progress, "STATE_DIR", tmp_path / "state")
    first, second = list(KATAS)[:2]
    assert progress.is_complete({"status": "graded", "points": 100 - 1e-9})  # 20/3 + ... summed in floats
    assert not progress.is_complete({"status": "timed out", "points": 100.0})
    assert progress.progress_line({first: {"status": "graded", "points": 20 / 3},
                                   second: {"status": "not available", "points": 0.0}}) == \
        "0/1 katas complete, 6.7/100 points"

    tree = tmp_path / "tree"
    (tree / first).mkdir(parents=True)
    (tree / first / "solution.py").write_text("# solved\n")
    progress.remember(tree, {first: {"status": "graded", "points": 100.0}})
    progress.remember(tree, {first: {"status": "timed out", "points": 0.0}})  # no verdict: what was known stays
    known = lambda: {key: progress.known_progress(tree)[first][key] for key in ("points", "complete")}  # noqa: E731
    assert known() == {"points": 100.0, "complete": True}
    assert progress.first_unfinished(tree) == second
    (tree / first / "solution.py").write_text("# edited since\n")  # another file: graded again before it counts
    assert known() == {"points": 0.0, "complete": False}
    assert progress.first_unfinished(tree) == first
