"""The static scan of a solution tree (`uv run graders/scan.py DIR`); the scan lives in
graders/isolation/scan.py.

May import: graders.isolation.
"""
import sys

from graders.isolation.scan import main

if __name__ == "__main__":
    sys.exit(main())
