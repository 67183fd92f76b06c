"""Grader for kata 08: find chains of elementwise ops, then fuse each chain into one node. Models: models.py;
mutants: mutants.py. Each model is graded twice: `find_<model>` compares the chains the finder returns with
the expected ones (nothing is run), `fuse_<model>` grades the fusion of those chains."""
from __future__ import annotations

import copy
import operator
from dataclasses import replace

import torch
import torch.fx as fx
from torch.utils._pytree import tree_leaves

from graders.run import (
    Case,
    CheckFailed,
    Context,
    Kata,
    Pass,
    Run,
    assert_same_outputs,
    graph_table,
    harness,
    seeded,
)

from .models import BASIC, BENCHMARK, EXACT_CASES, UNDER_AUTOGRAD, elementwise_count, hidden_case
from .traffic import CACHE_BYTES, memory_traffic

KATA = Kata("08_elementwise_chains")


def where(run: Run) -> str:
    """How messages name the graded model: as its case says, else from the check's name (find_x, fuse_x, model_n)."""
    name = run.ctx.check.name
    return run.case.extra.get("where", f"hidden model {name[6:]}" if name.startswith("model_") else f"model {name[5:]}")


def found(run: Run) -> dict:
    chains, nodes = run.result, set(run.traced.graph.nodes)
    if not all(isinstance(c, (list, tuple)) and all(isinstance(n, fx.Node) and n in nodes for n in c) for c in chains):
        raise CheckFailed("find_elementwise_chains must return a list of chains, each a list of the graph's own "
                          f"torch.fx.Node objects; got {chains!r:.200}.")
    got, want = [[n.name for n in chain] for chain in chains], run.case.expect
    if got != want:
        raise CheckFailed(f"find_elementwise_chains on {where(run)} returned {got}; expected {want} (node names, "
                          f"chains in graph order). Hint: {find_hint(run, chains, want)}\n\nThe graph:\n"
                          f"{graph_table(run.before)}")
    return {"chains": len(want)}


def find_hint(run: Run, chains: list, want: list[list[str]]) -> str:
    """The hint for chains that differ from `want`: what the difference itself shows where it shows one (order, a
    lone node, a shared interior node, nodes left out, another input taken at a join), else the case's."""
    got, nodes = [[n.name for n in chain] for chain in chains], {n.name: n for n in run.traced.graph.nodes}
    found_names = {name for chain in got for name in chain}
    missing = [nodes[name] for chain in want for name in chain if name not in found_names]
    shared = [n for chain in chains for n in chain[:-1] if len(n.users) != 1]
    before = {b: a for chain in want for a, b in zip(chain, chain[1:])}
    taken = [(a, b) for chain in got for a, b in zip(chain, chain[1:]) if before.get(b, a) != a]
    if sorted(got) == sorted(want):
        return "these are the expected chains in another order: list them in graph order (each by its first node)."
    if any(len(chain) < 2 for chain in got):
        return "a chain holds at least two nodes: an elementwise node that links to no other is no chain."
    if shared:
        return (f"{shared[0].name} is inside a chain but has {len(shared[0].users)} users: an interior node must have "
                "exactly one user, the next node of the chain (the output node counts as a user).")
    if missing:  # then the case's own finder hint, where it has one (what its spellings are)
        return (f"{', '.join(n.name for n in missing)} belong(s) to a chain but to none of yours, spelled here "
                f"{', '.join(sorted({spelling(run.traced, n) for n in missing}))}: the README's table lists every "
                "spelling that counts (operator, torch function, Tensor method, nn module)."
                + (f" {run.case.extra['find_hint']}" if "find_hint" in run.case.extra else ""))
    if taken:
        a, b = taken[0]
        return (f"{b} continues {a}'s chain, but {before[b]} comes first in its inputs: where two inputs could "
                "continue a chain, the first one in node.all_input_nodes does.")
    return run.case.extra.get("find_hint", run.case.hint)


def spelling(gm: fx.GraphModule, node: fx.Node) -> str:
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    if node.op == "call_module":
        return f"nn.{type(gm.get_submodule(node.target)).__name__}"
    name = getattr(node.target, "__name__", str(node.target))
    return f"{'operator' if getattr(operator, name, None) is node.target else 'torch'}.{name}"


