"""Seed sweep: the correctness levels hold at any grading seed, not only at the few the project's tests use.

    uv run bench/seed_sweep.py                      # the reference of every kata at 10 random seeds (4 minutes)
    uv run bench/seed_sweep.py -n 3 --mutants       # and every mutant and variant at 3 (about 6 minutes)
    uv run bench/seed_sweep.py -n 20 --mutants 4    # and the mutants the hidden level must catch, at 20
    uv run bench/seed_sweep.py --seed 1363426176 --kata 05_cse   # replay a seed

Organisers grade with a secret seed (`score.py --seed`, the arena's own): the hidden level's models and the
inputs of every level are drawn from it, so a grader that is right at seed 0 may still fail a correct pass, or
pass a wrong one, at the seed of the day. For each seed this grades, in this one process as `pytest katas`
does, the reference at the correctness levels (1, 2 and 4: the speed level's repetitions are
bench/speed_fidelity.py's), which must keep full marks; with --mutants, each mutant of the kata's mutants.py
that a correctness level catches must still be caught first at that level (by the check built for it, where
it names one), and each correct variant must keep full marks. Random seeds are printed, so that a failure can
be replayed with --seed. Exit status 1 when any grading went wrong. This is a sweep, not a test: the project's
tests hold each of these at seed 0 (tests/test_katas.py, tests/test_mutants.py).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import random
import sys
import tempfile
import time
import warnings
from pathlib import Path

from tabulate import tabulate

from graders.frame.catalogue import KATAS, REPO_ROOT

CORRECTNESS_LEVELS = (1, 2, 4)


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def sweep(kata: str, seeds: list[int], scratch: Path, mutants: list[int] | None = None) -> list[str]:
    """What went wrong grading `kata` at these seeds, a sentence each (seed first): nothing when all held.
    `mutants`: None, the reference alone; [], also every mutant a correctness level catches and every variant;
    levels, only the mutants caught at those levels."""
    # Here, not at the top: `--help` answers without importing torch.
    from graders.dev.mutation import assert_caught_at_its_level, assert_keeps_full_marks, kata_mutants
    from graders.run.session import grade

    wrong = []
    module = kata_mutants(kata) if mutants is not None else None
    levels = mutants or CORRECTNESS_LEVELS
    edits = [(mutant, assert_caught_at_its_level) for mutant in getattr(module, "MUTANTS", ())
             if mutant.caught_at in levels and mutant.caught_at in CORRECTNESS_LEVELS]
    edits += [(variant, assert_keeps_full_marks) for variant in getattr(module, "VARIANTS", ()) if not mutants]
    for seed in seeds:
        for result in grade(kata, REPO_ROOT / "reference", seed=seed, levels=CORRECTNESS_LEVELS):
            if not result.passed:
                wrong.append(f"seed {seed}: the reference fails {result.test_id}: {first_line(result.message)}")
        for number, (mutant, holds) in enumerate(edits):
            try:  # what a mutant's graph prints as it fails (FX's traceback, warnings) is not the sweep's to show
                with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    holds(scratch / f"{kata}-{seed}-{number}", kata, mutant, seed=seed)
            except AssertionError as failure:
                wrong.append(f"seed {seed}: {mutant.name}: {first_line(str(failure))}")
    return wrong


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=10, help="random seeds to draw (default 10; ignored with --seed)")
    parser.add_argument("--seed", type=int, action="append", help="grade at this seed (repeatable)")
    parser.add_argument("--kata", action="append", choices=list(KATAS), help="only this kata (repeatable)")
    parser.add_argument("--mutants", nargs="*", type=int, metavar="LEVEL",
                        help="also each mutant that a correctness level catches (only those caught at these levels, "
                             "where given), and each correct variant")
    args = parser.parse_args(argv)
    seeds = args.seed or [random.SystemRandom().randrange(2**31) for _ in range(args.n)]
    print(f"Seeds: {' '.join(map(str, seeds))}", file=sys.stderr, flush=True)
    rows, failures, started = [], [], time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fx-katas-seed-sweep-") as scratch:
        for kata in args.kata or list(KATAS):
            wrong = sweep(kata, seeds, Path(scratch), args.mutants)
            rows.append([kata, len(seeds), len(wrong), first_line(wrong[0]) if wrong else "-"])
            failures += [f"{kata}, {sentence}" for sentence in wrong]
            print(f"{kata} done in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    print(tabulate(rows, headers=["kata", "seeds", "wrong", "first"]))
    if failures:
        print("\n" + "\n".join(failures))
    what = ("the reference" if args.mutants is None else "the reference, mutants and variants" if not args.mutants
            else f"the reference and the mutants caught at level {', '.join(map(str, args.mutants))}")
    print(f"\n{what} at {len(seeds)} seed(s), levels {', '.join(map(str, CORRECTNESS_LEVELS))}: "
          f"{len(failures)} wrong, {time.monotonic() - started:.0f} s in all.")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
