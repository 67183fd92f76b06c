"""Every command the docs show works as written: each `uv run ...` line of README.md, docs/*.md and the
katas' READMEs names a script or module that exists, each of its --flags is one that program's --help
lists (the subcommand's, for arena.py and dask), and each kata or path it names exists. Running every
command would grade for minutes; their flags are what drifts when a program changes."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from graders.frame.catalogue import KATAS, REPO_ROOT

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md")),
         *sorted((REPO_ROOT / "katas").glob("*/README.md"))]
FENCE = re.compile(r"```(?:sh|bash|console)?\n(.*?)```", re.S)
INLINE = re.compile(r"`(uv run [^`]+)`")
PLACEHOLDER = re.compile(r"NN|DIR|HOST|URL|TOKEN|RUN|FILE|path/to|Team|\$")


def documented_commands() -> list[tuple[str, str]]:
    """(page, command) for every `uv run` command of the pages: lines of code blocks, and inline code."""
    found = []
    for page in PAGES:
        text = page.read_text()
        lines = [line for block in FENCE.findall(text) for line in block.splitlines()] + INLINE.findall(text)
        for line in lines:
            command = re.split(r"\s+#\s", line.strip())[0].rstrip("&").strip()
            if command.startswith("uv run "):
                found.append((str(page.relative_to(REPO_ROOT)), command))
    return found


COMMANDS = documented_commands()


def program(words: list[str]) -> tuple[list[str], list[str]]:
    """The command line that prints the program's help (with its subcommands), and the arguments after it."""
    if words[0] == "pytest":
        return [sys.executable, "-m", "pytest", "-p", "no:xdist"], words[1:]
    if words[:2] == ["python", "-m"]:  # a module without options (the dev check): it must exist
        assert importlib.util.find_spec(words[2]) is not None, f"no module {words[2]}"
        return [], words[3:]
    if words[0] == "dask":
        return [str(Path(sys.executable).parent / "dask"), words[1]], words[2:]
    script = REPO_ROOT / words[0]
    assert script.is_file(), f"{words[0]} does not exist"
    subcommands = []
    if words[0] == "graders/arena.py":
        subcommands = [w for w in words[1:3] if not w.startswith("-") and w in {
            "serve", "create", "team", "close", "add", "freeze", "unfreeze", "exclude", "include", "announce", "log",
            "rejudge", "rejudging"}]
    return [sys.executable, str(script), *subcommands], words[1 + len(subcommands):]


HELPS: dict[tuple[str, ...], str] = {}  # each command's --help text, once per test run


def help_text(command: tuple[str, ...]) -> str:
    """`command --help`'s text, from HELPS where a process already printed it (`help_texts_of_one_script`)."""
    if not command:
        return ""
    if command not in HELPS:
        done = subprocess.run([*command, "--help"], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
        assert done.returncode == 0, f"{' '.join(command)} --help failed: {done.stderr[-1000:]}"
        HELPS[command] = done.stdout
    return HELPS[command]


# The script run as `python SCRIPT ARGS --help` would run it (runpy, as __main__), once for each of its command
# lines, in one process: one import of what it imports instead of one for each (the arena's 13 subcommands).
HELPS_IN_ONE_PROCESS = """
import contextlib, io, json, runpy, sys
texts = []
for line in json.loads(sys.argv[1]):
    sys.argv = [*line, "--help"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_path(line[0], run_name="__main__")
        except SystemExit as exit:
            assert exit.code in (0, None), f"{' '.join(line)} --help exited with {exit.code}"
    texts.append(out.getvalue())
print(json.dumps(texts))
"""


def help_texts_of_one_script(commands: list[tuple[str, ...]]) -> None:
    """help_text of each of `commands` ([python, script, *subcommands]), from one process."""
    lines = [list(command[1:]) for command in commands]
    done = subprocess.run([sys.executable, "-c", HELPS_IN_ONE_PROCESS, json.dumps(lines)], capture_output=True,
                          text=True, cwd=REPO_ROOT, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 0, f"{' '.join(commands[0][1:2])} --help failed: {done.stderr[-1000:]}"
    for command, text in zip(commands, json.loads(done.stdout.splitlines()[-1]), strict=True):
        HELPS[command] = text



def test_the_docs_show_commands():
    pages = {page for page, _ in COMMANDS}
    assert {"README.md", "docs/organisers.md", "docs/grading.md", "docs/contributors.md"} <= pages
    assert len(COMMANDS) > 40


def test_every_documented_command_exists_with_its_flags_and_katas():
    commands = [(page, command, shlex.split(command)[2:]) for page, command in COMMANDS]
    programs = {tuple(program(words)[0]) for _, _, words in commands}
    arena = sorted(p for p in programs if p[1:2] == (str(REPO_ROOT / "graders/arena.py"),))
    with ThreadPoolExecutor(4) as pool:  # each --help is a process start: side by side
        jobs = [pool.submit(help_texts_of_one_script, arena)]
        jobs += [pool.submit(help_text, p) for p in programs if p not in arena]
        for job in jobs:
            job.result()
    problems = []
    for page, command, words in commands:
        line, arguments = program(words)
        helped = help_text(tuple(line))
        for argument in arguments:
            flag = argument.split("=")[0]
            if flag.startswith("--") and not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", helped):
                problems.append(f"{page}: `{command}`: {flag} is not an option of {' '.join(line[1:])}")
        for given in re.findall(r"--kata[ =](\S+)", command):
            if given not in KATAS:
                problems.append(f"{page}: `{command}`: no kata {given}")
        for path in (a for a in arguments if re.match(r"(katas|reference|graders|bench|docs)/", a)):
            if not PLACEHOLDER.search(path) and not (REPO_ROOT / path.split("::")[0]).exists():
                problems.append(f"{page}: `{command}`: {path} does not exist")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("command, problem", [
    ("uv run graders/score.py --no-such-flag", "--no-such-flag is not an option"),
    ("uv run graders/arena.py log --no-such-flag", "--no-such-flag is not an option of"),  # the one-process helps
    ("uv run graders/score.py --kata 99_gone", "no kata 99_gone"),
    ("uv run pytest katas/99_gone", "katas/99_gone does not exist"),
])
def test_a_command_that_drifted_is_reported(monkeypatch, command, problem):
    """The check itself: a flag a program lost, a kata or a path that is gone."""
    monkeypatch.setattr(sys.modules[__name__], "COMMANDS", [("README.md", command)])
    with pytest.raises(AssertionError, match=re.escape(problem)):
        test_every_documented_command_exists_with_its_flags_and_katas()
