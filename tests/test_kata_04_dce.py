"""Kata 04: what the grader says about a pass built on torch.fx's own Graph.eliminate_dead_code."""
from graders.run.session import grade
from graders.katas.kata_04_dce.mutants import MUTANTS
from graders.dev.mutation import write_mutant_tree

KATA = "04_dce"


def test_torch_eliminate_dead_code_fails_where_it_should(tmp_path):
    """Graph.eliminate_dead_code keeps setitem and torch.rand*, and misses the rest."""
    mutant = next(m for m in MUTANTS if m.name == "calls_torch_eliminate_dead_code")
    results = grade(KATA, write_mutant_tree(tmp_path, KATA, mutant), seed=0, levels=(2,))
    failed = {r.check for r in results if not r.passed}
    assert {"inplace_method", "inplace_keyword", "out_keyword", "dropout_function", "inplace_module",
            "batchnorm_training", "mutation_through_view", "random_method"} <= failed
    # It removes every call_module: right for the modules that are pure in the state they are in.
    assert {"setitem", "random_function", "unused_input", "uses_inside_list", "dropout_module_eval",
            "batchnorm_without_running_stats"}.isdisjoint(failed)


def test_a_wrong_count_names_the_nodes_removed(tmp_path):
    mutant = next(m for m in MUTANTS if m.name == "removes_inplace_methods")
    results = grade(KATA, write_mutant_tree(tmp_path, KATA, mutant), seed=0, levels=(2,))
    message = next(r.message for r in results if r.check == "inplace_method")
    assert message.startswith("eliminate_dead_code removed 3 node(s) (add_, mul_, sum_1); this model has 1 node(s)")
