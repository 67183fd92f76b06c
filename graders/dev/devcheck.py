"""The dev check, in rustlings' spirit: every kata is whole and its story is told once.

    uv run python -m graders.devcheck          # prints each problem, exits 1 if there is any

A kata is found wherever any of its three folders exists (katas/NN_name, reference/NN_name,
graders/katas/kata_NN_name), so a half-added kata is reported, not silently skipped. For each kata:
- the learner's folder holds only README.md, the stub solution.py and the one-line test file;
- the reference mirrors it; the grader folder has its declaration, manifest and mutants;
- the manifest's API names are defined by the stub and the reference, and its stub_sha256 is the stub's;
- the README quotes the manifest's thresholds and names every check as the grader has it;
- every level has at least one mutant that loses points there (the no-op counts for the speed level);
- every `README: "..."` (or `README, "..."`) a kata's files quote is in that README, a heading or its text.
That the stub scores 0 and the reference 100 is graded by tests/test_katas.py.

May import: graders.frame, graders.dev.mutation (and the kata graders, by name, through the catalogue).
"""
from __future__ import annotations

import ast
import hashlib
import re
import tomllib
from pathlib import Path

from graders.frame.catalogue import MANIFEST, REPO_ROOT

LEARNER_FILES = {"README.md", "solution.py", "test_{kata}.py"}
GRADER_FILES = ("__init__.py", MANIFEST, "mutants.py")
IGNORED = {"__pycache__", ".pytest_cache"}
KATA_NAME = re.compile(r"^\d\d_[a-z0-9_]+$")


def found_katas(root: Path) -> list[str]:
    names = {p.name for folder in ("katas", "reference") for p in (root / folder).glob("*") if p.is_dir()}
    names |= {p.name.removeprefix("kata_") for p in (root / "graders" / "katas").glob("kata_*") if p.is_dir()}
    return sorted(n for n in names if KATA_NAME.match(n))


def defined_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))} | {
        target.id for node in tree.body if isinstance(node, ast.Assign) for target in node.targets
        if isinstance(target, ast.Name)}


def threshold_spellings(value: float) -> set[str]:
    return {f"{value:g}x", f"{value:.1f}x", f"{value:.2f}x"}


def file_problems(root: Path, kata: str) -> list[str]:
    problems = []
    learner, reference, grader = root / "katas" / kata, root / "reference" / kata, root / "graders" / "katas" / f"kata_{kata}"
    expected = {name.format(kata=kata) for name in LEARNER_FILES}
    if not learner.is_dir():
        problems.append(f"{kata}: katas/{kata}/ is missing (README.md, solution.py, test_{kata}.py)")
    else:
        present = {p.name for p in learner.iterdir() if p.name not in IGNORED}
        problems += [f"{kata}: katas/{kata}/{name} is missing" for name in sorted(expected - present)]
        problems += [f"{kata}: katas/{kata}/{name} does not belong there: the learner's folder holds only "
                     f"README.md, solution.py and test_{kata}.py (graders stay out of katas/)"
                     for name in sorted(present - expected)]
        test = learner / f"test_{kata}.py"
        if test.is_file() and f'kata_level_tests("{kata}")' not in test.read_text():
            problems.append(f'{kata}: katas/{kata}/test_{kata}.py does not call kata_level_tests("{kata}")')
    if not (reference / "solution.py").is_file():
        problems.append(f"{kata}: reference/{kata}/solution.py is missing")
    problems += [f"{kata}: graders/katas/kata_{kata}/{name} is missing" for name in GRADER_FILES
                 if not (grader / name).is_file()]
    if problems:
        return problems
    manifest = tomllib.loads((grader / MANIFEST).read_text())
    for key in ("title", "api"):
        if not manifest.get(key):
            problems.append(f"{kata}: graders/katas/kata_{kata}/{MANIFEST} has no {key}")
    digest = hashlib.sha256((learner / "solution.py").read_bytes()).hexdigest()
    if manifest.get("stub_sha256") != digest:
        problems.append(f"{kata}: graders/katas/kata_{kata}/{MANIFEST}'s stub_sha256 is not the SHA-256 of "
                        f"katas/{kata}/solution.py: after editing the stub, set it to \"{digest}\" (a learner's "
                        "untouched file is told by it)")
    for where in (learner, reference):
        missing = set(manifest.get("api", {})) - defined_names(where / "solution.py")
        if missing:
            problems.append(f"{kata}: {where.relative_to(root)}/solution.py does not define {', '.join(sorted(missing))}, "
                            f"which the manifest's API names")
    return problems


