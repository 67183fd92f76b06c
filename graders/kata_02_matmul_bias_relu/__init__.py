"""Grader for kata 02: matmul + bias + ReLU, rewritten declaratively with torch.fx.subgraph_rewriter."""
from __future__ import annotations

import copy
import operator
import random
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from graders.core import CheckFailed, Context, Kata
from graders.models import PathChain, random_identifier
from graders.numerics import assert_same_outputs, input_sets
from graders.structure import assert_valid_graph_module, before_after
from graders.timing import assert_speedup

KATA = Kata("02_matmul_bias_relu", api={
    "pattern": "pattern(x, w, b) -> relu(x @ w + b), the site to match",
    "replacement": "replacement(x, w, b) -> the fused form of pattern(x, w, b)",
    "fuse_matmul_bias_relu": "fuse_matmul_bias_relu(gm: torch.fx.GraphModule) -> int (sites rewritten)",
})

# The L3 benchmark: a wide projection head, 16 features in, 4096 out, on 8 x 384 tokens. The product
# (48 MB) dwarfs the multiply (16 multiply-adds per output element), so the time goes to the bias add and
# the ReLU allocating and writing two more 48 MB tensors; the fused form writes into the product's buffer
# (README, "Where the fused form pays"). What fresh pages cost swings in a VM: reference medians on CPU
# single-threaded are 2.2x-2.5x, but one run read 1.31x, and a half in-place form (add_ then relu())
# usually 1.4x-1.6x once read over 1.85x in CI. So the level counts bytes written, exactly: the reference
# writes a third of what the original does, a half in-place form two thirds, a no-op all of it. The time
# threshold only has to prove a real gain, and sits under the reference's worst reading; a no-op reads
# 0.96x-1.13x. CUDA is unmeasured (no GPU here): its caching allocator makes allocations nearly free and
# in place moves the same bytes, so expect about 1.0x there; the CUDA figure only guards against a slowdown.
SPEEDUP_THRESHOLDS = {"cpu": 1.20, "cuda": 0.95}
MAX_BYTES_FRACTION = 0.5
BENCHMARK_SHAPE = (8, 384, 16, 4096)  # batch, tokens, features in, features out

# ----------------------------------------------------------------------------------------------
# Spellings. symbolic_trace records the function a model calls, so a block that calls
# MATMULS["torch.mm"] traces exactly like source code that says torch.mm(x, w).

MATMULS: dict[str, Callable] = {"@": operator.matmul, "torch.matmul": torch.matmul, "torch.mm": torch.mm}
BIAS_ADDS: dict[str, Callable] = {
    "p + b": lambda p, b: p + b,
    "b + p": lambda p, b: b + p,
    "torch.add(p, b)": lambda p, b: torch.add(p, b),
    "torch.add(b, p)": lambda p, b: torch.add(b, p),
}
RELUS: dict[str, Callable] = {
    "F.relu": F.relu,
    "F.relu(inplace=True)": lambda y: F.relu(y, inplace=True),
    "torch.relu": torch.relu,
    ".relu()": lambda y: y.relu(),
}

# Blocks a correct pass must leave alone, and why (the hint a learner reads).
BLOCKED_KINDS = {
    "product_reused": "the product x @ w has a second user (a sigmoid of it): adding the bias into its "
                      "buffer would change what that user reads. The matcher refuses a match whose inner "
                      "nodes leak out, but only if the matmul is inside the pattern.",
    "sum_reused": "the sum x @ w + b has a second user besides the ReLU: a ReLU in its buffer would change "
                  "what that user reads.",
    "relu6": "the activation is relu6, not ReLU: it clamps at 6.",
    "gelu": "the activation is GELU, not ReLU.",
    "add_alpha": "torch.add(p, b, alpha=0.5) scales the bias: the keyword is part of the node, and a "
                 "pattern without it does not match it.",
}


