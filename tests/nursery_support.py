"""Shared by the tests whose isolated gradings take their workers from one nursery (graders/isolation/nursery.py):
`warm_nursery`, a nursery over a folder for the length of a block.

May import: the standard library and graders.isolation.
"""
from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from graders.isolation.nursery import open_nursery


@contextmanager
def warm_nursery(solutions: Path, prefix: str):
    """A nursery over `solutions` (read-only inside), its socket in a folder of its own named `prefix`...: a Unix
    socket's path has 107 bytes at most, which pytest's temporary folders can pass. Yields the socket's path; the
    nursery is closed and the folder removed after the block."""
    sockets = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        warm = open_nursery(solutions, sockets)
        try:
            yield warm.socket_path
        finally:
            warm.close()
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
