"""bench/suite_census.py, the tool the suite's CPU figures in docs/contributors.md come from: it finds every
process of a command's tree, forked ones and grandchildren included, with the CPU each spent and the test each
worked for."""
import json
import subprocess
import sys
import textwrap

from graders.frame.catalogue import REPO_ROOT

# A parent that starts a child (which works for a named test and forks two grandchildren, one of which execs a
# program of its own after a while) and burns CPU itself.
TREE = textwrap.dedent("""
    import os, subprocess, sys, time

    def burn(seconds):  # then idle a while, so that the census reads the process once it has burnt it all
        end = time.process_time() + seconds
        while time.process_time() < end:
            pass
        time.sleep(0.5)

    if sys.argv[1:] == ["child"]:
        late = os.fork()  # read first with its parent's command line, then a program of its own
        if late == 0:
            time.sleep(0.3)
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(0.5)  # exec'd late"])
        pid = os.fork()
        burn(0.8)
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        os.waitpid(late, 0)
    else:
        env = {**os.environ, "PYTEST_CURRENT_TEST": "tests/test_made_up.py::test_starts_a_child (call)"}
        subprocess.run([sys.executable, "-c", open(__file__).read(), "child"], env=env, check=True)
        burn(0.4)
""")


def test_the_census_counts_every_process_of_the_tree_with_its_test(tmp_path):
    script, report = tmp_path / "tree.py", tmp_path / "census.json"
    script.write_text(TREE.replace("open(__file__).read()", repr(TREE)))
    done = subprocess.run([sys.executable, "bench/suite_census.py", "--interval", "0.05", "--json", str(report), "--",
                           str(script)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    records = json.loads(report.read_text())
    assert len(records) == 4, records
    assert any(r["kind"] == "python -c import time; time.sleep(0.5)" for r in records), records  # not "forked by"
    root = next(r for r in records if r["owner"] == "(the command itself)")
    child = next(r for r in records if r["kind"].startswith("python -c import os"))
    grandchild = next(r for r in records if r["kind"].startswith("forked by python -c"))
    assert root["kind"] == "the command itself: tree.py" and root["cpu"] >= 0.35
    assert child["owner"] == grandchild["owner"] == "tests/test_made_up.py::test_starts_a_child"
    assert child["cpu"] >= 0.75 and grandchild["cpu"] >= 0.75  # each burnt 0.8 s, counted by the kernel in ticks
    assert "tests/test_made_up.py::test_starts_a_child" in done.stdout and "4 processes" in done.stdout