def fused(run: Run) -> dict:
    """The graph first (each expected chain became one node, nothing else changed), then the count returned: a
    pass that fused other chains than the README's is told so, with the case's hint, not that its count is off."""
    chains = run.case.expect
    members = sum(map(len, chains))
    left, nodes = elementwise_count(run.gm), len(run.gm.graph.nodes)
    want_left, want_nodes = elementwise_count(run.before) - members, len(run.before.graph.nodes) - members + len(chains)
    if (left, nodes) != (want_left, want_nodes):
        try:  # the learner's own chains, where they are not these: the finder's fault, not the fusion's
            theirs = [[n.name for n in c] for c in run.ctx.call("find_elementwise_chains", copy.deepcopy(run.before))]
        except Exception:
            theirs = chains
        run.fail(f"after fuse_elementwise_chains on {where(run)}, the graph has {left} elementwise node(s) and {nodes} "
                 f"node(s) in all; expected {want_left} and {want_nodes}: each of the chains {chains} becomes exactly "
                 "one node, and nothing else changes.",
                 None if theirs == chains else f"your find_elementwise_chains returns {theirs} here: fix the finder "
                 f"first (check find_{run.ctx.check.name.removeprefix('fuse_')} says how), then fuse what it returns.")
    if run.result != len(chains):
        run.fail(f"fuse_elementwise_chains on {where(run)} returned {run.result!r}; expected {len(chains)}: the "
                 f"graph shows the {len(chains)} chain(s) {chains} fused, one node each.",
                 hint="return the number of chains fused (one fused node each), not the number of nodes they held.")
    return {"chains": run.result}


FIND = Pass("find_elementwise_chains", returns=list, verdict=found)  # its cases have compare=None: nothing to run
FUSE = Pass("fuse_elementwise_chains", returns=int, verdict=fused, what="the fused model")


def contract_view(module, parameters: dict, grad: bool):
    """`module` as a function of private copies of the inputs, returning what the autograd contract
    (README, "Autograd") grades: the output, the inputs after the call and, with `grad`, the gradients of
    a fixed random projection of the output w.r.t. every floating-point input and every parameter."""

    def call(*inputs):
        xs = [t.detach().clone().requires_grad_(grad and t.is_floating_point()) for t in inputs]
        with torch.set_grad_enabled(grad):
            output = module(*xs)
            wrt = {**{f"input {i}": x for i, x in enumerate(xs) if x.requires_grad},
                   **{f"parameter {name}": p for name, p in parameters.items() if grad}}
            outs = [o for o in tree_leaves(output) if isinstance(o, torch.Tensor) and o.requires_grad]
            with seeded(0):
                projection = [torch.randn_like(o) for o in outs]
            grads = (torch.autograd.grad(outs, list(wrt.values()), projection, allow_unused=True) if outs
                     else [None] * len(wrt))
        return {"output": output, "inputs after the call": [x.detach() for x in xs], "gradients": dict(zip(wrt, grads))}

    return call


def under_autograd(run: Run) -> None:
    """Without grad the inputs stay unchanged; with grad, outputs and gradients match the original's too.
    The GraphModule shares its parameters with the traced model; the pristine copy has its own."""
    for grad, mode in ((False, "under torch.no_grad()"), (True, "with grad on (inputs and parameters require it)")):
        assert_same_outputs(contract_view(run.pristine, dict(run.pristine.named_parameters()), grad),
                            contract_view(run.gm, dict(run.model.named_parameters()), grad), run.input_sets(),
                            what=f"the fused model {mode}", hint=run.case.hint, graphs=(run.before, run.gm))


def input_written(run: Run) -> tuple[str, str] | None:
    """(node, input): the first node the pass added that wrote into a tensor it was handed, running the rewritten
    graph on copies of the first inputs (None: none did, or the graph raised)."""
    old = {node.name for node in run.before.graph.nodes}
    written = []

    class Watch(fx.Interpreter):
        def run_node(self, node):
            handed = {a.name: self.env[a] for a in tree_leaves((node.args, node.kwargs))
                      if isinstance(a, fx.Node) and isinstance(self.env.get(a), torch.Tensor)}
            kept = {name: value.clone() for name, value in handed.items()} if node.name not in old else {}
            result = super().run_node(node)
            for name, value in kept.items():
                try:
                    torch.testing.assert_close(handed[name], value, rtol=0, atol=0, equal_nan=True)
                except AssertionError:
                    written.append((node.name, name))
            return result

    inputs = tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in run.input_sets()[0])
    try:
        with torch.no_grad():
            Watch(run.gm).run(*inputs)
    except Exception:  # noqa: BLE001 - the comparison says how the graph fails
        return None
    return written[0] if written else None


