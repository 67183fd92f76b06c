"""Mutant coverage: the checks of the correctness levels that no mutant fails.

    uv run bench/mutant_coverage.py                  # every kata (about 10 minutes)
    uv run bench/mutant_coverage.py --kata 09_gelu   # one

A check is proven by a mutant that fails it: a plausible wrong pass it catches (docs/contributors.md, Adding a
kata). tests/test_mutants.py grades each mutant only until the first check that fails it (the one it names,
`caught_by`, first), which says nothing of the other checks. This grades every mutant of levels 1, 2 and 4 on
every check of its level, at seed 0, in this one process, and prints, per kata, the checks that none fails: each
either catches a bug no mutant has yet (write one, naming the check as its `caught_by`) or catches nothing the
others do not. With --json FILE, each check and the mutants that fail it. Exit status 1 when a check is unproven.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

from graders.frame.catalogue import KATAS

LEVELS = (1, 2, 4)


def failed_by(kata: str, scratch: Path) -> dict[str, list[str]]:
    """Each check of `kata`'s levels 1, 2 and 4, and the mutants (of the level) that fail it."""
    # Here, not at the top: `--help` answers without importing torch.
    from graders.dev.mutation import kata_mutants, write_mutant_tree
    from graders.frame.catalogue import load_grader
    from graders.run.session import grade

    grader = load_grader(kata)
    found = {check.name: [] for level in LEVELS for check in grader.checks_at(level)}
    for number, mutant in enumerate(getattr(kata_mutants(kata), "MUTANTS", ())):
        if mutant.caught_at not in LEVELS:
            continue
        tree = write_mutant_tree(scratch / f"{kata}-{number}", kata, mutant)
        # What a mutant's graph prints as it fails (FX's traceback, warnings) is not the tool's to show.
        with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results = grade(kata, tree, seed=0, levels=(mutant.caught_at,))
        for result in results:
            if not result.passed and not result.skipped:
                found[result.check].append(mutant.name)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kata", action="append", choices=list(KATAS), help="only this kata (repeatable)")
    parser.add_argument("--json", type=Path, help="write each check and the mutants that fail it here")
    args = parser.parse_args(argv)
    report, unproven, started = {}, 0, time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fx-katas-mutant-coverage-") as scratch:
        for kata in args.kata or list(KATAS):
            report[kata] = failed_by(kata, Path(scratch))
            missing = [check for check, mutants in report[kata].items() if not mutants]
            unproven += len(missing)
            print(f"{kata}: {len(report[kata])} checks, "
                  + (f"no mutant fails {', '.join(missing)}" if missing else "each failed by a mutant"), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    print(f"\n{unproven} check(s) no mutant fails, {time.monotonic() - started:.0f} s in all.")
    return 1 if unproven else 0


if __name__ == "__main__":
    sys.exit(main())
