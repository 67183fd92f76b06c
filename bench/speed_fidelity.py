"""Speed fidelity: the speed level never fails the reference and never passes a no-op.

    uv run bench/speed_fidelity.py            # 20 gradings of each side per kata (about 15 minutes)
    uv run bench/speed_fidelity.py -n 5 --kata 03_conv_bn

For every kata, the reference solution and the kata's no-op mutant (graders/katas/kata_<name>/mutants.py:
NO_OP, or SPEED_NO_OP where the learner writes no pass) are graded at the speed level (L3) N times each,
alternately, with a new seed each time, in this one process, exactly as `pytest katas/<name>` grades
them. The table shows the speedups read (min / median / max), the threshold, how often the verdict was
wrong, and the margin: how far the reference's worst reading sits above the threshold. A no-op that
fails on the exact byte count shows "bytes" instead of a speedup. Kata 10's readings are the learner's
verifier's own, for dead-code elimination: the threshold applies to them. This is a benchmark, not a
test: run it on a quiet machine.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

from graders.run.session import grade
from graders.frame.catalogue import KATAS, REPO_ROOT, load_grader
from graders.dev.mutation import kata_mutants, write_mutant_tree


def spread(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}" if values else "-"


def reading(results) -> tuple[bool, float | None]:
    """Whether the speed level passed, and the speedup its threshold was held against."""
    figures = next((r.figures for r in results if "speedup" in r.figures), {})
    verifier = next((r.figures for r in results if r.check == "dead_code_speedup"), {})  # kata 10
    return all(r.passed for r in results), figures.get("speedup", verifier.get("learner_speedup"))


def measure(kata: str, n: int, scratch: Path) -> list:
    mutants = kata_mutants(kata)
    no_op_mutant = getattr(mutants, "SPEED_NO_OP", None) or getattr(mutants, "NO_OP", None)
    no_op_tree = write_mutant_tree(scratch / "no_op", kata, no_op_mutant) if no_op_mutant else None
    reference, no_op, wrong_ref, wrong_no_op, rounds = [], [], 0, 0, []
    sides = ((REPO_ROOT / "reference", reference), (no_op_tree, no_op))
    for seed in range(n):
        for tree, readings in sides[:2 if no_op_tree else 1]:
            results = grade(kata, tree, seed=seed, levels=(3,))
            passed, speedup = reading(results)
            if speedup is not None:
                readings.append(speedup)
            rounds += [r.figures.get("rounds") for r in results if r.figures.get("rounds")]
            if tree == no_op_tree:
                wrong_no_op += passed
            else:
                wrong_ref += not passed
    threshold = load_grader(kata).thresholds.get("cpu")
    margin = f"{min(reference) / threshold - 1:+.0%}" if reference and threshold else "-"
    no_op_shown = "-" if not no_op_tree else spread(no_op) if len(no_op) == n else (f"bytes ({n - len(no_op)} of {n})" if not no_op
                                                       else f"{spread(no_op)}, bytes {n - len(no_op)}")
    return [kata, f"{threshold}x" if threshold else "-", spread(reference), f"{wrong_ref}/{n}", no_op_shown,
            f"{wrong_no_op}/{n}" if no_op_tree else "-", margin, f"{statistics.mean(rounds):.1f}" if rounds else "-"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=20, help="gradings of each side per kata (default 20)")
    parser.add_argument("--kata", action="append", choices=list(KATAS), help="only this kata (repeatable)")
    args = parser.parse_args(argv)
    rows, started = [], time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        for kata in args.kata or list(KATAS):
            rows.append(measure(kata, args.n, Path(scratch) / kata))
            print(f"{kata} done in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    print(tabulate(rows, headers=["kata", "threshold", "reference min / median / max", "reference failed",
                                  "no-op min / median / max", "no-op passed", "margin", "mean rounds"]))
    print(f"\n{args.n} gradings per side and kata, {time.monotonic() - started:.0f} s in all.")
    return 1 if any(row[3] != f"0/{args.n}" or row[5] not in (f"0/{args.n}", "-") for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