@dataclass
class Spelling:
    matmul: str = "@"
    bias_add: str = "p + b"
    relu: str = "F.relu"


class Block(nn.Module):
    """One site: relu(x @ w + b) in the given spelling, or a blocked variant of it."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | float, spelling: Spelling, kind: str = "fuse",
                 names: tuple[str, str] = ("weight", "bias")):
        super().__init__()
        self.kind, self.spelling, self.names = kind, spelling, names
        setattr(self, names[0], nn.Parameter(weight))
        if isinstance(bias, torch.Tensor):
            setattr(self, names[1], nn.Parameter(bias))
        else:
            self.literal_bias = bias  # a Python float: traced as a literal argument of the add

    def forward(self, x):
        w = getattr(self, self.names[0])
        b = getattr(self, self.names[1]) if hasattr(self, self.names[1]) else self.literal_bias
        matmul, bias_add, relu = (MATMULS[self.spelling.matmul], BIAS_ADDS[self.spelling.bias_add],
                                  RELUS[self.spelling.relu])
        product = matmul(x, w)
        if self.kind == "product_reused":
            return relu(bias_add(product, b)) * torch.sigmoid(product)
        if self.kind == "add_alpha":
            return relu(torch.add(product, b, alpha=0.5))
        total = bias_add(product, b)
        if self.kind == "sum_reused":
            return relu(total) - 0.5 * total
        if self.kind == "relu6":
            return F.relu6(total)
        if self.kind == "gelu":
            return F.gelu(total)
        return relu(total)


class ResidualBias(nn.Module):
    """relu(h @ w + h): the bias is the matmul's own input."""

    def __init__(self, width: int):
        super().__init__()
        self.weight = nn.Parameter(random_weight(width, width))

    def forward(self, h):
        return F.relu(h @ self.weight + h)


def random_weight(*shape: int) -> torch.Tensor:
    return torch.randn(*shape) / shape[-2] ** 0.5


def random_bias(width: int, kind: str = "fuse") -> torch.Tensor:
    # Large enough that dropping the bias shows, and that relu6 really clamps at 6 somewhere.
    return torch.empty(width).uniform_(3, 9) if kind == "relu6" else torch.randn(width) * 2


def block(fan_in: int, fan_out: int, spelling: Spelling | None = None, kind: str = "fuse",
          bias: torch.Tensor | float | None = None) -> Block:
    return Block(random_weight(fan_in, fan_out), random_bias(fan_out, kind) if bias is None else bias,
                 spelling or Spelling(), kind)


def net(*blocks: nn.Module) -> Net:
    return PathChain([(f"layer{i}", b) for i, b in enumerate(blocks)])


@dataclass
class Case:
    build: Callable[[], nn.Module]
    in_shape: tuple[int, ...]  # without the batch dimension
    rewrites: int | None       # sites a correct pass rewrites; None: either outcome is correct
    hint: str
    dtype: torch.dtype = torch.float32


def spelled(matmul="@", bias_add="p + b", relu="F.relu", **options) -> Callable[[], nn.Module]:
    spelling = Spelling(matmul, bias_add, relu)
    return lambda: net(block(12, 16, spelling, **options), block(16, 8, spelling, **options))


def spelling_hint(what: str) -> str:
    return (f"{what}. The matcher compares call targets by identity and arguments position by position: "
            "every spelling is a pattern of its own (print gm.graph to see the targets).")


class BatchedWeights(nn.Module):
    """A stack of weights, one per batch element: x @ w is a batched matrix multiply."""

    def __init__(self, batch: int):
        super().__init__()
        self.weight = nn.Parameter(random_weight(batch, 12, 8))
        self.bias = nn.Parameter(random_bias(8))

    def forward(self, x):
        return torch.relu(torch.matmul(x, self.weight) + self.bias)


