"""Mutants as data: the reference solution with one plausible bug (or a correct variant), as a source edit.

A kata's `mutants.py` lists them; graders/dev/mutation.py grades them. May import: the standard library.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str
    old: str          # text of the reference solution, occurring exactly once
    new: str          # what the bug puts there instead
    caught_at: int | None  # the level that must catch it (no lower level fails, this one does); None: correct
    caught_by: str | None = None  # the check of that level built to catch it, where one is: it must fail there

    def __str__(self) -> str:
        return self.name

    @property
    def levels(self) -> tuple[int, ...]:
        """The levels that decide the verdict: every level up to the one that catches it (speed only
        when that is the speed level: it takes longest and proves nothing about the others)."""
        last = self.caught_at or 4
        return tuple(level for level in range(1, last + 1) if level != 3 or self.caught_at == 3)


def Variant(name: str, old: str, new: str) -> Mutant:
    """An edit of the reference that is still a correct pass."""
    return Mutant(name, old, new, caught_at=None)
