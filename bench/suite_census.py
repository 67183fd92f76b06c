"""Suite census: where a command's CPU goes, by the kind of process that spent it and by the test that started it.

    uv run bench/suite_census.py                                   # the project's tests (`pytest`), about 10 minutes
    uv run bench/suite_census.py --json census.json -- pytest tests/test_score.py -p no:xdist
    uv run bench/suite_census.py --top 40 -- graders/score.py --solutions reference --seed 5

The command (after `--`; `pytest` when none is given) runs with this interpreter, as `uv run` would run it
(`pytest ARGS` is `python -m pytest ARGS`, a `.py` path is that script). Every process it starts, and every
process those start, is read from /proc every `--interval` seconds (0.2 by default): its CPU (user and
system), its command line and the test it works for (PYTEST_CURRENT_TEST, inherited from the pytest worker
that started it, or failing that the test's folder under pytest's temporary directory in its command line,
or its parent's). At the end it prints:

- the wall time, the CPU the tree used, and how busy the machine's cores were (/proc/stat, so anything
  else running counts too: measure on a quiet machine);
- the CPU by kind of process: `-m MODULE`, a script's path, `python -c` (its first words), pytest-xdist's
  workers (the tests that run in process), a process forked by another (it has its parent's command line)
  as "forked by" its parent's kind;
- the CPU of the processes each test started, its `--top` largest. A test is known by the environment a
  process inherited from it, or by the test's folder in its command line or an ancestor's; a process started
  with an environment of its own (a sandbox) under a test that runs in process names none.

A process that lives less than one interval may be missed, and each one's CPU after its last reading is
lost (at most an interval's worth): the totals are a little low. The CPU of pytest-xdist's workers is the
in-process tests' together; `pytest --durations` splits it by test. Linux only (it reads /proc).
docs/contributors.md ("How long") says how the project's figures were measured with it.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from graders.frame.catalogue import REPO_ROOT

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
XDIST_WORKER = "exec(eval("  # execnet's bootstrap: how pytest-xdist starts a worker interpreter
XDIST_KIND = "pytest-xdist worker (the tests that run in process)"
FOLDER = "(a folder of) "
# A process with no test in its environment or its ancestors': a sandbox's environment is made anew, and a test that
# runs in process sets PYTEST_CURRENT_TEST after its worker started (/proc shows a process's first environment).
UNKNOWN = "(no test named: an environment of its own, started by a test in process or by such a process)"


def command_line(args: list[str]) -> list[str]:
    """What `uv run ARGS` runs, with this interpreter."""
    if not args or args[0] == "pytest":
        return [sys.executable, "-m", "pytest", *args[1:]]
    if args[0].endswith(".py"):
        return [sys.executable, *args]
    return args


def read_stat(pid: str) -> tuple[int, float, int] | None:
    """(parent pid, CPU seconds, start time in ticks) of a live process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            text = stat.read()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS, int(fields[19])