LEAVE_ALONE = "a correct pass leaves this model exactly as it is"
EXACT_CASES: dict[str, Case] = {
    "torch_matmul_spelling": Case(spelled(matmul="torch.matmul"), (12,), 2,
                                  spelling_hint("torch.matmul(x, w) is not x @ w (operator.matmul)")),
    "mm_and_torch_add": Case(spelled(matmul="torch.mm", bias_add="torch.add(p, b)", relu="torch.relu"), (12,), 2,
                             spelling_hint("torch.add(torch.mm(x, w), b) shares no target with x @ w + b")),
    "commuted_bias": Case(spelled(bias_add="b + p"), (12,), 2,
                          spelling_hint("b + x @ w puts the product second: the matcher knows no commutativity")),
    "commuted_torch_add": Case(spelled(matmul="torch.matmul", bias_add="torch.add(b, p)", relu=".relu()"), (12,), 2,
                               spelling_hint("torch.add(b, torch.matmul(x, w)).relu() is commuted, and .relu() "
                                             "is a call_method node")),
    "torch_relu": Case(spelled(relu="torch.relu"), (12,), 2, spelling_hint("torch.relu is not F.relu")),
    "method_relu": Case(spelled(relu=".relu()"), (12,), 2,
                        spelling_hint("y.relu() is a call_method node with target 'relu'")),
    "inplace_relu": Case(spelled(relu="F.relu(inplace=True)"), (12,), 2,
                         spelling_hint("F.relu(y) traces with the keyword inplace=False, and a literal must "
                                       "match exactly: F.relu(y, inplace=True) needs its own pattern")),
    "batched_3d_input": Case(spelled(), (5, 12), 2,
                             "x is (batch, tokens, features): torch.addmm multiplies 2-D matrices only; "
                             "torch.matmul handles any batch dimensions."),
    "batched_weights": Case(lambda: BatchedWeights(3), (4, 12), 1,
                            "x @ w with a 3-D weight is a batched matmul: flattening x to 2-D for addmm "
                            "does not compute it."),
    "scalar_bias": Case(spelled(bias=0.5), (12,), 2,
                        "a pattern's placeholder matches a literal too: here b is the float 0.5."),
    "mixed_spellings": Case(lambda: net(block(12, 16, Spelling("@", "b + p", "torch.relu")),
                                        block(16, 16, Spelling("torch.matmul", "torch.add(p, b)", ".relu()")),
                                        block(16, 8, Spelling("torch.mm", "torch.add(b, p)", "F.relu(inplace=True)")),
                                        block(8, 8, Spelling("@", "p + b", "F.relu"))), (12,), 4,
                            "four sites in four spellings: every one is rewritten, and the count says 4."),
    "float64": Case(lambda: net(block(12, 16), block(16, 8, Spelling(bias_add="b + p"))).double(), (12,), 2,
                    "the fused form must keep the model's dtype.", torch.float64),
    **{f"blocked_{kind}": Case(lambda kind=kind: net(block(12, 16, kind=kind), block(16, 8, kind=kind)), (12,), 0,
                               f"{why} {LEAVE_ALONE}.") for kind, why in BLOCKED_KINDS.items()},
    "bias_is_the_input": Case(lambda: net(ResidualBias(12), ResidualBias(12)), (12,), None,
                              "in relu(h @ w + h) one node would fill two placeholders (x and b), which the "
                              "matcher never does; leaving it or rewriting it exactly are both fine."),
}


def inputs_for(case: Case, device: torch.device) -> Callable[[int], tuple]:
    return lambda batch: (torch.randn(batch, *case.in_shape, dtype=case.dtype, device=device),)


# ----------------------------------------------------------------------------------------------
# Hidden models (L4): random depth, widths, spellings, literal biases, 2-D or 3-D inputs, parameter
# names and nesting, with blocked sites mixed in.

