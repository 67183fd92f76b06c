"""Speed fidelity: the speed level never fails the reference and never passes a no-op.

    uv run bench/speed_fidelity.py            # 20 gradings of each side per kata (about 15 minutes)
    uv run bench/speed_fidelity.py -n 5 --kata 03_conv_bn
    uv run bench/speed_fidelity.py --device cuda   # on a GPU, against the cuda thresholds

For every kata, the reference solution and the kata's no-op mutant (graders/katas/kata_<name>/mutants.py:
NO_OP, or SPEED_NO_OP where the learner writes no pass) are graded at the speed level (L3) N times each,
alternately, with a new seed each time, in this one process, exactly as `pytest katas/<name>` grades
them. The table shows the speedups read (min / median / max), the threshold, how often the verdict was
wrong, and the margin: how far the reference's worst reading sits above the threshold. A no-op that
fails on the exact byte count shows "bytes" instead of a speedup. Kata 10's readings are the learner's
verifier's own, for dead-code elimination: the threshold applies to them. This is a benchmark, not a
test: run it on a quiet machine. bench/calibrate.py proposes thresholds from the same readings (`collect`).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tabulate import tabulate

from graders.frame.catalogue import KATAS, REPO_ROOT, load_grader


def spread(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}" if values else "-"


def reading(results) -> tuple[bool, float | None]:
    """Whether the speed level passed, and the speedup its threshold was held against."""
    figures = next((r.figures for r in results if "speedup" in r.figures), {})
    verifier = next((r.figures for r in results if r.check == "dead_code_speedup"), {})  # kata 10
    return all(r.passed for r in results), figures.get("speedup", verifier.get("learner_speedup"))


@dataclass
class Readings:
    """A kata's speed level graded n times per side on one device: the speedups read, and the wrong verdicts."""

    kata: str
    device: str
    n: int
    reference: list[float] = field(default_factory=list)
    no_op: list[float] = field(default_factory=list)  # timed readings only: a no-op failing on bytes reads none
    has_no_op: bool = False
    wrong_ref: int = 0      # reference gradings whose speed level failed
    wrong_no_op: int = 0    # no-op gradings whose speed level passed
    rounds: list[int] = field(default_factory=list)

    @property
    def no_op_on_bytes(self) -> int:
        """No-op gradings that failed on the exact byte count (no speedup read)."""
        return self.n - len(self.no_op) if self.has_no_op else 0


def collect(kata: str, n: int, scratch: Path, device: str = "cpu") -> Readings:
    """Grade the speed level (L3) of the kata's reference and its no-op n times each, alternately, a new
    seed each time, on `device`."""
    # Here, not at the top: `--help` (and calibrate.py's) answers without importing torch (4 s of CPU).
    from graders.dev.mutation import kata_mutants, write_mutant_tree
    from graders.run.session import grade

    mutants = kata_mutants(kata)
    no_op_mutant = getattr(mutants, "SPEED_NO_OP", None) or getattr(mutants, "NO_OP", None)
    no_op_tree = write_mutant_tree(scratch / "no_op", kata, no_op_mutant) if no_op_mutant else None
    found = Readings(kata, device, n, has_no_op=no_op_tree is not None)
    sides = ((REPO_ROOT / "reference", found.reference), (no_op_tree, found.no_op))
    for seed in range(n):
        for tree, readings in sides[:2 if no_op_tree else 1]:
            results = grade(kata, tree, seed=seed, levels=(3,), device=device)
            passed, speedup = reading(results)
            if speedup is not None:
                readings.append(speedup)
            found.rounds += [r.figures.get("rounds") for r in results if r.figures.get("rounds")]
            if tree == no_op_tree:
                found.wrong_no_op += passed
            else:
                found.wrong_ref += not passed
    return found


def measure(kata: str, n: int, scratch: Path, device: str = "cpu") -> list:
    """The table's row for one kata."""
    found = collect(kata, n, scratch, device)
    reference, no_op = found.reference, found.no_op
    threshold = load_grader(kata).thresholds.get(device)
    margin = f"{min(reference) / threshold - 1:+.0%}" if reference and threshold else "-"
    no_op_shown = "-" if not found.has_no_op else spread(no_op) if len(no_op) == n else (
        f"bytes ({n - len(no_op)} of {n})" if not no_op else f"{spread(no_op)}, bytes {n - len(no_op)}")
    return [kata, f"{threshold}x" if threshold else "-", spread(reference), f"{found.wrong_ref}/{n}", no_op_shown,
            f"{found.wrong_no_op}/{n}" if found.has_no_op else "-", margin,
            f"{statistics.mean(found.rounds):.1f}" if found.rounds else "-"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=20, help="gradings of each side per kata (default 20)")
    parser.add_argument("--kata", action="append", choices=list(KATAS), help="only this kata (repeatable)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="grade and time on this device, against its thresholds (default cpu)")
    args = parser.parse_args(argv)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error("--device cuda: torch sees no CUDA device on this machine")
    rows, started = [], time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        for kata in args.kata or list(KATAS):
            rows.append(measure(kata, args.n, Path(scratch) / kata, args.device))
            print(f"{kata} done in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    print(tabulate(rows, headers=["kata", "threshold", "reference min / median / max", "reference failed",
                                  "no-op min / median / max", "no-op passed", "margin", "mean rounds"]))
    print(f"\n{args.n} gradings per side and kata on {args.device}, {time.monotonic() - started:.0f} s in all.")
    return 1 if any(row[3] != f"0/{args.n}" or row[5] not in (f"0/{args.n}", "-") for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