def read_identity(pid: int) -> tuple[str, str]:
    """A process's command line and the test it works for (its PYTEST_CURRENT_TEST, without the phase)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            command = cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        command = ""
    test = ""
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            for entry in environ.read().split(b"\0"):
                if entry.startswith(b"PYTEST_CURRENT_TEST="):
                    test = entry[len(b"PYTEST_CURRENT_TEST="):].decode(errors="replace").rsplit(" (", 1)[0]
    except OSError:
        pass
    return command, test


def busy_ticks() -> tuple[int, int]:
    """(busy, idle) ticks of all cores since boot (/proc/stat)."""
    with open("/proc/stat") as stat:
        fields = [int(f) for f in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    return sum(fields[:8]) - idle, idle


def sample(process: subprocess.Popen, interval: float) -> dict[str, dict]:
    """`process` and every descendant of it seen until it ends: {pid:start: {pid, ppid, command, test, cpu}}."""
    seen: dict[str, dict] = {}
    while True:
        ended = process.poll() is not None
        stats = {int(pid): s for pid in os.listdir("/proc") if pid.isdigit() and (s := read_stat(pid))}
        children = collections.defaultdict(list)
        for pid, (parent, _, _) in stats.items():
            children[parent].append(pid)
        stack, tree = [process.pid], {process.pid} & stats.keys()
        while stack:
            for child in children.get(stack.pop(), ()):
                if child not in tree:
                    tree.add(child)
                    stack.append(child)
        current, known = {}, set()  # this reading's records by pid; the pids read before this reading
        for pid in tree:
            parent, cpu, start = stats[pid]
            key = f"{pid}:{start}"
            if key in seen:
                known.add(pid)
            else:
                command, test = read_identity(pid)
                seen[key] = {"pid": pid, "ppid": parent, "command": command, "test": test}
            current[pid] = seen[key]
            seen[key]["cpu"] = cpu
        for pid in known:  # read again while it may still exec: no command line yet, or its parent's (forked)
            record, parent = current[pid], current.get(current[pid]["ppid"])
            if not record["command"] or (parent is not None and record["command"] == parent["command"]):
                command, test = read_identity(pid)
                if command:  # not gone meanwhile
                    record["command"], record["test"] = command, test
        if ended:
            return seen
        time.sleep(interval)


def kind(record: dict, by_pid: dict[int, dict]) -> str:
    """What a process was: a module, a script, a `python -c`, a pytest-xdist worker, or forked by another."""
    command = record["command"]
    parent = by_pid.get(record["ppid"])
    if XDIST_WORKER in command:
        return XDIST_KIND
    if parent is not None and parent["command"] == command and command:
        return "forked by " + kind(parent, by_pid)
    words = command.split()
    if not words:
        return "(exited before it was read)"
    if Path(words[0]).name == "bwrap":
        return "bwrap (a sandbox's launcher and init)"
    if "-m" in words[:-1]:
        return "-m " + words[words.index("-m") + 1]
    if "-c" in words[:-1]:
        return "python -c " + " ".join(words[words.index("-c") + 1:][:3])[:40]
    for word in words[:3]:
        if word.endswith(".py"):
            path = Path(word)
            name = str(path.relative_to(REPO_ROOT)) if path.is_absolute() and path.is_relative_to(REPO_ROOT) else path.name
            rest = words[words.index(word) + 1:words.index(word) + 2]
            return " ".join([name, *(w for w in rest if not w.startswith("-"))])
    return Path(words[0]).name


def owner(record: dict, by_pid: dict[int, dict]) -> str:
    """The test a process worked for: its own PYTEST_CURRENT_TEST, a test's folder in its command line, or its
    parent's (a sandbox's environment holds no PYTEST_CURRENT_TEST)."""
    seen = set()
    while record is not None and record["pid"] not in seen:
        seen.add(record["pid"])
        if record["test"]:
            return record["test"]
        if folder := re.search(r"/pytest-\d+/(?:popen-gw\d+/)?(test_\w+?)\d*/", record["command"]):
            return FOLDER + folder.group(1)
        record = by_pid.get(record["ppid"])
    return UNKNOWN


def merge_folders(tests: dict[str, list]) -> None:
    """Count a test's folder (pytest cuts its name to 30 characters) as that test where one test's name starts so."""
    for folder in [name for name in tests if name.startswith(FOLDER)]:
        prefix = folder[len(FOLDER):]
        matches = [name for name in tests if not name.startswith(FOLDER) and "::" in name
                   and name.split("::")[-1].startswith(prefix)]
        if len(matches) == 1:
            for i, value in enumerate(tests.pop(folder)):
                tests[matches[0]][i] += value


def table(rows: list[tuple[float, int, str]], total: float, top: int) -> str:
    lines = [f"{'CPU s':>8} {'share':>6} {'procs':>6}  what"]
    for cpu, count, name in sorted(rows, reverse=True)[:top]:
        lines.append(f"{cpu:8.1f} {cpu / total:6.1%} {count:6d}  {name}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, command = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     usage="uv run bench/suite_census.py [--interval S] [--top N] [--json FILE] "
                                           "[-- COMMAND ...]")
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between readings of /proc (0.2)")
    parser.add_argument("--top", type=int, default=30, help="how many kinds and tests to list (30)")
    parser.add_argument("--json", type=Path, help="also write every process seen (command, test, CPU) to this file")
    args = parser.parse_args(ours)
    if not Path("/proc/stat").exists():
        print("suite_census reads /proc: it runs on Linux only.", file=sys.stderr)
        return 2
    busy_before, idle_before = busy_ticks()
    started = time.monotonic()
    process = subprocess.Popen(command_line(command), cwd=REPO_ROOT)
    try:
        seen = sample(process, args.interval)
    except KeyboardInterrupt:
        process.terminate()
        process.wait()
        raise
    wall = time.monotonic() - started
    busy_after, idle_after = busy_ticks()
    busy, idle = busy_after - busy_before, idle_after - idle_before
    records = list(seen.values())
    by_pid = {r["pid"]: r for r in records}
    total = sum(r["cpu"] for r in records) or 1e-9
    kinds, tests = collections.defaultdict(lambda: [0.0, 0]), collections.defaultdict(lambda: [0.0, 0])
    for record in records:
        itself = record["pid"] == process.pid
        record["kind"] = ("the command itself: " if itself else "") + kind(record, by_pid)
        record["owner"] = "(the command itself)" if itself else owner(record, by_pid)
        kinds[record["kind"]][0] += record["cpu"]
        kinds[record["kind"]][1] += 1
        if not itself and record["kind"] != XDIST_KIND:
            tests[record["owner"]][0] += record["cpu"]
            tests[record["owner"]][1] += 1
    merge_folders(tests)
    print(f"\n{' '.join(command) or 'pytest'}: exit {process.returncode}, {wall:.1f} s wall, {total:.1f} s of CPU in "
          f"{len(records)} processes; the machine's {os.cpu_count()} cores were {busy / max(busy + idle, 1):.1%} busy")
    print("\nBy kind of process\n" + table([(c, n, k) for k, (c, n) in kinds.items()], total, args.top))
    print("\nThe processes each test started (the tests themselves are in the lines above: the command itself, or "
          "pytest-xdist's workers)\n"
          + table([(c, n, t) for t, (c, n) in tests.items()], total, args.top))
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))
    return process.returncode


if __name__ == "__main__":
    sys.exit(main())