def name_the_input_written(run: Run) -> None:
    """Where the outputs differ: a node the pass added that wrote into a tensor it was handed (a fused chain computing
    into its input), named."""
    if writer := input_written(run):
        node, tensor = writer
        run.fail(f"the fused model does not compute what the original does, and during the call the node {node}, "
                 f"which the pass added, wrote into {tensor}, a tensor it was handed.",
                 f"is {tensor} read again after {node}, by another node or by the caller (a graph input is the "
                 "caller's)? A fused chain computes into a tensor of its own, never into one it was handed.")


compare_fused = harness.explained(name_the_input_written)


def hidden(ctx: Context, case: Case) -> dict:
    """Both passes on one generated model: the chains the grader's own finder finds, then their fusion."""
    return {**harness.check(ctx, replace(case, compare=None), FIND),
            **harness.check(ctx, replace(case, compare=compare_fused), FUSE)}


for level, cases in ((1, {"basic": BASIC}), (2, EXACT_CASES)):
    KATA.cases(level, {f"find_{name}": replace(case, compare=None) for name, case in cases.items()}, FIND)
    KATA.cases(level, {f"fuse_{name}": replace(case, compare=compare_fused) for name, case in cases.items()}, FUSE)
KATA.cases(2, {"fuse_under_autograd": replace(UNDER_AUTOGRAD, compare=under_autograd)}, FUSE)
SPEED_HINT = ("fusing means one pass over memory: run the whole chain on one cache-sized slice of the tensor at a "
              "time, so that each step reads what the step before it wrote while it is still in the cache, and write "
              "each slice's result into one output (README, 'Why this pass exists'). Overwriting one big buffer in "
              "place saves allocations, not traffic: each op still reads and writes the whole tensor.")
WHAT = "the fused five-op chain on a 4096x4096 tensor"


@KATA.check(3)
def five_op_chain_speedup(ctx: Context) -> dict:
    """L3: the memory traffic of the fused benchmark, counted exactly (traffic.py), then its time. A count over
    the limit fails the check before anything is timed, as an over-limit byte count does in katas 01 and 02
    (harness.assert_speedup): the verdict is the count's, whatever a clock would say, and the learner reads it
    without waiting for 20 calls on a 64 MiB tensor (about 10 s on a 2-core CPU)."""
    run = harness.apply(ctx, BENCHMARK, FUSE)
    batch = BENCHMARK.batch_sizes[0]
    inputs = run.make_inputs(batch)
    before, after = memory_traffic(run.before, inputs), memory_traffic(run.gm, inputs)
    limit = ctx.kata.manifest["speed"]["max_traffic_fraction"]
    traffic = {"memory_traffic_before": before, "memory_traffic_after": after,
               "memory_traffic_ratio": round(before / max(after, 1), 3), "max_traffic_fraction": limit}
    if after > limit * before:
        raise CheckFailed(
            f"{WHAT} moves {after / 2**20:.0f} MiB between memory and a modelled {CACHE_BYTES // 2**20} MiB cache per "
            f"call, the traced original {before / 2**20:.0f} MiB; this level allows at most {limit:.0%} of the "
            f"original's ({limit * before / 2**20:.0f} MiB), counted exactly, not timed. Hint: {SPEED_HINT}",
            {"device": ctx.device.type, **traffic})
    if ctx.device.type not in ctx.kata.thresholds:  # CUDA: the count alone (kata.toml says why)
        return {"device": ctx.device.type, "timed": False, **traffic}
    figures = harness.assert_speedup(ctx, run.before, run.gm, lambda: run.make_inputs(batch), ctx.kata.thresholds,
                                     what=WHAT, hint=SPEED_HINT,
                                     ideal=traffic["memory_traffic_ratio"])  # the ceiling: traffic saved
    return {**figures, **traffic}


KATA.hidden(hidden_case, check=hidden)
