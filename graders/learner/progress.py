"""The learner's progress and hints: what score.py and watch mode show between gradings.

State lives in `.fx-katas/` at the repository root (ignored by git; env FX_KATAS_STATE moves it): the last grading of each kata
per solution tree, and how many hints of each kata were shown. Hints themselves are data in each
kata's manifest (`graders/katas/kata_<name>/kata.toml`, `[hints]`), progressive and Socratic: a question
that leads, then a more concrete nudge, never the answer.

May import: graders.frame.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from graders.frame.catalogue import KATAS, REPO_ROOT, manifest

STATE_DIR = Path(os.environ.get("FX_KATAS_STATE", REPO_ROOT / ".fx-katas"))
# A kata's points are a float sum of shares (20 / 3 + ...): compare with a tolerance, never exactly.
EPSILON = 1e-6


def is_complete(result: dict) -> bool:
    """Full marks, or, when the speed level was skipped (--no-speed), every check that ran passed."""
    if "complete" in result:  # a stored summary (known_progress)
        return result["complete"]
    if result.get("status") != "graded":
        return False
    checks = result.get("checks") or []
    if checks and any(c.get("skipped") for c in checks):
        return all(c["passed"] or c["skipped"] for c in checks)
    return result["points"] >= result.get("max_points", 100.0) - EPSILON


def points_text(points: float) -> str:
    """Points as every total shows them: one decimal where there is one (229.6), none where not (230)."""
    return f"{round(points + EPSILON, 1):g}"


def progress_line(katas: dict[str, dict]) -> str:
    graded = {k: r for k, r in katas.items() if r.get("status") != "not available"}
    done = sum(is_complete(r) for r in graded.values())
    points = sum(r.get("points", 0.0) for r in graded.values())
    return f"{done}/{len(graded)} katas complete, {points_text(points)}/{100 * len(graded)} points"


def _read(name: str) -> dict:
    try:
        return json.loads((STATE_DIR / name).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _write(name: str, data: dict) -> None:
    STATE_DIR.mkdir(exist_ok=True)
    (STATE_DIR / ".gitignore").write_text("*\n")
    (STATE_DIR / name).write_text(json.dumps(data, indent=1))


def solution_digest(tree: Path, kata: str) -> str | None:
    path = tree / kata / "solution.py"
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def remember(tree: Path, katas: dict[str, dict]) -> None:
    """Store the last grading of each kata of `tree`, with a digest of the file that was graded."""
    state = _read("progress.json")
    mine = state.setdefault(str(tree.resolve()), {})
    for kata, result in katas.items():
        if result.get("status") == "graded":
            mine[kata] = {"points": result["points"], "complete": is_complete(result),
                          "digest": solution_digest(tree, kata)}
    _write("progress.json", state)


def known_progress(tree: Path) -> dict[str, dict]:
    """Each kata's last grading for the file it has now (0 points where it changed or was never graded)."""
    known = _read("progress.json").get(str(tree.resolve()), {})
    current = {k: v for k, v in known.items() if v["digest"] == solution_digest(tree, k)}
    return {kata: {"status": "graded", **current.get(kata, {"points": 0.0, "complete": False})} for kata in KATAS}


def first_unfinished(tree: Path) -> str:
    """The first kata not known complete for its current file: where a learner picks up."""
    known = known_progress(tree)
    return next((kata for kata in KATAS if not known[kata]["complete"]), list(KATAS)[-1])


def hints(kata: str) -> list[str]:
    return list(manifest(kata).get("hints", {}).values())


def next_hint(kata: str) -> str:
    """The next hint of `kata`, one more each time it is asked for (score.py --hint and watch mode's h share the
    count), with the ones shown before it below; once all are shown, all of them again."""
    all_hints = hints(kata)
    if not all_hints:
        return f"Kata {kata} has no hints yet: its README's Hints section is the place to look."
    state = _read("hints.json")
    shown = min(state.get(kata, 0) + 1, len(all_hints))
    state[kata] = shown
    _write("hints.json", state)
    more = (f"ask again for hint {shown + 1}" if shown < len(all_hints)
            else "that was the last one: the README's Hints section goes further")
    earlier = ["Seen before:", *(f"  {n}. {text}" for n, text in enumerate(all_hints[:shown - 1], 1))] if shown > 1 else []
    return "\n".join([f"Hint {shown} of {len(all_hints)} for {kata} ({KATAS[kata]}):", f"  {all_hints[shown - 1]}",
                      *earlier, f"({more}; `uv run graders/score.py --hints-reset {kata}` starts again at 1.)"])


def reset_hints(kata: str) -> str:
    """Forget which hints of `kata` were shown: the next one asked for is hint 1."""
    state = _read("hints.json")
    state.pop(kata, None)
    _write("hints.json", state)
    return f"Hints of {kata} start again: the next one shown is hint 1 of {len(hints(kata))}."
