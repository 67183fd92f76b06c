"""A check's hint names the bug of the pass that fails it. A case is built for one bug and its hint names that one,
but a pass with another bug can fail the same check, and every failing check's message is shown: where the grader
can tell the causes apart (what it observed), the message must name the pass's own. Each row: a kata's mutant
(graders/katas/kata_NN_*/mutants.py), a check it fails, words its message must hold (one string, or several)."""
import pytest

from graders.dev.mutation import kata_mutants, write_mutant_tree
from graders.frame.catalogue import load_grader
from graders.run.session import GradingSession

pytestmark = pytest.mark.locks_per_check  # grades in process: tests/conftest.py

ROWS = [
    # Kata 01: a pass that fused some pairs and missed others reads the pairs it left, in their spellings, not the
    # case's hint about its own trap; a forward that writes into an out= tensor cannot be differentiated.
    ("01_linear_relu", "misses_functional_relu", "nested_dotted_names",
     "left these ReLUs reading a Linear: relu (call_function F.relu) after encoder.blocks.1.fc"),
    ("01_linear_relu", "leaves_inplace_relu_modules", "trains_like_the_original",
     "act2 (call_module act2: ReLU(inplace=True)) after fc2"),
    ("01_linear_relu", "output_in_the_default_dtype", "trains_like_the_original", "or write into an out= tensor"),
    # Kata 02: a ReLU run in place outside the fused form changes a model with nothing to fuse; a pattern whose product
    # is a placeholder binds the bias as the product in b + x @ w.
    ("02_matmul_bias_relu", "relu_in_place_wherever_it_stands", "bias_cast_in_forward",
     "Hint: no matmul + bias + ReLU site was fused here, yet the graph changed"),
    ("02_matmul_bias_relu", "matches_only_the_epilogue", "commuted_bias", "Keep the matmul inside the pattern"),
    # Kata 03: a folded conv installed by setattr under a dotted name; a BN left where every pair folds;
    ("03_conv_bn", "setattr_with_a_dotted_path", "stride_dilation_padding",
     "gm.set_submodule(conv_node.target, fused)"),
    ("03_conv_bn", "folds_only_the_first_pair", "float64_model", "pair in this model is safe to fold"),
    # ... and a conv left without a bias after its BN was folded in, in a case built for another trap.
    ("03_conv_bn", "bias_only_where_the_conv_had_one", "float64_model",
     "bn1 was folded into conv1, which has no bias after the pass"),
    # Kata 04: a pass that erases nothing reads what to erase, not only in which order.
    ("04_dce", "no_op", "dead_chain", "erase it (gm.graph.erase_node) and count it"),
    # Kata 06: torch.fx's eliminate_dead_code after folding deletes the writes whose results nobody reads; several
    # values stored under one name.
    ("06_constant_folding", "cleans_up_with_eliminate_dead_code", "constant_written_in_place",
     "a node that writes into a tensor in place"),
    ("06_constant_folding", "one_name_for_every_stored_value", "nested_attribute_names",
     "give each stored value a fresh name"),
    # Kata 08: a finder that misses the Tensor-method spellings, one that takes a join's last input, and the fusion
    # of chains a wrong finder found.
    ("08_elementwise_chains", "misses_method_spellings", "find_branch_and_join",
     "belong(s) to a chain but to none of yours"),
    ("08_elementwise_chains", "picks_last_eligible_input", "find_join_first_input_started_later",
     "comes first in its inputs"),
    ("08_elementwise_chains", "links_non_elementwise_inputs", "fuse_basic", "your find_elementwise_chains returns"),
    # A fused chain that computes into the tensor it was handed (the caller's input, read again by another node).
    ("08_elementwise_chains", "writes_into_its_input", "fuse_branch_and_join", "a tensor it was handed"),
    # Kata 09: a matcher of the cube as x ** 3 only, on a model whose cube is x * x * x.
    ("09_gelu", "cube_only_as_pow", "commuted_everywhere", "the cube here is x * x * x"),
    # Kata 10: a case is built for one blind spot; a verifier with another bug fails it on other keys, and the keys it
    # gets wrong tell which cause (kata.toml's `hint_when`). Drawn in float32 and cast, the inputs hide the output's
    # error, not the input gradient's; at fixed tolerances (1e-5) both are missed.
    ("10_verify_harness", "draws_in_float32_precision", "float64_input_rounded_through_float32",
     ("said numerical=True for", "Hint: draw fresh inputs in the example's dtype")),
    ("10_verify_harness", "fixed_tolerances", "float64_input_rounded_through_float32",
     ("said numerical=True and gradient=True for",
      "Hint: compare at the atol and rtol verify_pass was called with (1e-12 here)")),
    ("10_verify_harness", "fixed_gradient_tolerance", "float64_input_rounded_through_float32",
     ("said gradient=True for", "Hint: compare the gradients too, at the atol and rtol")),
    ("10_verify_harness", "no_gradient_comparison", "tighter_tolerance_float64",
     ("said gradient=True for", "Hint: compare the gradients too, at the atol and rtol")),
    # float32 draws make the float64 model raise in the effects comparison too.
    ("10_verify_harness", "draws_float32_inputs", "tighter_tolerance_float64",
     ("said effects=False for", "Hint: the pass changes no effect, so your effects comparison failed on its own")),
    ("10_verify_harness", "never_checks_effects", "breaks_node_order",
     ("said effects=True for", "Hint: a transformed model that raises has failed every comparison that runs it")),
    ("10_verify_harness", "cotangent_per_model", "conv_bn_fold",
     ("said gradient=False for", "both models under one cotangent")),
    ("10_verify_harness", "params_requires_equal_count", "conv_bn_fold",
     ("said params=False for", "Hint: the fold removes parameters")),
    # Kata 11: two pairs that share one name for their new parameters, against two pairs of which one never folds; a
    # BN left after a conv without bias, in a case built for the dynamic batch.
    ("11_export_conv_bn", "one_name_for_every_pair", "two_pairs", "input specs name the state dict entry"),
    ("11_export_conv_bn", "folds_only_the_first_pair", "two_pairs", "look for pairs in the whole graph"),
    ("11_export_conv_bn", "requires_a_conv_bias", "dynamic_batch", "a convolution without bias (args[2] is None)"),
    # Kata 12: an input the program never writes, written in place, fails every case with an input read later.
    ("12_reinplace", "writes_inputs_without_epilogue", "dtype_change", "Hint: the program never writes input 0"),
    ("12_reinplace", "ignores_shape", "symbolic_batch", "Hint: self must have the result's shape"),
    # Kata 13: the right number of blocks fused, into a wrong replacement; a pattern missing for the second block, in
    # a case built for another trap (the layout): the message names each softmax left and its block's form.
    ("13_sdpa_pattern", "mul_replacement_inverts_scale", "two_blocks",
     "a replacement must compute what its pattern does"),
    ("13_sdpa_pattern", "mask_dropped_in_replacement", "additive_mask", "attn_mask=mask where it adds a mask"),
    ("13_sdpa_pattern", "division_pattern_only", "two_blocks", "Hint: the first block divides, the second multiplies"),
    ("13_sdpa_pattern", "division_pattern_only", "heads_last_layout",
     ("Softmaxes left: amax (a softmax over dim -1), scores divided by 4.0, a mask added, query and key copied",
      "amax_1 (a softmax over dim -1), scores multiplied by 0.25")),
]


@pytest.mark.parametrize("kata, mutant, check, words", [pytest.param(*row, id=f"{row[0]}-{row[1]}-{row[2]}")
                                                        for row in ROWS])
def test_the_hint_names_the_failing_pass_s_own_bug(tmp_path, kata, mutant, check, words):
    [wrong] = [m for m in kata_mutants(kata).MUTANTS if m.name == mutant]
    [graded] = [c for c in load_grader(kata).checks if c.name == check]
    result = GradingSession(write_mutant_tree(tmp_path, kata, wrong), seed=0).run(graded)
    assert not result.passed, result.message
    for expected in (words,) if isinstance(words, str) else words:
        assert expected in result.message, result.message
