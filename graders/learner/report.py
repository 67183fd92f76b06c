"""What a learner reads after score.py: the table of katas and levels, the progress line, and the next step.

May import: graders.frame, graders.learner.progress.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from tabulate import tabulate

from graders.frame.catalogue import KATAS, REPO_ROOT
from graders.frame.levels import LEVELS
from graders.learner.progress import is_complete, points_text, progress_line


def level_cell(kata_result: dict, level: int) -> str:
    earned, possible = kata_result["levels"].get(str(level), (0.0, LEVELS[level].points))
    return f"{earned:.0f}/{possible:.0f}" if possible else "-"


def print_table(katas: dict[str, dict], total: float, possible: float) -> None:
    rows = []
    for kata, r in katas.items():
        if r["status"] == "not available":
            rows.append(["", kata, *["" for _ in LEVELS], "", "", "not yet available"])
            continue
        speed = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
        if r.get("speed_provisional"):  # the threshold was never measured on this device (graders/frame/kata.py)
            speed += " provisional"
        status = r["message"] if len(r["message"]) <= 100 else r["message"][:97] + "..."
        rows.append(["✓" if is_complete(r) else "", kata, *[level_cell(r, level) for level in LEVELS],
                     f"{r['points']:.1f}", speed, status])
    rows.append(["", "total", *["" for _ in LEVELS], f"{points_text(total)}/{possible:.0f}", "", ""])
    headers = ["done", "kata", *[f"L{n} {lv.name}" for n, lv in LEVELS.items()], "points", "speedup", "status"]
    print(tabulate(rows, headers=headers))
    note = provisional_note(katas)
    if note:
        print(note)
    print(progress_line(katas))


def provisional_note(katas: dict[str, dict]) -> str | None:
    """The sentence under the table where speed verdicts are provisional, or None."""
    provisional = [kata for kata, r in katas.items() if r.get("speed_provisional")]
    if not provisional:
        return None
    return (f"provisional: the L3 speed verdicts of {', '.join(provisional)} hold a threshold never calibrated on "
            f"this device (bench/calibrate.py); they are not a measured standard.")


def next_step(katas: dict[str, dict], args: argparse.Namespace) -> str | None:
    todo = next((k for k, r in katas.items() if r["status"] != "not available" and not is_complete(r)), None)
    if todo is None:
        return None
    def shown(path: Path) -> Path:  # as the learner types it, from the repository root
        try:
            return path.resolve().relative_to(REPO_ROOT)
        except ValueError:
            return path.resolve()
    where, command = f"edit {shown(args.solutions / todo)}/solution.py", f"uv run pytest katas/{todo}"
    if args.solutions.resolve() == (REPO_ROOT / "katas").resolve():
        where = f"read katas/{todo}/README.md, {where}"
    else:
        command += f" --solutions {shown(args.solutions)}"
    return (f"Next: kata {todo} ({KATAS[todo]}): {where}, then run `{command}` to see every check "
            f"(`uv run graders/score.py --hint {todo}` when stuck).")
