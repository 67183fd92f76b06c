"""Kata 07: what its failure messages say, beyond which level catches a mutant."""
from graders.run.session import grade
from graders.katas.kata_07_algebraic_simplify.mutants import MUTANTS
from graders.dev.mutation import write_mutant_tree

KATA = "07_algebraic_simplify"


def test_signbit_failure_says_so(tmp_path):
    plus_zero = next(m for m in MUTANTS if m.name == "rewrites_float_plus_zero")
    results = grade(KATA, write_mutant_tree(tmp_path, KATA, plus_zero), seed=0, levels=(2,))
    message = next(r.message for r in results if r.check == "float_plus_zero")
    assert "other sign bit" in message
