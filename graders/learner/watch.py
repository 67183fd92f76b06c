"""Watch mode: the kata you are on, regraded every time you save its solution.py.

    uv run graders/watch.py                      # start on the first kata not yet complete
    uv run graders/watch.py --kata 03_conv_bn    # start on this one
    uv run graders/watch.py --no-speed           # skip the speed level (complete = every other check passes)

The screen shows points per level and, for each function the kata asks for (its manifest's [api]), the
first failing check's sentence and hint: a failure that names none of them counts under the first, and
"still the stub" failures come last. Correctness levels are graded first; the speed level only once they
all pass. At full marks the screen says so, with the speed level's figures (the speedup and the threshold
it had to beat, the fresh-tensor bytes or the traffic before and after where the check counts them), and waits.
Keys: n the next kata not yet complete, p the previous kata, l the list of katas (choose one by its
number: 1-9, 0 for the tenth), h the next hint, r regrade, q or Ctrl-C quit. Moving to a kata grades
nothing that is already known: a solution.py still the shipped stub is judged from its bytes (the
manifest's digest of the stub: graders/batch/summary.py), a file graded before (this session or, points
only, a stored grading of the same file) shows that grading; r regrades, and so does a save. Each grading
runs in a pytest process of its own, so a broken file costs one grading, never the watcher. Those processes
are forked from a zygote (graders/batch/zygote.py) that imports torch, pytest and the graders once, from the
moment the watcher starts, and stays as long as the watcher: a save is graded at once instead of after a new
interpreter's imports. (The zygote holds the graders as they were when it started: restart the watcher after
updating the project.)

May import: graders.frame, graders.batch, graders.learner.progress.
"""
from __future__ import annotations

import argparse
import queue
import re
import sys
import termios
import textwrap
import threading
import tty
from pathlib import Path

from watchfiles import watch

from graders.frame.levels import LEVELS, CheckResult
from graders.frame.catalogue import KATAS, REPO_ROOT, manifest
from graders.learner.progress import (first_unfinished, is_complete, known_progress, next_hint, points_text,
                                      progress_line, remember, solution_digest)
from graders.batch.processes import CORRECTNESS_LEVELS, SPEED_LEVELS, run_katas
from graders.batch.zygote import Zygote, keep_warm
from graders.batch.summary import is_shipped_stub, stub_records, summarise

WIDTH = 80
CLEAR = "\033[2J\033[H"
KEYS = "Keys: n next kata to do · p previous · l list · h hint · r regrade · q quit"
RULE = "─" * WIDTH
FAILURE_LINES = 8  # of each function's failure, where the screen shows more than one


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--solutions", type=Path, default=REPO_ROOT / "katas", metavar="DIR",
                        help="solution tree to watch: DIR/<kata>/solution.py (default: katas/)")
    parser.add_argument("--kata", choices=list(KATAS), metavar="KATA", help="start on this kata")
    parser.add_argument("--no-speed", action="store_true", help="never grade the speed level (L3)")
    parser.add_argument("--seed", type=int, default=0, help="grading seed (default 0: the same models each save)")
    args = parser.parse_args(argv)
    # What score.run_katas needs besides: grading on the CPU, one thread, score.py's own limits, the solution
    # loaded in the grading process (no sandboxed worker: the learner's own code, as `pytest katas/NN` grades
    # it), in processes forked from the session's zygote.
    args.device, args.threads, args.kata_timeout, args.kata_memory, args.isolate = "cpu", 1, 900.0, 8.0, False
    args.fork = True
    return args


def run_kata(kata: str, args: argparse.Namespace, levels: str) -> list[CheckResult] | dict:
    outcomes, _ = run_katas([kata], args.solutions, args, args.seed, levels)
    return outcomes[kata]


def grade(kata: str, args: argparse.Namespace) -> dict:
    """Correctness levels first; the speed level only once they all pass."""
    outcome = run_kata(kata, args, CORRECTNESS_LEVELS)
    if isinstance(outcome, dict):
        return outcome
    results: list[CheckResult] = outcome
    if all(r.passed for r in results):
        if args.no_speed:
            results += [CheckResult(kata, 3, "speed", False, 0.0, LEVELS[3].points, "skipped (--no-speed)", skipped=True)]
        else:
            speed = run_kata(kata, args, SPEED_LEVELS)
            if isinstance(speed, dict):
                return speed
            results += speed
    return summarise(kata, results)


