"""Failure sentences that diagnose a learner's slip, beyond "this check failed"."""
from graders.run.session import grade
from graders.katas.kata_03_conv_bn.mutants import EPS_DROPPED
from graders.dev.mutation import write_mutant_tree


def test_conv_bn_failure_names_the_missing_term(tmp_path):
    results = grade("03_conv_bn", write_mutant_tree(tmp_path, "03_conv_bn", EPS_DROPPED), seed=0, levels=(1,))
    message = next(r.message for r in results if r.check == "fold_weights")
    assert "matches the formula with the eps term left out" in message


def test_a_finder_s_failure_carries_a_finder_s_hint(tmp_path):
    """Kata 08's cases are graded twice, by find_ and fuse_ checks. A finder that skips module calls failed
    find_module_called_twice with a hint about fusing ("keep it installed"); it gets one about finding."""
    from graders.frame.mutant import Mutant

    skips_modules = Mutant("skips_modules", 'if node.op == "call_module":', 'if False:', caught_at=2)
    results = grade("08_elementwise_chains", write_mutant_tree(tmp_path, "08_elementwise_chains", skips_modules),
                    seed=0, levels=(2,))
    message = next(r.message for r in results if r.check == "find_module_called_twice")
    assert "module calls (call_module)" in message and "keep it installed" not in message
    fused = next(r.message for r in results if r.check == "fuse_module_called_twice")
    assert "keep it installed" in fused or "module calls" not in fused