README_QUOTE = re.compile(r'README[:,]?\s+"([^"]+)"')


def _flat(text: str) -> str:
    """Text with its line breaks, comment markers and markdown heading marks as single spaces."""
    return re.sub(r"\s*\n\s*(?:#+\s*)?", " ", text)


def readme_reference_problems(root: Path, kata: str) -> list[str]:
    """A section or sentence a kata's stub, reference, grader or manifest quotes from the kata's README must be
    there: a stub that sends the learner to a heading the README no longer has is a dead end."""
    readme = _flat((root / "katas" / kata / "README.md").read_text()).lower()
    files = [root / "katas" / kata / "solution.py", root / "reference" / kata / "solution.py",
             *sorted((root / "graders" / "katas" / f"kata_{kata}").glob("*.py")),
             root / "graders" / "katas" / f"kata_{kata}" / MANIFEST]
    problems = []
    for path in (f for f in files if f.is_file()):
        for quoted in README_QUOTE.findall(_flat(path.read_text())):
            if quoted.lower() not in readme:
                problems.append(f'{kata}: {path.relative_to(root)} quotes README "{quoted}", which '
                                f"katas/{kata}/README.md does not hold (a heading or its text)")
    return problems


def grader_problems(kata: str) -> list[str]:
    """What needs the grader imported: README against the manifest and the checks, mutants per level."""
    from graders.frame.catalogue import load_grader
    from graders.dev.mutation import kata_mutants

    grader, problems = load_grader(kata), []
    missing_levels = sorted({1, 2, 3, 4} - {c.level for c in grader.checks})
    if missing_levels:
        problems.append(f"{kata}: the grader has no checks at level(s) {', '.join(map(str, missing_levels))}; "
                        "every kata grades all four")
    readme = (REPO_ROOT / "katas" / kata / "README.md").read_text()
    for device, value in grader.thresholds.items():
        if not any(s in readme for s in threshold_spellings(value)):
            problems.append(f"{kata}: the README does not quote the {device} threshold {value:g}x of kata.toml")
    if grader.max_bytes_fraction is not None and f"{grader.max_bytes_fraction:.0%}" not in readme:
        problems.append(f"{kata}: the README does not quote the byte limit {grader.max_bytes_fraction:.0%} of kata.toml")
    hidden = grader.checks_at(4)
    named = {f"`{c.name}`" for c in grader.checks if f"`{c.name}`" in readme}
    if hidden and {f"`{hidden[0].name}`", f"`{hidden[-1].name}`"} <= named:  # "`model_1` to `model_5`"
        named |= {f"`{c.name}`" for c in hidden}
    unnamed = [c.name for c in grader.checks if f"`{c.name}`" not in named]
    if unnamed:
        problems.append(f"{kata}: the README does not name these checks (in backticks, as the grader has them): "
                        + ", ".join(unnamed))
    mutants = kata_mutants(kata)
    caught = {m.caught_at for m in getattr(mutants, "MUTANTS", [])} | ({3} if hasattr(mutants, "NO_OP") else set())
    uncovered = sorted({1, 2, 3, 4} - caught)
    if uncovered:
        problems.append(f"{kata}: no mutant loses points at level(s) {', '.join(map(str, uncovered))}; "
                        f"add one to graders/katas/kata_{kata}/mutants.py")
    return problems


def problems(root: Path = REPO_ROOT) -> list[str]:
    found = []
    for kata in found_katas(root):
        kata_problems = file_problems(root, kata)
        if not kata_problems:
            kata_problems = readme_reference_problems(root, kata)
        if not kata_problems and root == REPO_ROOT:
            kata_problems = grader_problems(kata)
        found += kata_problems
    return found


def main() -> int:
    found = problems()
    print("\n".join(found) or f"dev check: {len(found_katas(REPO_ROOT))} katas, all whole.")
    return 1 if found else 0