def in_place(tree: Path) -> bool:
    """The learner edits the project's own katas/ (the commands shown then need no --solutions)."""
    return tree.resolve() == (REPO_ROOT / "katas").resolve()


def stub_result(kata: str) -> dict:
    """A stub's verdict without grading it: its correctness levels fail, the speed level waits (as graded)."""
    records = stub_records(kata, CORRECTNESS_LEVELS)
    return {**summarise(kata, records), "stub": True}


def level_lines(result: dict) -> list[str]:
    checks = [CheckResult.from_dict(c) for c in result.get("checks", [])]
    lines = []
    for number, level in LEVELS.items():
        at_level = [c for c in checks if c.level == number]
        if not at_level:
            lines.append(f"  L{number} {level.name:<8} {'-':>7}   waits until the other levels pass")
            continue
        earned = sum(c.points for c in at_level)
        failed = [c for c in at_level if not c.passed and not c.skipped]
        mark = "skipped" if all(c.skipped for c in at_level) else ("✓" if not failed else
                                                                 f"✗ {len(failed)} of {len(at_level)} checks fail")
        lines.append(f"  L{number} {level.name:<8} {earned:>3.0f}/{level.points:<3} {mark}")
    return lines


def wrap(text: str, indent: str = "  ") -> list[str]:
    """Lines of at most WIDTH columns where the words allow: never broken inside a word, a path or at a hyphen
    (a path longer than the screen keeps its own line whole)."""
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent,
                         break_on_hyphens=False, break_long_words=False) or [indent]


def paragraphs(text: str) -> list[str]:
    """Each line of `text` wrapped on its own, continued at its own indent (a hint's "  ...")."""
    return [w for line in text.splitlines() for w in wrap(line.strip(), line[:len(line) - len(line.lstrip())])]


def title(kata: str) -> list[str]:
    return wrap(f"fx-katas watch · {kata}: {KATAS[kata]}", "")


def size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} bytes"


def speed_lines(result: dict) -> list[str]:
    """The speed level's figures, check by check (graders/run/timing.py and the katas' own L3 checks)."""
    lines = []
    for c in (CheckResult.from_dict(c) for c in result.get("checks", [])):
        if c.level != 3:
            continue
        f, said = c.figures, []
        if c.skipped:
            said.append(f"not graded: {c.message}")
        if "speedup" in f:
            need = f"; this level needs at least {f['threshold']:.2f}x" if "threshold" in f else ""
            said.append(f"{f['speedup']:.2f}x the traced original on {f.get('device', 'cpu')}{need}")
        if "bytes_written_before" in f:
            said.append(f"fresh tensors written per call: {size(f['bytes_written_before'])} before, "
                        f"{size(f['bytes_written_after'])} after")
        if "memory_traffic_before" in f:
            limit = f" (at most {f['max_traffic_fraction']:.0%} allowed)" if "max_traffic_fraction" in f else ""
            said.append(f"memory traffic per call: {size(f['memory_traffic_before'])} before, "
                        f"{size(f['memory_traffic_after'])} after{limit}")
        if "learner_speedup" in f:
            said.append(f"your verify_pass measured {f['learner_speedup']:.2f}x, the grader "
                        f"{f.get('grader_speedup', float('nan')):.2f}x")
        lines += [f"  Speed (L3 {c.check}):", *[w for s in said or ["passed" if c.passed else "failed"]
                                                  for w in wrap(s, "    ")]]
    return lines


