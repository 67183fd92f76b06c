"""Failure sentences that diagnose a learner's slip, beyond "this check failed"."""
from graders.run.session import grade
from graders.katas.kata_03_conv_bn.mutants import EPS_DROPPED
from graders.dev.mutation import write_mutant_tree


def test_conv_bn_failure_names_the_missing_term(tmp_path):
    results = grade("03_conv_bn", write_mutant_tree(tmp_path, "03_conv_bn", EPS_DROPPED), seed=0, levels=(1,))
    message = next(r.message for r in results if r.check == "fold_weights")
    assert "matches the formula with the eps term left out" in message
