"""Live competitions (`uv run graders/arena.py --help`): serve, create, team add, close; the commands live
in graders/arena/cli.py.

May import: graders.arena.
"""
import sys

from graders.arena.cli import main

if __name__ == "__main__":
    sys.exit(main())