def function_of(message: str, api: list[str]) -> str:
    """The function the kata asks for that a check's message names first (none named: the first)."""
    found = [(m.start(), name) for name in api if (m := re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", message))]
    return min(found)[1] if found else api[0]


def first_failures(kata: str, failures: list[CheckResult]) -> list[tuple[str, CheckResult]]:
    """The first failing check of each function the kata asks for, stub failures last."""
    api = list(manifest(kata).get("api", {})) or [kata]
    first: dict[str, CheckResult] = {}
    for failure in failures:
        first.setdefault(function_of(failure.message.split("\n\n")[0], api), failure)
    shown = [(name, first[name]) for name in api if name in first]
    return sorted(shown, key=lambda item: "still the stub" in item[1].message)  # stable: api order otherwise


def result_lines(kata: str, result: dict, tree: Path, following: str | None) -> list[str]:
    if result.get("status") == "missing":
        return wrap(result["message"], "")
    if result.get("status") != "graded":
        return [f"Grading {result['status']}:", *wrap(result["message"])]
    points = f"{points_text(result.get('points', 0.0))}/100 points"
    if "checks" not in result:  # a stored grading of this same file: points only
        lines = wrap(f"{'✓ ' + kata + ' is complete' if is_complete(result) else kata + ': ' + points}, at the last "
                     "grading of this same solution.py (stored, not regraded; r regrades it to show each level).", "")
    else:
        lines = [*level_lines(result), RULE]
        failures = [CheckResult.from_dict(c) for c in result["checks"] if not c["passed"] and not c["skipped"]]
        if not failures:
            skipped = any(c["skipped"] for c in result["checks"])
            done = "every check that ran passes." if skipped else f"full marks, {points}."
            lines += [f"✓ {kata} is complete: {done}", *speed_lines(result)]
        else:
            shown = first_failures(kata, failures)
            for name, failure in shown:
                sentence = wrap(failure.message.split("\n\n")[0])  # the sentence and hint; graph dumps follow
                if len(shown) > 1:
                    sentence = sentence[:FAILURE_LINES - 1] + ["  …"] if len(sentence) > FAILURE_LINES else sentence
                lines += [*wrap(f"First failing check{' of ' + name if len(shown) > 1 else ''}: {failure.test_id}", ""),
                          *sentence]
            every = f"uv run pytest katas/{kata}" + ("" if in_place(tree) else f" --solutions {tree}")
            lines += wrap(f"(every check: {every})")
    if is_complete(result):
        lines += [RULE, *wrap(f"Press n for the next kata not yet complete: {following} ({KATAS[following]})."
                              if following else "Every kata is complete: press l for the list, q to quit.", "")]
    return lines


def screen(kata: str, result: dict, progress: str, tree: Path, note: str = "", following: str | None = None) -> str:
    lines = [*title(kata), progress, RULE, *result_lines(kata, result, tree, following)]
    if note:
        lines += [RULE, *paragraphs(note)]
    lines += [RULE, "Save solution.py to regrade.", KEYS]
    return "\n".join(lines)


class Keys:
    """Single keystrokes from the terminal, without echo, restored on exit; nothing when stdin is no tty."""

    def __init__(self, events: queue.Queue):
        self.events = events
        self.saved = None

    def __enter__(self):
        if sys.stdin.isatty():
            self.saved = termios.tcgetattr(sys.stdin)
            tty.setcbreak(sys.stdin)
            threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self):
        while True:
            key = sys.stdin.read(1)
            if not key:
                return
            self.events.put(("key", key.lower()))

    def __exit__(self, *exc):
        if self.saved is not None:
            termios.tcsetattr(sys.stdin, termios.TCSADRAIN, self.saved)


def watch_saves(tree: Path, events: queue.Queue, stop: threading.Event) -> None:
    for changes in watch(tree, stop_event=stop, watch_filter=lambda _, path: path.endswith("solution.py")):
        for _, path in changes:
            events.put(("saved", Path(path).parent.name))


class Katas:
    """What is known of each kata of the tree without grading it, and its gradings."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.tree = args, args.solutions
        self.graded: dict[str, tuple[str | None, dict]] = {}  # this session's gradings: (the file's digest, result)

    def source(self, kata: str) -> bytes | None:
        try:
            return (self.tree / kata / "solution.py").read_bytes()
        except OSError:
            return None

    def known(self, kata: str) -> dict | None:
        """The kata's result if it needs no grading: missing, the stub, or graded before for this same file."""
        source = self.source(kata)
        if source is None:
            return {"status": "missing", "points": 0.0, "message": f"There is no {self.tree / kata}/solution.py: "
                                                                   f"copy katas/{kata}/ there to start this kata."}
        if is_shipped_stub(kata, source):
            return stub_result(kata)
        digest = solution_digest(self.tree, kata)
        if kata in self.graded and self.graded[kata][0] == digest:
            return self.graded[kata][1]
        stored = known_progress(self.tree).get(kata, {})
        return dict(stored) if "digest" in stored else None  # known_progress's default for a file never graded

    def grade(self, kata: str) -> dict:
        digest, result = solution_digest(self.tree, kata), grade(kata, self.args)
        self.graded[kata] = (digest, result)
        remember(self.tree, {kata: result})
        return result

    def complete(self, kata: str) -> bool:
        return is_complete(self.known(kata) or {})

    def following(self, kata: str) -> str | None:
        """The next kata not yet complete, after `kata` and then from the first (rustlings' order)."""
        names = list(KATAS)
        start = names.index(kata) + 1
        return next((k for k in names[start:] + names[:start - 1]
                     if self.source(k) is not None and not self.complete(k)), None)

    def status(self, kata: str) -> str:
        result = self.known(kata)
        if result is None:
            return "changed since graded" if kata in self.graded else "not graded"
        if result.get("status") == "missing":
            return "no solution.py"
        if result.get("stub"):
            return "not started"
        if result.get("status") != "graded":
            return f"grading {result['status']}"
        return "✓ complete" if is_complete(result) else f"{points_text(result.get('points', 0.0))}/100 points"


def list_screen(katas: Katas, current: str, progress: str) -> str:
    lines = ["fx-katas watch · the katas", progress, RULE]
    for number, kata in enumerate(KATAS, 1):
        key = str(number % 10) if number <= 10 else " "
        row = f"{'>' if kata == current else ' '} {key}  {kata:<22} {katas.status(kata):<22} {KATAS[kata]}"
        lines.append(row if len(row) <= WIDTH else row[:WIDTH - 1] + "…")
    return "\n".join([*lines, RULE, "Press a kata's number to go to it (0 for the tenth), any other key to go back.",
                      "q quit"])


def run(args: argparse.Namespace) -> int:
    keep_warm()  # a learner's saves come minutes apart: the zygote waits for them, and ends with the watcher
    Zygote.get()  # started now, loading while the learner reads and edits: warm by the first save
    katas = Katas(args)
    names = list(KATAS)
    kata = args.kata or next((k for k in names if katas.source(k) is not None and not katas.complete(k)),
                             first_unfinished(args.solutions))
    events: queue.Queue = queue.Queue()
    stop = threading.Event()
    threading.Thread(target=watch_saves, args=(args.solutions, events, stop), daemon=True).start()
    show = lambda text: print(CLEAR + text, flush=True)  # noqa: E731
    progress = lambda: progress_line(known_progress(args.solutions))  # noqa: E731
    try:
        with Keys(events):
            note, regrade, listing, result = "", False, False, None
            while True:
                if regrade or result is None:
                    result = None if regrade else katas.known(kata)
                    if result is None:
                        grading = wrap(f"Grading {args.solutions / kata}/solution.py ...", "")
                        show("\n".join([*title(kata), "", *grading]))
                        result = katas.grade(kata)
                    regrade = False
                if listing:
                    show(list_screen(katas, kata, progress()))
                else:
                    following = katas.following(kata) if is_complete(result) else None
                    show(screen(kata, result, progress(), args.solutions, note, following))
                kind, value = events.get()
                note, moved = "", None
                if kind == "saved":
                    regrade = regrade or value == kata
                elif value == "q":
                    break
                elif listing:
                    listing = False
                    if value.isdigit() and (int(value) or 10) <= len(names):
                        moved = names[(int(value) or 10) - 1]
                elif value == "l":
                    listing = True
                elif value == "h":
                    note = next_hint(kata)
                elif value == "r":
                    regrade = True
                elif value == "n":
                    moved = katas.following(kata)
                    note = "" if moved else "Every other kata is complete (l lists them all)."
                elif value == "p":
                    moved = next((k for k in reversed(names[:names.index(kata)]) if katas.source(k) is not None), None)
                    note = "" if moved else "This is the first kata."
                if moved:
                    kata, result, regrade = moved, None, False
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
    print("\nfx-katas watch: bye. `uv run graders/score.py` grades every kata.")
    return 0


def main(argv=None) -> int:
    return run(parse_args(argv))
