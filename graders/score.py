"""Grade a solution tree kata by kata (`uv run graders/score.py --help`); the command lives in
graders/cli/score.py.

May import: graders.cli.
"""
import sys

from graders.cli.score import main

if __name__ == "__main__":
    sys.exit(main())
