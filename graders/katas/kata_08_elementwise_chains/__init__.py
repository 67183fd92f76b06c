"""Grader for kata 08: find chains of elementwise ops, then fuse each chain into one node. Models: models.py;
mutants: mutants.py. Each model is graded twice: `find_<model>` compares the chains the finder returns with
the expected ones (nothing is run), `fuse_<model>` grades the fusion of those chains."""
from __future__ import annotations

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
                          f"chains in graph order). Hint: {run.case.extra.get('find_hint', run.case.hint)}\n\nThe graph:\n{graph_table(run.before)}")
    return {"chains": len(want)}


def fused(run: Run) -> dict:
    """The graph first (each expected chain became one node, nothing else changed), then the count returned: a
    pass that fused other chains than the README's is told so, with the case's hint, not that its count is off."""
    chains = run.case.expect
    members = sum(map(len, chains))
    left, nodes = elementwise_count(run.gm), len(run.gm.graph.nodes)
    want_left, want_nodes = elementwise_count(run.before) - members, len(run.before.graph.nodes) - members + len(chains)
    if (left, nodes) != (want_left, want_nodes):
        run.fail(f"after fuse_elementwise_chains on {where(run)}, the graph has {left} elementwise node(s) and {nodes} "
                 f"node(s) in all; expected {want_left} and {want_nodes}: each of the chains {chains} becomes exactly "
                 "one node, and nothing else changes.")
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


def hidden(ctx: Context, case: Case) -> dict:
    """Both passes on one generated model: the chains the grader's own finder finds, then their fusion."""
    return {**harness.check(ctx, replace(case, compare=None), FIND), **harness.check(ctx, case, FUSE)}


for level, cases in ((1, {"basic": BASIC}), (2, EXACT_CASES)):
    KATA.cases(level, {f"find_{name}": replace(case, compare=None) for name, case in cases.items()}, FIND)
    KATA.cases(level, {f"fuse_{name}": case for name, case in cases.items()}, FUSE)
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
