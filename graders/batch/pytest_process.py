"""A grading process started on its own: `python -m graders.batch.pytest_process ARGS` runs what
`python -m pytest ARGS` runs, then ends as a grading process forked by the zygote does (graders/batch/zygote.py),
without the interpreter's finalization (graders.frame.lifetimes.exit_now): the records and the progress file are
written and closed by then, and tearing down torch, Dynamo and every kata's modules cost 0.8-1.9 s of CPU a process
(`python -m pytest` grading kata 04's reference, 2026-11-29: 5.1-5.7 s of CPU against 6.1-6.6 s).

May import: graders.frame (lifetimes); pytest.
"""
import pytest

from graders.frame.lifetimes import exit_now

if __name__ == "__main__":
    exit_now(int(pytest.console_main()))
