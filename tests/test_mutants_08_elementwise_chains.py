"""Kata 08: plausible wrong solutions, each caught at the level that should catch it."""
import pytest
import torch.fx as fx
from graders.mutation import Mutant, assert_caught_at_its_level, assert_no_op_is_timed_too_slow

from graders.kata_08_elementwise_chains import BASIC, EXACT_CASES, expected_chains

KATA = "08_elementwise_chains"
NO_OP = Mutant("no_op", "    modules = dict(gm.named_modules())\n    chains = find_elementwise_chains(gm)",
               "    return 0\n    modules = dict(gm.named_modules())\n    chains = find_elementwise_chains(gm)",
               caught_at=1)
ONE_USER = "if source in elementwise and len(source.users) == 1:"

MUTANTS = [
    NO_OP,
    Mutant("returns_nodes_fused_not_chains", "    return len(chains)", "    return sum(len(c) for c in chains)",
           caught_at=1),
    Mutant("forgets_recompile", "    gm.recompile()\n    return len(chains)", "    return len(chains)", caught_at=1),
    Mutant("misses_method_spellings", "return METHOD_KINDS.get(node.target)", "return None", caught_at=2),
    Mutant("misses_module_spellings", 'MODULE_KINDS = {nn.ReLU: "relu", nn.Sigmoid: "sigmoid", nn.Tanh: "tanh"}',
           "MODULE_KINDS = {}", caught_at=2),
    Mutant("crosses_multi_user_node", ONE_USER, "if source in elementwise and len(source.users) >= 1:", caught_at=2),
    Mutant("graph_output_as_interior", ONE_USER,
           "if source in elementwise and len([u for u in source.users if u.op != 'output']) == 1:", caught_at=2),
    Mutant("treats_inplace_methods_as_elementwise", "return METHOD_KINDS.get(node.target)",
           "return METHOD_KINDS.get(node.target.rstrip('_'))", caught_at=2),
    Mutant("ignores_inplace_kwarg", 'if "out" in node.kwargs or node.kwargs.get("inplace", False):',
           'if "out" in node.kwargs:', caught_at=2),
    Mutant("treats_dropout_as_elementwise", '    torch.tanh: "tanh",\n', '    torch.tanh: "tanh", F.dropout: "neg",\n',
           caught_at=2),
    Mutant("keeps_single_node_chains", "if node in successor and node not in has_predecessor:",
           "if node in elementwise and node not in has_predecessor:", caught_at=2),
    Mutant("picks_last_eligible_input", "for source in node.all_input_nodes:",
           "for source in reversed(node.all_input_nodes):", caught_at=2),
    Mutant("orders_chains_by_name", "    return chains\n", "    return sorted(chains, key=lambda c: c[0].name)\n",
           caught_at=2),
    Mutant("inserts_fused_node_at_head", "with gm.graph.inserting_before(tail):",
           "with gm.graph.inserting_before(chain[0]):", caught_at=2),
    Mutant("puts_chain_value_first", "BINARY_FUNCTIONS[step.kind](*args, **kwargs, out=value)",
           "BINARY_FUNCTIONS[step.kind](value, *[a for a in args if a is not value], **kwargs, out=value)",
           caught_at=2),
    Mutant("ignores_broadcast_growth", "                return False  # the result is larger",
           "                pass  # the result is larger", caught_at=2),
    Mutant("ignores_dtype_promotion", "    return dtype == value.dtype", "    return True", caught_at=2),
    Mutant("modules_by_attribute_name", "        module = modules.get(node.target)\n",
           "        return {'relu': 'relu', 'sigmoid': 'sigmoid', 'tanh': 'tanh'}.get(node.target.split('.')[-1])\n"
           "        module = modules.get(node.target)\n", caught_at=4),
    # The fused node is one node, numerically right, but still runs the ops one by one: only L3 sees it.
    Mutant("fused_node_calls_ops_one_by_one", "    grad = torch.is_grad_enabled()\n",
           "    return False\n    grad = torch.is_grad_enabled()\n", caught_at=3),
]


@pytest.mark.parametrize("mutant", MUTANTS, ids=str)
def test_mutant_is_caught_at_its_level(mutant, tmp_path):
    assert_caught_at_its_level(tmp_path, KATA, mutant)


def test_no_op_fails_the_speed_level(tmp_path):
    assert_no_op_is_timed_too_slow(tmp_path, KATA, NO_OP)


@pytest.mark.parametrize("case", ["basic", *EXACT_CASES])
def test_grader_finder_agrees_with_hand_written_chains(case):
    """The hidden level trusts the grader's own finder: it must agree with every chain written out by hand."""
    spec = BASIC if case == "basic" else EXACT_CASES[case]
    assert expected_chains(fx.symbolic_trace(spec.build())) == spec.chains
