"""Kata 01: what its failure messages must say, beyond the level a mutant is caught at."""
from graders.run.session import grade
from graders.katas.kata_01_linear_relu.mutants import DROPS_THE_BIAS, MUTANTS
from graders.dev.mutation import write_mutant_tree

KATA = "01_linear_relu"


def message(tmp_path, mutant_name: str, check: str, level: int) -> str:
    mutant = next(m for m in MUTANTS if m.name == mutant_name)
    results = grade(KATA, write_mutant_tree(tmp_path, KATA, mutant), seed=0, levels=(level,))
    return next(r.message for r in results if r.check == check)


def test_failure_names_the_missing_bias(tmp_path):
    assert "the bias is missing" in message(tmp_path, DROPS_THE_BIAS.name, "fused_module", 1)


def test_failure_names_the_module_that_changed_type_under_the_caller(tmp_path):
    text = message(tmp_path, "converts_the_callers_linear", "traced_model_keeps_its_modules", 2)
    assert "`encoder.blocks.0.fc`" in text and "is a FusedLinearReLU" in text and "it was a Linear" in text


def test_an_untraceable_fused_module_loses_the_same_points_in_process_and_isolated(tmp_path):
    """A forward that branches on the input's rank runs in a learner's process, and cannot be traced by a
    competition's worker: both runs must give it the same verdict per check (README, "Your task")."""
    mutant = next(m for m in MUTANTS if m.name == "branches_on_input_rank")
    tree = write_mutant_tree(tmp_path, KATA, mutant)
    verdicts = [{r.test_id: r.passed for r in grade(KATA, tree, seed=0, levels=(1, 2, 4), isolate=isolate)}
                for isolate in (False, True)]
    assert verdicts[0] == verdicts[1]
    assert not verdicts[0]["test_L1_pattern[single_pair]"] and verdicts[0]["test_L2_exact[relu6_not_fused]"]


def test_the_reference_keeps_its_points_when_every_output_of_the_first_input_is_below_zero():
    """Seed 988830528 draws a first input whose six outputs are all below zero, with and without the bias:
    relu(x @ W.T) and relu(x @ W.T + b) are both zeros there. The reference once lost fused_module to the
    "bias is missing" sentence on it (an arena test's random seed found it); a slip is named only where its
    output differs from the right one."""
    from graders.frame.catalogue import REPO_ROOT

    results = grade(KATA, REPO_ROOT / "reference", seed=988830528, levels=(1,))
    fused = next(r for r in results if r.check == "fused_module")
    assert fused.passed, fused.message
