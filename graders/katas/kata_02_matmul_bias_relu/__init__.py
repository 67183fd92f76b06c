"""Grader for kata 02: matmul + bias + ReLU with subgraph_rewriter. Models: models.py; mutants: mutants.py.
The pass rewrites the GraphModule it is given and returns a count: the harness grades the caller's gm."""

import operator

import torch
import torch.fx as fx
import torch.nn.functional as F

from graders.run import CheckFailed, Context, Kata, Pass, Run

from .models import BENCHMARK, EXACT_CASES, TWO_LAYER_MLP, hidden_case, random_bias, random_weight

KATA = Kata("02_matmul_bias_relu")

MATMUL_TARGETS = {operator.matmul, torch.matmul, torch.mm, torch.bmm, "matmul", "mm", "bmm"}
OUT_OF_PLACE_ADDS = {operator.add, torch.add, "add"}
RELU_TARGETS = {F.relu, torch.relu, torch.relu_, "relu", "relu_"}


def unfused_sites(gm: fx.GraphModule) -> list[fx.Node]:
    """ReLU nodes that read a new tensor made by adding something to a matmul product: the unfused form."""
    call = lambda n: isinstance(n, fx.Node) and n.op in ("call_function", "call_method") and n.target  # noqa: E731
    return [n for n in gm.graph.nodes if call(n) in RELU_TARGETS and n.args and call(n.args[0]) in OUT_OF_PLACE_ADDS
            and any(call(a) in MATMUL_TARGETS for a in n.args[0].args)]


CHANGED_BESIDES_THE_SITES = (
    "no matmul + bias + ReLU site was fused here, yet the graph changed: a rewrite besides the whole site's touched "
    "it (a ReLU run in place on its own, say). Run the ReLU in the sum's buffer only inside the fused form, whose "
    "match guarantees nobody else reads the sum; a correct pass leaves this model exactly as it is.")
PRODUCT_AS_PLACEHOLDER = (
    "a pattern whose product is a placeholder matches any add, p + b and b + p alike, binding p to whichever operand "
    "comes first (the bias, in b + x @ w), and the matcher no longer checks who else reads p. Keep the matmul inside "
    "the pattern.")


def stray_adds(gm: fx.GraphModule) -> list[fx.Node]:
    """In-place adds (add_) that write into something other than a matmul product."""
    return [n for n in gm.graph.nodes if n.op == "call_method" and n.target == "add_" and not (
        isinstance(n.args[0], fx.Node) and n.args[0].op in ("call_function", "call_method")
        and n.args[0].target in MATMUL_TARGETS)]


def rewritten(run: Run) -> dict:
    """As many sites gone from the caller's gm as the case expects (a blocked model untouched), and the
    returned count equal to the sites that really disappeared."""
    sites_before, left = len(unfused_sites(run.before)), unfused_sites(run.gm)
    signature = lambda gm: [(n.op, str(n.target), str(n.args), str(n.kwargs)) for n in gm.graph.nodes]  # noqa: E731
    if run.case.expect == 0 and signature(run.gm) != signature(run.before):
        untouched = sites_before and len(left) == sites_before  # no site fused: the change is another rewrite's
        run.fail("fuse_matmul_bias_relu changed a graph it must leave alone.",
                 CHANGED_BESIDES_THE_SITES if untouched else None)
    own, stray = stray_adds(run.before), stray_adds(run.gm)
    if len(stray) > len(own):  # more than the model had of its own
        node = next((n for n in stray if n.name not in {m.name for m in own}), stray[0])
        run.fail(f"after fuse_matmul_bias_relu, the in-place add {node.name} writes into {node.args[0]}, which is not "
                 "a matmul product.", PRODUCT_AS_PLACEHOLDER)
    if run.case.expect is not None and len(left) != sites_before - run.case.expect:
        run.fail(f"after fuse_matmul_bias_relu, the graph it was given still has {len(left)} unfused "
                 f"matmul + bias + ReLU site(s) (ReLU nodes: {', '.join(n.name for n in left) or 'none'}); "
                 f"expected {sites_before - run.case.expect} of the {sites_before}. The fused form adds the bias "
                 "into the product's buffer (add_, or inside the matmul), never into a new tensor. Rewrite the "
                 "GraphModule you were given, in place: the grader reads the caller's gm.")
    done = sites_before - len(left)
    if run.result != done:
        run.fail(f"fuse_matmul_bias_relu returned {run.result}, but it rewrote {done} site(s) of this model.",
                 "return the total number of sites rewritten, summed over all patterns (replace_pattern "
                 "returns one Match per site).", graphs=False)
    return {"sites_rewritten": done}


FUSE = Pass("fuse_matmul_bias_relu", returns=int, verdict=rewritten, what="the rewritten module")


@KATA.check(level=1)
def replacement_matches_pattern(ctx: Context):
    x, w, b = (t.to(ctx.device) for t in (torch.randn(5, 12), random_weight(12, 7), random_bias(7)))
    shapes = f"x {tuple(x.shape)}, w {tuple(w.shape)}, b {tuple(b.shape)}"
    want = ctx.call("pattern", x.clone(), w.clone(), b.clone(), returns=torch.Tensor)
    got = ctx.call("replacement", x.clone(), w.clone(), b.clone(), returns=torch.Tensor)
    for result, expected, what in (
            (want, F.relu(x @ w + b), f"pattern(x, w, b) does not compute relu(x @ w + b) on {shapes}"),
            (got, want, f"replacement(x, w, b) does not compute what pattern(x, w, b) does on {shapes}. Hint: "
                        "keep every term: the product, the bias and the ReLU. Details")):
        try:
            torch.testing.assert_close(result, expected)
        except AssertionError as exc:
            raise CheckFailed(f"{what}: " + " ".join(line.strip() for line in str(exc).splitlines() if line.strip())) \
                from None


KATA.cases(1, {"two_layer_mlp": TWO_LAYER_MLP}, FUSE)
KATA.cases(2, EXACT_CASES, FUSE)
KATA.speed("wide_head_speedup", BENCHMARK, FUSE, what="the fused wide head",
           hint="the product is a fresh tensor nobody else reads: do the bias add and the ReLU in its buffer "
                "(add_, relu_) instead of allocating two more tensors.")
KATA.hidden(hidden_case, FUSE)
