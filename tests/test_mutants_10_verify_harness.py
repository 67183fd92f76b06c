"""Kata 10: plausible wrong verifiers, each caught at its level by the pass built to expose it.

In this kata the learner writes the verifier, so a mutant is a verifier with one blind spot. Each is
checked twice: it is caught first at its level, and the check that catches it is the battery pass
designed for that blind spot (so each pass's claimed subtlety is itself tested).
"""
import pytest
from graders.mutation import Mutant, assert_caught_at_its_level, failed_levels, write_mutant_tree

from graders.core import grade
from graders.katas import REPO_ROOT

KATA = "10_verify_harness"

# (mutant, the check that must be among those failing it; None: any check of its level)
MUTANTS = [
    (Mutant("one_sample_only", "    samples = draw_samples(example_inputs, n_samples)\n",
            "    samples = draw_samples(example_inputs, 1)\n", caught_at=2), "caches_first_result"),
    (Mutant("same_batch_size_always", "batch = sizes[index % len(sizes)]", "batch = example_batch", caught_at=2),
     "wrong_only_at_batch_size_1"),
    (Mutant("draws_nonnegative_inputs", "torch.randn(batch, *t.shape[1:]", "torch.rand(batch, *t.shape[1:]",
            caught_at=2), "wrong_only_on_negative_inputs"),
    (Mutant("allclose_broadcasts_shapes",
            "            torch.testing.assert_close(got, want, atol=atol, rtol=rtol)\n    return True\n\n\ndef gradients(",
            "            if not all(torch.allclose(g, w, atol=atol, rtol=rtol) for g, w in zip(got, want)):\n"
            "                return False\n    return True\n\n\ndef gradients(", caught_at=2), "wrong_only_at_batch_size_1"),
    (Mutant("no_deep_copy_before_the_pass",
            "    original, baseline = copy.deepcopy(model), fx.symbolic_trace(copy.deepcopy(model))\n"
            "    transformed = pass_fn(fx.symbolic_trace(copy.deepcopy(model)))",
            "    original, baseline = model, fx.symbolic_trace(model)\n"
            "    transformed = pass_fn(fx.symbolic_trace(model))", caught_at=2), "mutates_shared_weights"),
    (Mutant("no_gradient_comparison",
            "passes(gradients_match, original, transformed, samples[:GRADIENT_SAMPLES], atol, rtol)", "True",
            caught_at=2), "straight_through_relu"),
    (Mutant("input_gradients_only", "    params = untouched_parameters(original, transformed)\n",
            "    params = []\n", caught_at=2), "detaches_weight"),
    (Mutant("lint_without_freshness", '    return gm.code == gm.graph.python_code(root_module="self").src',
            "    return True", caught_at=2), "forgets_recompile"),
    (Mutant("freshness_without_lint", "    gm.graph.lint()\n", "", caught_at=2), "breaks_node_order"),
    (Mutant("params_compares_names",
            '"params": parameter_count(transformed) <= parameter_count(original),',
            '"params": set(dict(transformed.named_parameters())) <= set(dict(original.named_parameters())),',
            caught_at=2), "pads_linear_adds_parameters"),
    (Mutant("params_requires_equal_count", "parameter_count(transformed) <= parameter_count(original)",
            "parameter_count(transformed) == parameter_count(original)", caught_at=1), "conv_bn_fold"),
    (Mutant("speedup_inverted", "ratios.append(base / cand)", "ratios.append(cand / base)", caught_at=3),
     "dead_code_speedup"),
    (Mutant("times_the_original_against_itself", "time_ratio(baseline, transformed, example_inputs)",
            "time_ratio(baseline, original, example_inputs)", caught_at=3), "dead_code_speedup"),
    (Mutant("draws_only_the_first_input", "for t in example_inputs))", "for t in example_inputs[:1]))",
            caught_at=4), None),
]


@pytest.mark.parametrize("mutant, catcher", MUTANTS, ids=[str(m) for m, _ in MUTANTS])
def test_mutant_is_caught_at_its_level(mutant, catcher, tmp_path):
    if catcher is None:
        assert_caught_at_its_level(tmp_path, KATA, mutant)
        return
    tree = write_mutant_tree(tmp_path, KATA, mutant)
    results = grade(KATA, tree, seed=0, levels=tuple(range(1, mutant.caught_at + 1)))
    reasons = "\n".join(f"  {r.test_id}: {r.message.splitlines()[0]}" for r in results if not r.passed)
    assert min(failed_levels(results), default=None) == mutant.caught_at, f"{mutant}:\n{reasons}"
    assert catcher in {r.check for r in results if not r.passed}, f"{mutant} slipped past {catcher}:\n{reasons}"


def test_a_constant_speedup_fails_the_speed_level(tmp_path):
    """The kata's no-op: a verifier that never times anything and reports 1.0."""
    no_timing = Mutant("speedup_always_one", 'report["speedup"] = time_ratio(baseline, transformed, example_inputs)',
                       'report["speedup"] = 1.0', caught_at=3)
    results = grade(KATA, write_mutant_tree(tmp_path, KATA, no_timing), seed=0, levels=(3,))
    assert {r.check: r.passed for r in results} == {"no_op_speedup": True, "dead_code_speedup": False}


@pytest.mark.parametrize("seed", [101, 202, 303])
def test_hidden_battery_truth_holds_for_the_reference_verifier(seed):
    """The L4 generator's claimed truth, checked by the reference verifier on more seeds."""
    results = grade(KATA, REPO_ROOT / "reference", seed=seed, levels=(4,))
    assert all(r.passed for r in results), [f"{r.test_id}: {r.message}" for r in results if not r.passed]
