"""Loads the graders' pytest plugin for every run from this repository (kata folders and tests/), and
runs the project's own tests (tests/) on every core. A kata's grading (`pytest katas/NN`) always stays
in one process: its points summary and its timing need that."""
import os
from pathlib import Path

import pytest

pytest_plugins = ["graders.learner.pytest_plugin"]
TESTS = Path(__file__).parent / "tests"


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    only_project_tests = all(Path(arg.split("::")[0]).resolve().is_relative_to(TESTS) for arg in config.args)
    if (only_project_tests and config.pluginmanager.hasplugin("xdist") and config.option.numprocesses is None
            and not os.environ.get("PYTEST_XDIST_WORKER")):
        config.option.numprocesses = "auto"  # -n 0 or -p no:xdist runs them in one process
        if config.option.maxschedchunk is None:
            # Tests are handed out two at a time, in their collection order: tests/conftest.py puts the
            # tests that time last, so they meet each other rather than the long correctness tests.
            config.option.maxschedchunk = 2
