"""Grader for kata 07, algebraic simplification (models.py, mutants.py). Every case: the outputs bit for bit first
(a flipped sign bit says more than an op count), then no dead node, the ops the rule table leaves, the count."""
from __future__ import annotations

from collections import Counter
from itertools import combinations

import torch.fx as fx

from graders.run import Kata, Pass, Run

from .models import BENCHMARK, L1_CASES, L2_CASES, hidden_case

KATA = Kata("07_algebraic_simplify")
ALIASES = {"truediv": "div", "true_divide": "div", "relu_": "relu", "leakyrelu": "leaky_relu",
           # a dtype conversion, however spelled (x.to(torch.float32), x.float(), x.type(...), Inductor's prim)
           **dict.fromkeys(["type", "float", "double", "half", "long", "int", "convert_element_type"], "to")}


def op_name(node: fx.Node, modules: dict) -> str:
    """One name per operation, whatever its spelling: operator.mul, torch.mul and x.mul are all "mul"."""
    if node.op == "call_module":
        name = type(modules[node.target]).__name__.lower()
    else:
        name = "get_attr" if node.op == "get_attr" else getattr(node.target, "__name__", str(node.target))
    return ALIASES.get(name, name)


def computed_ops(gm: fx.GraphModule) -> Counter:
    modules = dict(gm.named_modules())
    return Counter(op_name(n, modules) for n in gm.graph.nodes if n.op not in ("placeholder", "output"))


def show(ops: Counter) -> str:
    return "[" + ", ".join(sorted(ops.elements())) + "]" if ops else "[] (nothing)"


def simplified(run: Run) -> dict:
    allowed, kept = run.case.expect
    unread_before = {n.name for n in run.before.graph.nodes if not n.users}  # y.add_(1) is unread, and stays
    dead = [n.name for n in run.gm.graph.nodes if n.op != "placeholder" and not n.users and n.name not in unread_before]
    if dead:
        run.fail(f"after simplify the graph still holds nodes nobody reads: {', '.join(dead)}. A rewrite can leave "
                 "its constant (torch.ones_like(x)) or the inner permute of a pair without users: erase those too.",
                 hint="")
    got, expected = computed_ops(run.gm), computed_ops(run.before) if kept is None else Counter(kept)
    # Optional rewrites (a dtype conversion for int * 1.0): any subset of them is right, each counted once.
    optional = [(Counter(ALIASES.get(n, n) for n in removed.elements()), added)
                for removed, added in run.case.extra.get("optional", ())]
    outcomes = [(allowed + len(chosen), expected - sum((r for r, _ in chosen), Counter())
                 + sum((a for _, a in chosen), Counter()))
                for size in range(len(optional) + 1) for chosen in combinations(optional, size)]
    # Other right answers in whole (a hidden model whose last identity a pass may keep: models.hidden_case).
    outcomes += [(count, Counter(ops)) for count, ops in run.case.extra.get("alternatives", ())]
    allowed, expected = next(((count, ops) for count, ops in outcomes if ops == got), (allowed, expected))
    if got != expected:
        run.fail(f"after simplify the graph computes {show(got)}; expected {show(expected)} "
                 f"(missing {show(expected - got)}, unexpected {show(got - expected)}).")
    if isinstance(run.result, bool) or run.result != allowed:
        run.fail(f"simplify returned {run.result!r}, but the rule table allows exactly {allowed} rewrite(s) here: "
                 "count one per rewrite (x**2 -> x*x is one, relu(relu(relu(x))) two).", hint="", graphs=False)
    return {"rewrites": run.result, "nodes_before": len(run.before.graph.nodes), "nodes_after": len(run.gm.graph.nodes)}


def described(run: Run) -> str:
    dtypes = ", ".join(str(t.dtype).removeprefix("torch.") for t in run.extra_args[0])
    return f"the module after simplify (inputs {dtypes}; floats hold -0.0, inf, NaN)"


# simplify takes example inputs (the shapes and dtypes it may specialise to); a flipped sign bit says more
# than an op count, so outputs are compared first.
SIMPLIFY = Pass("simplify", int, simplified, described, example_inputs=True, compare_first=True)
KATA.cases(1, L1_CASES, SIMPLIFY)
KATA.cases(2, L2_CASES, SIMPLIFY)
KATA.hidden(hidden_case, SIMPLIFY)
KATA.speed("switched_off_features_speedup", BENCHMARK, SIMPLIFY, what="the simplified config-driven model",
           hint="each block computes one real relu; x * 1.0, / 1, - 0.0, the second relu and the transpose pair are "
                "all removable.")
