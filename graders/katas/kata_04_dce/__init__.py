"""Grader for kata 04: dead-code elimination that keeps every side effect. Models and the comparison of
everything a model can change: models.py; mutants: mutants.py."""
from __future__ import annotations

import torch.fx as fx

from graders.run import Kata, Pass, Run, graph_table

from .models import BENCHMARK, EXACT_CASES, PATTERN_CASES, hidden_case

KATA = Kata("04_dce")


def node_names(gm: fx.GraphModule, op: str | None = None) -> list[str]:
    return [n.name for n in gm.graph.nodes if op is None or n.op == op]


def a_count(run: Run, returned: int, which: str) -> int:
    if isinstance(returned, bool):  # ctx.call accepts a bool as an int
        run.fail(f"eliminate_dead_code returned {returned} ({which}), a bool like Graph.eliminate_dead_code's "
                 "'changed'; the kata asks for the number of nodes removed.", hint="", graphs=False)
    return returned


def removed_dead_code(run: Run) -> dict:
    """The count returned is the count removed, the placeholders stay, and exactly the dead nodes go, all
    of them in the first call. (The side effects are compared afterwards: models.same_effects.)"""
    returned = a_count(run, run.result, "on the first call")
    before, after = node_names(run.before), node_names(run.gm)
    removed = [name for name in before if name not in after]
    if returned != len(before) - len(after):
        run.fail(f"eliminate_dead_code returned {returned}, but the graph went from {len(before)} to {len(after)} "
                 f"nodes: it removed {len(before) - len(after)}. Count each erase_node.", hint="")
    if node_names(run.gm, "placeholder") != node_names(run.before, "placeholder"):
        run.fail(f"the placeholders were {node_names(run.before, 'placeholder')}, after eliminate_dead_code they are "
                 f"{node_names(run.gm, 'placeholder')}: an unused input is still part of forward's signature, and "
                 "callers pass it. Never erase a placeholder.", hint="")
    if len(before) - len(after) not in run.case.expect:
        run.fail(f"eliminate_dead_code removed {len(before) - len(after)} node(s) ({', '.join(removed) or 'none'}); "
                 f"this model has {' or '.join(map(str, run.case.expect))} node(s) that are dead and free of side "
                 "effects.")
    table = graph_table(run.gm)
    again = a_count(run, run.call_again(), "on the second call")
    if again != 0 or graph_table(run.gm) != table:
        gone = [name for name in after if name not in node_names(run.gm)]
        run.fail(f"a second call of eliminate_dead_code on its own result returned {again} and removed {len(gone)} "
                 f"more node(s) ({', '.join(gone) or 'none'}): the first call must remove every dead node, whole "
                 "dead chains included.", hint="walk the graph so that a node's users are visited before the node.",
                 graphs=False)
    return {"nodes_before": len(before), "nodes_removed": len(before) - len(after)}


DCE = Pass("eliminate_dead_code", returns=int, verdict=removed_dead_code)

KATA.cases(1, PATTERN_CASES, DCE)
KATA.cases(2, EXACT_CASES, DCE)
KATA.speed("stale_aux_head_speedup", BENCHMARK, DCE, what=DCE.label,
           hint="the auxiliary head (three Linears, two GELUs, a softmax) is never returned: all of it is dead.",
           verdict=True)
KATA.hidden(hidden_case, DCE)
