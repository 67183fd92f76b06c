"""Kata 09: what its messages must say, beyond the mutants being caught (graders/katas/kata_09_gelu/mutants.py)."""
from graders.run.session import grade
from graders.katas.kata_09_gelu.mutants import MUTANTS
from graders.dev.mutation import write_mutant_tree

KATA = "09_gelu"


def test_exact_gelu_is_named_in_the_message(tmp_path):
    emits_exact_gelu = next(m for m in MUTANTS if m.name == "emits_exact_gelu")
    results = grade(KATA, write_mutant_tree(tmp_path, KATA, emits_exact_gelu), seed=0, levels=(1,))
    message = next(r.message for r in results if r.check == "hf_new_gelu")
    assert "exact (erf) GELU" in message and 'approximate="tanh"' in message
