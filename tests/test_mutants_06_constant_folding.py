"""Kata 06: plausible wrong solutions, each caught at the level that should catch it."""
import pytest
from graders.mutation import Mutant, assert_caught_at_its_level, assert_no_op_is_timed_too_slow

KATA = "06_constant_folding"
ERASE_LOOP = """    folded = 0
    for node in reversed(graph.nodes):
        if node in values and node not in kept:
            folded += _is_call(node)
            graph.erase_node(node)
"""
NO_OP = Mutant("no_op", "    graph = gm.graph\n    values = _constant_values(gm)",
               "    return 0\n    graph = gm.graph\n    values = _constant_values(gm)", caught_at=1)

MUTANTS = [
    NO_OP,
    Mutant("forgets_recompile", "    graph.lint()\n    gm.recompile()\n", "    graph.lint()\n", caught_at=1),
    Mutant("leaves_dead_nodes_behind", "            folded += _is_call(node)\n            graph.erase_node(node)\n",
           "            folded += _is_call(node)\n", caught_at=1),
    Mutant("counts_stored_values_not_removed_nodes", "    return folded\n", "    return len(to_store)\n", caught_at=1),
    Mutant("folds_when_any_input_is_constant", "if all(n in values for n in node.all_input_nodes):",
           "if any(n in values for n in node.all_input_nodes) or not node.all_input_nodes:", caught_at=1),
    Mutant("folds_random_draws", " and not _draws_random_numbers(node) and", " and", caught_at=2),
    Mutant("folds_mutated_buffers", "            if node in mutated:\n                continue\n"
           "            if node.op == \"get_attr\" and node.target not in mutated_targets:",
           "            if node.op == \"get_attr\":", caught_at=2),
    Mutant("misses_writes_through_views", "            if _is_call(node) and node.args:\n"
           "                stack.append(node.args[0])\n", "", caught_at=2),
    Mutant("marks_nodes_not_attributes", 'if node.op == "get_attr" and node.target not in mutated_targets:',
           'if node.op == "get_attr" and node not in mutated:', caught_at=2),
    Mutant("cleans_up_with_eliminate_dead_code", ERASE_LOOP,
           "    calls_before = sum(_is_call(n) for n in graph.nodes)\n    graph.eliminate_dead_code()\n"
           "    folded = calls_before - sum(_is_call(n) for n in graph.nodes)\n", caught_at=2),
    Mutant("no_size_cap", "if _nbytes(value) <= max(SIZE_CAP_BYTES, GROWTH_CAP * inputs_bytes):", "if True:",
           caught_at=2),
    Mutant("getattr_on_dotted_target", "values[node] = _fetch_attr(gm, node.target)",
           "values[node] = getattr(gm, node.target)", caught_at=2),
    Mutant("stores_every_constant_as_a_buffer", " and isinstance(values[node], torch.Tensor) and", " and",
           caught_at=2),
    Mutant("in_place_ops_listed_by_hand",
           'in_place = (name.endswith("_") and not name.endswith("__")) or node.target is operator.setitem',
           'in_place = name in ("add_", "mul_", "copy_", "fill_")', caught_at=4),
    Mutant("random_functions_listed_by_hand", "return node.target in RANDOM_FUNCTIONS",
           "return node.target in (torch.rand, torch.randn_like, F.dropout)", caught_at=4),
]


@pytest.mark.parametrize("mutant", MUTANTS, ids=str)
def test_mutant_is_caught_at_its_level(mutant, tmp_path):
    assert_caught_at_its_level(tmp_path, KATA, mutant)


def test_no_op_fails_the_speed_level(tmp_path):
    assert_no_op_is_timed_too_slow(tmp_path, KATA, NO_OP)
