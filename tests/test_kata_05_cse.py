"""Kata 05: what its messages tell a learner (the mutants themselves are in graders/katas/kata_05_cse/mutants.py)."""
from graders.run.session import grade
from graders.katas.kata_05_cse.mutants import MUTANTS
from graders.dev.mutation import Mutant, write_mutant_tree

KATA = "05_cse"


def test_failure_counts_must_match_removed_nodes(tmp_path):
    """A pass that merges correctly but returns the wrong count is told so, on the model it got wrong."""
    wrong_count = Mutant("counts_from_one", "    merged = 0\n", "    merged = 1\n", caught_at=1)
    results = grade(KATA, write_mutant_tree(tmp_path, KATA, wrong_count), seed=0, levels=(1,))
    message = next(r.message for r in results if r.check == "duplicate_chains_merge")
    assert "on the model `duplicate_chains_merge`" in message
    assert "returned 6 but removed 5 node(s)" in message


def test_counting_groups_is_told_the_nodes_merged(tmp_path):
    """Three copies of one expression: a pass that counts merge groups hears both numbers."""
    groups = next(m for m in MUTANTS if m.name == "counts_merge_groups")
    results = grade(KATA, write_mutant_tree(tmp_path, KATA, groups), seed=0, levels=(2,))
    message = next(r.message for r in results if r.check == "three_copies_of_one_expression")
    assert "returned 3 but removed 7 node(s)" in message
