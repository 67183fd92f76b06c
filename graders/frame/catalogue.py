"""The catalogue of katas: one folder per kata grader, `graders/katas/kata_<name>/`, with its manifest.

The folder holds the grader's declaration (`__init__.py`, a module-level `KATA`), its model zoo, its
hidden-model generator, its mutants (`mutants.py`) and `kata.toml`, the data the grader, score.py and
the dev check read: title, API, speed thresholds, byte limits and hints. A kata exists once its
folder has a manifest; tests/test_dev_check.py proves the rest of it is there too.

May import: the standard library (a kata's grader module is imported by name, on request).
"""
from __future__ import annotations

import importlib
import tomllib
from functools import cache
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
GRADERS = REPO_ROOT / "graders"
MANIFEST = "kata.toml"


def grader_folder(kata: str, root: Path = REPO_ROOT) -> Path:
    return root / "graders" / "katas" / f"kata_{kata}"


def reference_source(kata: str) -> str:
    """The text of the kata's reference solution (reference/<kata>/solution.py): what a mutant or a variant edits."""
    return (REPO_ROOT / "reference" / kata / "solution.py").read_text()


def kata_names(root: Path = REPO_ROOT) -> list[str]:
    """Every kata with a grader manifest, in order."""
    return sorted(p.parent.name.removeprefix("kata_") for p in (root / "graders" / "katas").glob(f"kata_*/{MANIFEST}"))


@cache
def manifest(kata: str) -> dict:
    """The kata's kata.toml, parsed."""
    path = grader_folder(kata) / MANIFEST
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise KeyError(f"unknown kata {kata!r}; the katas are: {', '.join(KATAS)}") from None


KATAS: dict[str, str] = {kata: manifest(kata)["title"] for kata in kata_names()}


def grader_module_name(kata: str) -> str:
    return f"graders.katas.kata_{kata}"


def is_available(kata: str) -> bool:
    return kata in KATAS


def available_katas() -> list[str]:
    return list(KATAS)


def load_grader(kata: str):
    """The kata's grader: a `graders.frame.kata.Kata` declared in graders/katas/kata_<name>/__init__.py."""
    if kata not in KATAS:
        raise KeyError(f"unknown kata {kata!r}; the katas are: {', '.join(KATAS)}")
    return importlib.import_module(grader_module_name(kata)).KATA


def imports_torch_internals(katas) -> bool:
    """Does grading any of `katas` import torch internals on first use (Kata.imports_torch_internals: katas
    10-13)? A process that forks grading processes or workers then loads them once for all its children
    (graders/batch/zygote.py, graders/isolation/nursery.py). Names that are no kata count for nothing."""
    return any(kata in KATAS and load_grader(kata).imports_torch_internals for kata in katas)
