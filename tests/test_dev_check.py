"""The dev check (graders/devcheck.py): every kata is whole, and a half-added kata is reported."""
import shutil

import pytest

from graders.dev import devcheck
from graders.frame.catalogue import REPO_ROOT, KATAS


@pytest.mark.parametrize("kata", KATAS)
def test_kata_is_whole(kata):
    problems = devcheck.file_problems(REPO_ROOT, kata) or devcheck.grader_problems(kata)
    assert not problems, "\n".join(problems)


def test_every_kata_folder_is_found():
    assert devcheck.found_katas(REPO_ROOT) == list(KATAS)


def copy_of_kata(tmp_path, kata="03_conv_bn"):
    """A repository root holding one whole kata, copied from this one."""
    for folder in (f"katas/{kata}", f"reference/{kata}", f"graders/katas/kata_{kata}"):
        shutil.copytree(REPO_ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_a_whole_kata_has_no_file_problems(tmp_path):
    assert devcheck.problems(copy_of_kata(tmp_path)) == []


@pytest.mark.parametrize("half", ["grader only", "learner folder only", "no mutants", "stray file", "api not in stub"])
def test_a_half_added_kata_is_reported(tmp_path, half):
    root = copy_of_kata(tmp_path)
    new = "11_new_pass"
    if half == "grader only":
        shutil.copytree(root / "graders/katas/kata_03_conv_bn", root / f"graders/katas/kata_{new}")
    elif half == "learner folder only":
        shutil.copytree(root / "katas/03_conv_bn", root / f"katas/{new}")
    elif half == "no mutants":
        new = "03_conv_bn"
        (root / "graders/katas/kata_03_conv_bn/mutants.py").unlink()
    elif half == "stray file":
        new = "03_conv_bn"
        (root / "katas/03_conv_bn/conftest.py").write_text("")
    else:
        new = "03_conv_bn"
        stub = root / "katas/03_conv_bn/solution.py"
        stub.write_text(stub.read_text().replace("def fuse_conv_bn(", "def fuse_conv_bn_renamed("))
    problems = devcheck.problems(root)
    assert problems and all(p.startswith(f"{new}: ") for p in problems), problems


def test_a_readme_section_a_stub_quotes_must_be_in_the_readme(tmp_path):
    """Kata 03's stub sent learners to README "When folding is not allowed", a heading the README never had
    (it is "When the rewrite is not allowed"); a quote across a line break and a comment counts as one."""
    root = copy_of_kata(tmp_path)
    stub = root / "katas/03_conv_bn/solution.py"
    assert 'README: "When the rewrite is\n    not allowed"' in stub.read_text()
    assert devcheck.readme_reference_problems(root, "03_conv_bn") == []
    stub.write_text(stub.read_text().replace('README: "When the rewrite is', 'README: "When folding is'))
    models = root / "graders/katas/kata_03_conv_bn/models.py"
    models.write_text(models.read_text() + '\n# see README, "Where folding\n#   pays"\n# and README, "No such part"\n')
    assert devcheck.readme_reference_problems(root, "03_conv_bn") == [
        '03_conv_bn: katas/03_conv_bn/solution.py quotes README "When folding is not allowed", which '
        "katas/03_conv_bn/README.md does not hold (a heading or its text)",
        '03_conv_bn: graders/katas/kata_03_conv_bn/models.py quotes README "No such part", which '
        "katas/03_conv_bn/README.md does not hold (a heading or its text)"]


def test_a_stub_edited_without_its_digest_is_reported(tmp_path):
    """The manifest's stub_sha256 tells a learner's untouched stub (graders/batch/summary.py): a stub edited
    without it would be graded as a stub no more, or, worse, a stale digest would never match."""
    root = copy_of_kata(tmp_path)
    stub = root / "katas/03_conv_bn/solution.py"
    stub.write_text(stub.read_text() + "# a contributor's edit\n")
    problems = devcheck.problems(root)
    assert len(problems) == 1 and "stub_sha256 is not the SHA-256 of katas/03_conv_bn/solution.py" in problems[0]