def hidden_case(rng: random.Random) -> Case:
    batched = rng.random() < 0.5
    tokens = rng.randint(2, 5)
    width = in_width = rng.choice([8, 12, 16, 24])
    blocks, rewrites = [], 0
    kinds = [rng.choice(["fuse"] * 5 + list(BLOCKED_KINDS)) for _ in range(rng.randint(3, 6))]
    kinds[rng.randrange(len(kinds))] = "fuse"  # at least one site to rewrite
    for kind in kinds:
        fan_out = rng.choice([8, 12, 16, 24])
        spelling = Spelling(rng.choice([m for m in MATMULS if m != "torch.mm" or not batched]),
                            rng.choice(list(BIAS_ADDS)), rng.choice(list(RELUS)))
        bias = round(rng.uniform(-1, 1), 2) if kind == "fuse" and rng.random() < 0.15 else random_bias(fan_out, kind)
        names = (random_identifier(rng), random_identifier(rng))
        while names[1] == names[0]:
            names = (names[0], random_identifier(rng))
        path = ".".join(random_identifier(rng) for _ in range(rng.randint(1, 3))) + f"_{len(blocks)}"
        blocks.append((path, Block(random_weight(width, fan_out), bias, spelling, kind, names)))
        rewrites += kind == "fuse"
        width = fan_out
    in_shape = (tokens, in_width) if batched else (in_width,)
    return Case(lambda: PathChain(blocks), in_shape, rewrites,
                "the pass must work for any spelling combination, parameter names, nesting and input rank.")


# ----------------------------------------------------------------------------------------------
# Checks

def call_name(node: fx.Node):
    return node.target if node.op in ("call_function", "call_method") else None


MATMUL_TARGETS = {operator.matmul, torch.matmul, torch.mm, torch.bmm, "matmul", "mm", "bmm"}
OUT_OF_PLACE_ADDS = {operator.add, torch.add, "add"}
RELU_TARGETS = {F.relu, torch.relu, torch.relu_, "relu", "relu_"}


def unfused_sites(gm: fx.GraphModule) -> list[fx.Node]:
    """ReLU nodes that read a new tensor made by adding something to a matmul product: the unfused form."""
    def is_unfused_sum(node) -> bool:
        return (isinstance(node, fx.Node) and call_name(node) in OUT_OF_PLACE_ADDS
                and any(isinstance(a, fx.Node) and call_name(a) in MATMUL_TARGETS for a in node.args))

    return [n for n in gm.graph.nodes if call_name(n) in RELU_TARGETS and n.args and is_unfused_sum(n.args[0])]


def graph_signature(gm: fx.GraphModule) -> list[tuple]:
    return [(n.op, str(n.target), str(n.args), str(n.kwargs)) for n in gm.graph.nodes]


def run_pass(ctx: Context, model: nn.Module) -> tuple[fx.GraphModule, fx.GraphModule, int]:
    """Trace the model and run the learner's pass on it: (traced copy before the pass, the caller's gm, count)."""
    gm = fx.symbolic_trace(model)
    before = copy.deepcopy(gm)
    count = ctx.call("fuse_matmul_bias_relu", gm, returns=int)
    # The pass rewrites the caller's gm in place: this gm, not a copy, is what is graded.
    assert_valid_graph_module(gm, "fuse_matmul_bias_relu (the GraphModule it was given, after the call)")
    return before, gm, count


def assert_rewritten(before: fx.GraphModule, gm: fx.GraphModule, count: int, rewrites: int | None, hint: str):
    sites_before, sites_after = len(unfused_sites(before)), len(unfused_sites(gm))
    if rewrites == 0 and graph_signature(gm) != graph_signature(before):
        raise CheckFailed(f"fuse_matmul_bias_relu changed a graph it must leave alone. Hint: {hint}"
                          + before_after(before, gm))
    if rewrites is not None and sites_after != sites_before - rewrites:
        left = ", ".join(n.name for n in unfused_sites(gm)) or "none"
        raise CheckFailed(
            f"after fuse_matmul_bias_relu, the graph it was given still has {sites_after} unfused "
            f"matmul + bias + ReLU site(s) (ReLU nodes: {left}); expected {sites_before - rewrites} of the "
            f"{sites_before}. The fused form adds the bias into the product's buffer (add_, or inside the "
            f"matmul), never into a new tensor. Rewrite the GraphModule you were given, in place: the grader "
            f"reads the caller's gm. Hint: {hint}" + before_after(before, gm))
    return sites_before - sites_after


