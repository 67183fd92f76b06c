"""Watch mode: the kata you are on, regraded every time you save its solution.py.

    uv run graders/watch.py                      # start on the first kata not yet complete
    uv run graders/watch.py --kata 03_conv_bn    # start on this one
    uv run graders/watch.py --no-speed           # skip the speed level (complete = every other check passes)

The screen shows points per level, the first failing check's sentence and hint, and, once the kata
reaches full marks, moves on to the next. Correctness levels are graded first; the speed level only
once they all pass. Keys: h the next hint, n skip to the next kata, r regrade, q or Ctrl-C quit.
Each grading runs in its own pytest subprocess (as score.py does), so a broken file costs one grading,
never the watcher.

May import: graders.frame, graders.batch, graders.learner.progress.
"""
from __future__ import annotations

import argparse
import queue
import sys
import termios
import textwrap
import threading
import tty
from pathlib import Path

from watchfiles import watch

from graders.frame.levels import LEVELS, CheckResult
from graders.frame.catalogue import KATAS, REPO_ROOT
from graders.learner.progress import first_unfinished, is_complete, known_progress, next_hint, progress_line, remember
from graders.batch.processes import CORRECTNESS_LEVELS, SPEED_LEVELS, run_katas
from graders.batch.summary import summarise

WIDTH = 80
CLEAR = "\033[2J\033[H"
KEYS = "h hint · n next kata · r regrade · q quit"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--solutions", type=Path, default=REPO_ROOT / "katas", metavar="DIR",
                        help="solution tree to watch: DIR/<kata>/solution.py (default: katas/)")
    parser.add_argument("--kata", choices=list(KATAS), metavar="KATA", help="start on this kata")
    parser.add_argument("--no-speed", action="store_true", help="never grade the speed level (L3)")
    parser.add_argument("--seed", type=int, default=0, help="grading seed (default 0: the same models each save)")
    args = parser.parse_args(argv)
    # What score.run_katas needs besides: grading on the CPU, one thread, score.py's own limits, in process
    # (the learner's own code: print and breakpoint() work).
    args.device, args.threads, args.kata_timeout, args.kata_memory, args.isolate = "cpu", 1, 900.0, 8.0, False
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
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent) or [indent]


def title(kata: str) -> list[str]:
    return wrap(f"fx-katas watch · {kata}: {KATAS[kata]}", "")


def screen(kata: str, result: dict, progress: str, tree: Path, note: str = "") -> str:
    rule = "─" * WIDTH
    lines = [*title(kata), progress, rule, *level_lines(result), rule]
    failures = [CheckResult.from_dict(c) for c in result.get("checks", []) if not c["passed"] and not c["skipped"]]
    if result.get("status") != "graded":
        lines += [f"Grading {result['status']}:", *wrap(result["message"])]
    elif failures:
        first = failures[0]
        sentence = first.message.split("\n\n")[0]  # the sentence and hint; the graph dumps follow a blank line
        every = f"uv run pytest katas/{kata}" + (
            "" if tree.resolve() == (REPO_ROOT / "katas").resolve() else f" --solutions {tree}")
        lines += [f"First failing check: {first.test_id}", *wrap(sentence), *wrap(f"(every check: {every})")]
    else:
        lines += [f"✓ {kata} is complete."]
    if note:
        lines += [rule, *[w for paragraph in note.splitlines() for w in wrap(paragraph, "")]]
    lines += [rule, f"Save solution.py to regrade.  {KEYS}"]
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


def next_kata(kata: str) -> str | None:
    names = list(KATAS)
    return names[names.index(kata) + 1] if kata != names[-1] else None


def run(args: argparse.Namespace) -> int:
    kata = args.kata or first_unfinished(args.solutions)
    known: dict[str, dict] = {}
    events: queue.Queue = queue.Queue()
    stop = threading.Event()
    threading.Thread(target=watch_saves, args=(args.solutions, events, stop), daemon=True).start()
    show = lambda text: print(CLEAR + text, flush=True)  # noqa: E731
    try:
        with Keys(events):
            note, regrade = "", True
            while True:
                if regrade:
                    show("\n".join([*title(kata), "", *wrap(f"Grading {args.solutions / kata}/solution.py ...", "")]))
                    known[kata] = grade(kata, args)
                    remember(args.solutions, {kata: known[kata]})
                    if is_complete(known[kata]) and next_kata(kata):
                        done, kata = kata, next_kata(kata)
                        note = f"✓ {done} is complete: on to {kata} ({KATAS[kata]}). Read katas/{kata}/README.md."
                        known[kata] = grade(kata, args)
                        remember(args.solutions, {kata: known[kata]})
                    regrade = False
                show(screen(kata, known[kata], progress_line(known_progress(args.solutions)), args.solutions, note))
                kind, value = events.get()
                note = ""
                if kind == "saved":
                    regrade = value == kata
                elif value == "h":
                    note = next_hint(kata)
                elif value == "r":
                    regrade = True
                elif value == "n" and next_kata(kata):
                    kata, regrade = next_kata(kata), True
                elif value == "q":
                    break
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
    print("\nfx-katas watch: bye. `uv run graders/score.py` grades every kata.")
    return 0


def main(argv=None) -> int:
    return run(parse_args(argv))

