"""The dev check (`uv run python -m graders.devcheck`); it lives in graders/dev/devcheck.py.

May import: graders.dev.
"""
import sys

from graders.dev.devcheck import main

if __name__ == "__main__":
    sys.exit(main())
