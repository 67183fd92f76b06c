"""Grader for kata 09: hand-written tanh-GELUs replaced by one F.gelu op. Models: models.py; mutants: mutants.py."""
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from graders.run import Kata, Pass, Run

from .models import BENCHMARK, EXACT_CASES, L1_CASES, hidden_case

KATA = Kata("09_gelu")


def gelu_nodes(gm: fx.GraphModule) -> dict[str, str]:
    """The name of every GELU op of the graph, and its mode ('tanh' or 'none')."""
    modules, found = dict(gm.named_modules()), {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in (F.gelu, torch._C._nn.gelu):
            found[node.name] = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
        elif node.op == "call_module" and isinstance(modules.get(node.target), nn.GELU):
            found[node.name] = modules[node.target].approximate
    return found


def replaced(run: Run) -> dict:
    """In order: no node left unused, a new tanh-mode GELU op per replaceable tanh-GELU, the count returned."""
    unused_before = {n.name for n in run.before.graph.nodes if not n.users}
    dead = [n.name for n in run.gm.graph.nodes
            if not n.users and n.op not in ("placeholder", "output") and n.name not in unused_before]
    if dead:
        run.fail(f"after replace_tanh_gelu the graph keeps {len(dead)} node(s) nothing uses: {', '.join(dead)}.",
                 "erase the old subgraph's nodes, users first (or call gm.graph.eliminate_dead_code()).")
    before, expected = gelu_nodes(run.before), run.case.expect
    new = {name: mode for name, mode in gelu_nodes(run.gm).items() if name not in before}
    if len(new) != expected:
        run.fail(f"replace_tanh_gelu put {len(new)} GELU op(s) into the graph; this model has {expected} "
                 "hand-written tanh-GELU(s) that may be replaced.")
    exact = [name for name, mode in new.items() if mode != "tanh"]
    if exact:
        run.fail(f"the GELU node(s) {', '.join(exact)} use the exact (erf) GELU, which differs from the tanh formula "
                 "by up to 5e-4 near |x| = 2.7.", 'F.gelu(x, approximate="tanh").')
    if run.result != expected:
        run.fail(f"replace_tanh_gelu replaced {expected} tanh-GELU(s) but returned {run.result}.",
                 "return the number of subgraphs replaced.", graphs=False)
    return {"replaced": run.result, "nodes_before": len(run.before.graph.nodes), "nodes_after": len(run.gm.graph.nodes)}


REPLACE = Pass("replace_tanh_gelu", returns=int, verdict=replaced, what="the rewritten module")

KATA.cases(1, L1_CASES, REPLACE)
KATA.cases(2, EXACT_CASES, REPLACE)
KATA.speed("gelu_2048x4096_speedup", BENCHMARK, REPLACE, what="the rewritten GELU",
           hint="one F.gelu reads x once and writes once; the hand-written form makes eight passes over memory.")
KATA.hidden(hidden_case, REPLACE)
