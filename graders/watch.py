"""The learner's loop: regrade a kata on every save (`uv run graders/watch.py --help`); the loop lives in
graders/learner/watch.py.

May import: graders.learner.
"""
import contextlib
import sys

from graders.learner.watch import main

if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
