"""Watch mode, driven as a learner drives it: in a real terminal (a pty), saving files, pressing keys."""
import io
import os
import shutil
import signal
import sys

import pexpect

from graders.frame.catalogue import REPO_ROOT

FIRST, SECOND = "01_linear_relu", "02_matmul_bias_relu"


def default_interrupt():
    # A test run started in the background of a shell ignores SIGINT, and a child inherits that: Ctrl-C
    # would then do nothing to the watcher.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_watch_regrades_on_save_moves_on_and_quits_cleanly(tmp_path):
    tree = tmp_path / "tree"
    for kata in (FIRST, SECOND):
        shutil.copytree(REPO_ROOT / "katas" / kata, tree / kata)
    env = {**os.environ, "FX_KATAS_STATE": str(tmp_path / "state"), "COLUMNS": "80", "LINES": "40"}
    child = pexpect.spawn(sys.executable, [str(REPO_ROOT / "graders" / "watch.py"), "--solutions", str(tree),
                                           "--no-speed"], cwd=str(tmp_path), env=env, encoding="utf-8",
                          timeout=240, dimensions=(40, 80), preexec_fn=default_interrupt)
    child.logfile_read = screen = io.StringIO()
    try:
        child.expect(f"fx-katas watch · {FIRST}")
        child.expect("First failing check: test_L1_pattern")
        child.expect("still the stub")
        child.expect("Save solution.py to regrade")
        child.send("h")
        child.expect(f"Hint 1 of 3 for {FIRST}")
        child.expect("Save solution.py to regrade")

        (tree / FIRST / "solution.py").write_text((REPO_ROOT / "reference" / FIRST / "solution.py").read_text())
        child.expect(f"fx-katas watch · {SECOND}")
        child.expect("1/10 katas complete")
        child.expect(f"{FIRST} is complete: on to {SECOND}")
        child.expect("Save solution.py to regrade")
        assert all(len(line) <= 80 for line in screen.getvalue().replace("\x1b[2J\x1b[H", "\n").splitlines())

        child.sendintr()  # Ctrl-C
        child.expect("bye")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, (child.exitstatus, child.signalstatus)