def check_case(ctx: Context, case: Case) -> dict:
    model = case.build().to(ctx.device)
    pristine = copy.deepcopy(model)
    before, gm, count = run_pass(ctx, model)
    rewritten = assert_rewritten(before, gm, count, case.rewrites, case.hint)
    try:
        assert_same_outputs(pristine, gm, input_sets(inputs_for(case, ctx.device)), what="the rewritten module",
                            hint=case.hint)
    except CheckFailed as failure:  # a crash of the rewritten module comes without the case's hint
        message = str(failure)
        raise CheckFailed(message if "Hint:" in message else f"{message} Hint: {case.hint}") from None
    if count != rewritten:
        raise CheckFailed(f"fuse_matmul_bias_relu returned {count}, but it rewrote {rewritten} site(s) of this "
                          "model. Hint: return the total number of sites rewritten, summed over all patterns "
                          "(replace_pattern returns one Match per site).")
    return {"sites_rewritten": rewritten}


def assert_close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    try:
        torch.testing.assert_close(got, want)
    except AssertionError as exc:
        detail = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        raise CheckFailed(f"{what}: {detail}") from None


@KATA.check(level=1)
def replacement_matches_pattern(ctx: Context):
    x, w, b = (torch.randn(5, 12, device=ctx.device), random_weight(12, 7).to(ctx.device),
               random_bias(7).to(ctx.device))
    shapes = f"x {tuple(x.shape)}, w {tuple(w.shape)}, b {tuple(b.shape)}"
    want = ctx.call("pattern", x.clone(), w.clone(), b.clone(), returns=torch.Tensor)
    got = ctx.call("replacement", x.clone(), w.clone(), b.clone(), returns=torch.Tensor)
    assert_close(want, F.relu(x @ w + b), f"pattern(x, w, b) does not compute relu(x @ w + b) on {shapes}")
    assert_close(got, want, f"replacement(x, w, b) does not compute what pattern(x, w, b) does on {shapes}. "
                            "Hint: keep every term: the product, the bias and the ReLU. Details")


@KATA.check(level=1)
def two_layer_mlp(ctx: Context):
    return check_case(ctx, Case(spelled(), (12,), 2,
                                "both layers are relu(x @ w + b) in the spelling of `pattern`: "
                                "replace_pattern(gm, pattern, replacement) rewrites them."))


for _name, _case in EXACT_CASES.items():
    KATA.add(2, _name, lambda ctx, case=_case: check_case(ctx, case))


@KATA.check(level=3)
def wide_head_speedup(ctx: Context):
    batch, tokens, fan_in, fan_out = BENCHMARK_SHAPE
    model = PathChain([("head", block(fan_in, fan_out, Spelling(relu="torch.relu")))]).to(ctx.device)
    baseline = fx.symbolic_trace(copy.deepcopy(model))
    _, candidate, _ = run_pass(ctx, model)
    return assert_speedup(ctx, baseline, candidate,
                          lambda: (torch.randn(batch, tokens, fan_in, device=ctx.device),),
                          SPEEDUP_THRESHOLDS, what="the fused wide head", max_bytes_fraction=MAX_BYTES_FRACTION,
                          hint="the product is a fresh tensor nobody else reads: do the bias add and the ReLU "
                               "in its buffer (add_, relu_) instead of allocating two more tensors.")


for _index in range(1, 6):
    KATA.add(4, f"model_{_index}", lambda ctx: check_case(ctx, hidden_case(random.Random(ctx.seed))))
