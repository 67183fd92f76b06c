"""Grader for kata 05: common-subexpression elimination. Models: models.py; mutants: mutants.py."""
from graders.run import Kata, Pass, Run

from .models import BENCHMARK, DUPLICATE_CHAINS, EXACT_CASES, NOTHING_TO_MERGE, hidden_case

KATA = Kata("05_cse")


def merged_as_expected(run: Run) -> dict:
    """The count returned is the count of nodes removed, and that is what a correct pass removes."""
    where, nodes_before = f"on the model `{run.ctx.check.name}`, {run.via.function}", len(run.before.graph.nodes)
    removed = nodes_before - len(run.gm.graph.nodes)
    if run.result != removed:
        run.fail(f"{where} returned {run.result} but removed {removed} node(s) from the graph: return the number "
                 "of nodes merged away (one per copy erased).", hint="")
    low, high = (run.case.expect,) * 2 if isinstance(run.case.expect, int) else run.case.expect
    if not low <= removed <= high:
        expected = low if low == high else f"between {low} and {high}"
        run.fail(f"{where} merged away {removed} node(s); expected {expected}.")
    return {"merged": run.result, "nodes_before": nodes_before}


CSE = Pass("eliminate_common_subexpressions", returns=int, verdict=merged_as_expected, what="the model after the pass")

KATA.cases(1, {"duplicate_chains_merge": DUPLICATE_CHAINS, "nothing_to_merge_left_alone": NOTHING_TO_MERGE}, CSE)
KATA.cases(2, EXACT_CASES, CSE)
KATA.speed("gated_unit_speedup", BENCHMARK, CSE, what="the gated unit after the pass",
           hint="self.proj(x) is computed three times on the same x: a Linear module is pure, so its calls "
                "merge into one.")
KATA.hidden(hidden_case, CSE)
