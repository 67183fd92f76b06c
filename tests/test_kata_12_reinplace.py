"""Kata 12: what its messages must say, beyond the mutants being caught (graders/katas/kata_12_reinplace/mutants.py)."""
import pytest

from graders.dev.mutation import write_mutant_tree
from graders.frame.catalogue import load_grader
from graders.katas.kata_12_reinplace.mutants import MUTANTS
from graders.run.session import GradingSession, grade

pytestmark = pytest.mark.locks_per_check  # grades in process: tests/conftest.py

KATA = "12_reinplace"
L3 = next(check for check in load_grader(KATA).checks if check.name == "chain_fresh_bytes")

# torch.fx's own pass as a learner's solution: it never writes a graph input ("TODO: later, add the optimization for
# handling copy_() calls"), so the chain's `x.add_(h)` stays a fresh add that the copy_ epilogue writes back.
TORCH_FX_REINPLACE = '''
import torch.fx as fx
from torch.fx.passes.reinplace import reinplace as fx_reinplace


def reinplace(gm: fx.GraphModule) -> fx.GraphModule:
    return fx_reinplace(gm, *(node.meta["val"] for node in gm.graph.nodes if node.op == "placeholder"))
'''


def test_the_chain_s_hint_names_why_each_fresh_tensor_is_left(tmp_path):
    """L3 fails both passes on the same count, 2 MiB against 1.8 allowed, for different reasons: the hint must name
    the fresh node's own (an overload looked up by its own name; an input never written), not one fixed guess."""
    mutant = next(m for m in MUTANTS if m.name == "same_overload_name_only")
    result = GradingSession(write_mutant_tree(tmp_path / "mutant", KATA, mutant), seed=0).run(L3)
    assert not result.passed
    assert "pow_1 is aten.pow.Tensor_Scalar, whose in-place overloads have other names (pow_.Scalar" \
        in result.message, result.message
    assert "copy_" not in result.message.split("Hint:")[1], result.message

    (tmp_path / "fx" / KATA).mkdir(parents=True)
    (tmp_path / "fx" / KATA / "solution.py").write_text(TORCH_FX_REINPLACE)
    result = GradingSession(tmp_path / "fx", seed=0).run(L3)
    assert not result.passed
    assert "Hint: add_1 is the value the copy_ at the end writes back into the input arg0_1" in result.message, \
        result.message
    assert "overload" not in result.message, result.message


def test_a_missed_opportunity_asks_about_the_nodes_that_tell(tmp_path):
    """L1's basic program with torch.fx's own pass: the add that the copy_ epilogue writes back into x stays fresh.
    The missed opportunity's hint asks about that node (the case itself has no hint)."""
    (tmp_path / KATA).mkdir()
    (tmp_path / KATA / "solution.py").write_text(TORCH_FX_REINPLACE)
    [result] = grade(KATA, tmp_path, seed=0, levels=(1,))
    assert not result.passed and "missed opportunity" in result.message, result.message
    assert "Hint: add_1 is the value the copy_ at the end writes back into the input arg0_1: could it be computed in " \
        "arg0_1 itself (the README's rule 5)?" in result.message, result.message
