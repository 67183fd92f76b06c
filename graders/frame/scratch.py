"""Temporary folders that a killed process does not leave behind: each is claimed by a lock its process
holds while it lives, and the next process that makes one with the same prefix removes those whose claim
nobody holds. A SIGKILL runs no clean-up; before, it left grading's scratch folders (with the run's seed) and
a killed organiser's staging folder (with every team's solution.py) in /tmp for good.

Used by score.py's staging, the grading processes' scratch (graders/batch/processes.py) and the nurseries'
socket folders (graders/competition/nurseries.py). Files written whole or not at all (`write_whole`): the stored
runs and job results (graders/competition/store.py), the export cache (graders/run/exported.py), a team's
staged solution files (graders/competition/nurseries.py).

May import: the standard library only.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

CLAIM = "owner"


def sweep(base: Path, prefix: str) -> None:
    """Remove the folders `base/prefix*` whose claim no living process holds."""
    for stale in base.glob(f"{prefix}*"):
        try:
            with open(stale / CLAIM, "rb") as claim:
                fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # alive
        except OSError:
            continue  # no claim yet (being made), or gone: its owner's business
        shutil.rmtree(stale, ignore_errors=True)


def claim_folder(prefix: str, base: Path | None = None) -> tuple[Path, IO]:
    """A new folder `base/prefix...` (base: the system's temporary folder), and its claim: an open file this
    process holds locked until it closes it or dies. Unclaimed folders of the same prefix go first."""
    base = Path(base or tempfile.gettempdir())
    sweep(base, prefix)
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    claim = open(folder / f"{CLAIM}.part", "wb")
    fcntl.flock(claim, fcntl.LOCK_EX)
    os.rename(folder / f"{CLAIM}.part", folder / CLAIM)  # claimed before any sweep can see the claim
    return folder, claim


@contextmanager
def claimed_folder(prefix: str, base: Path | None = None) -> Iterator[Path]:
    """claim_folder as a context: the folder is removed and its claim let go on the way out."""
    folder, claim = claim_folder(prefix, base)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        claim.close()


def write_whole(path: Path, data: bytes, mode: int | None = None) -> None:
    """`data` as `path`, whole or not at all: written to a file of this call's own beside it (a dot file, which no
    reader lists), then renamed over `path`. Writers of the same path at once each land whole, the last one wins.
    `mode`: the file's permissions (mkstemp makes it 0600)."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        if mode is not None:
            os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
