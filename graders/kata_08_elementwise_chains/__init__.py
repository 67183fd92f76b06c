"""Grader for kata 08: find chains of elementwise ops, then fuse each chain into one node."""
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
from graders.models import nest_under, random_identifier
from graders.numerics import assert_same_outputs, input_sets
from graders.structure import assert_valid_graph_module, before_after, graph_table
from graders.timing import assert_speedup

KATA = Kata("08_elementwise_chains", api={
    "find_elementwise_chains": "find_elementwise_chains(gm: torch.fx.GraphModule) -> list[list[torch.fx.Node]]",
    "fuse_elementwise_chains": "fuse_elementwise_chains(gm: torch.fx.GraphModule) -> int",
})

# The L3 benchmark: a five-op chain on one 4096x4096 float32 tensor (64 MiB, well past every cache and
# past glibc's mmap threshold, so each unfused op also pays for a fresh allocation). Reference medians
# 3.19x-3.32x on CPU single-threaded, a no-op 0.95x-1.00x, a fused node that runs the ops one at a time
# 1.00x (README, "Measured speedups"). The CUDA threshold is a guess, not measured on a GPU yet.
SPEEDUP_THRESHOLDS = {"cpu": 2.0, "cuda": 2.0}
BENCHMARK_SIZE = 4096

# ----------------------------------------------------------------------------------------------
# The elementwise ops of the README, in every spelling: the grader's own reading of "elementwise",
# used to count what is left after fusion and, on the hidden models, to know the expected chains.

ELEMENTWISE_FUNCTIONS = {
    operator.add, torch.add, operator.sub, torch.sub, operator.mul, torch.mul, operator.truediv, torch.div,
    operator.neg, torch.neg, operator.abs, torch.abs, torch.exp, torch.relu, F.relu, torch.sigmoid, torch.tanh,
}
ELEMENTWISE_METHODS = {"add", "sub", "mul", "div", "neg", "abs", "exp", "relu", "sigmoid", "tanh"}
ELEMENTWISE_MODULES = (nn.ReLU, nn.Sigmoid, nn.Tanh)


def is_elementwise(node: fx.Node, modules: dict) -> bool:
    if "out" in node.kwargs or node.kwargs.get("inplace", False):
        return False
    if node.op == "call_function":
        return node.target in ELEMENTWISE_FUNCTIONS
    if node.op == "call_method":
        return node.target in ELEMENTWISE_METHODS
    if node.op == "call_module":
        module = modules.get(node.target)
        return type(module) in ELEMENTWISE_MODULES and not getattr(module, "inplace", False)
    return False


def expected_chains(gm: fx.GraphModule) -> list[list[str]]:
    """The README's definition, as node names: each elementwise node continues the chain of its first
    input that is elementwise and has no other user."""
    modules = dict(gm.named_modules())
    elementwise = [n for n in gm.graph.nodes if is_elementwise(n, modules)]
    successor = {}
    for node in elementwise:
        source = next((i for i in node.all_input_nodes if i in elementwise and len(i.users) == 1), None)
        if source is not None:
            successor[source] = node
    chains = []
    for node in elementwise:
        if node in successor and node not in successor.values():
            chain = [node]
            while chain[-1] in successor:
                chain.append(successor[chain[-1]])
            chains.append([n.name for n in chain])
    return chains


def elementwise_count(gm: fx.GraphModule) -> int:
    modules = dict(gm.named_modules())
    return sum(is_elementwise(n, modules) for n in gm.graph.nodes)


# ----------------------------------------------------------------------------------------------
# Models. Each case names the chains a correct finder returns, written out by hand.

def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


class Basic(nn.Module):
    def __init__(self, width: int = 12):
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        return torch.sigmoid(torch.relu(self.proj(x) * 2.0 + 1.0))


class MethodSpellings(nn.Module):
    def forward(self, x, y):
        return x.mul(1.5).add(y).relu().sub(0.5).tanh().neg().abs().exp().div(2.0).sigmoid()


class FunctionSpellings(nn.Module):
    def forward(self, x, y):
        h = torch.div(torch.sub(torch.mul(torch.add(x, y), 1.5), 0.25), 2.0)
        h = torch.exp(torch.abs(torch.neg(torch.tanh(h))))
        return torch.sigmoid(F.relu(torch.relu(h) - 1.5))


class OperatorSpellings(nn.Module):
    def forward(self, x, y):
        return -(abs(x * y + 1) - 0.5) / 2


class ModuleSpellings(nn.Module):
    def __init__(self, width: int = 10):
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.relu, self.sigmoid, self.tanh = nn.ReLU(), nn.Sigmoid(), nn.Tanh()

    def forward(self, x):
        return self.tanh(self.sigmoid(self.relu(self.linear(x)) * 2) - 0.5)


class MultiUserInterior(nn.Module):
    def forward(self, x):
        a = torch.relu(x * 2)                       # two users: the chain ends here
        return (a.sigmoid() + 1) * (a - 1).tanh()


class GraphOutputInterior(nn.Module):
    def forward(self, x):
        a = torch.tanh(x * 3 - 1)                   # returned, and read by the sigmoid
        return a, torch.sigmoid(a).mul(2)


class BranchAndJoin(nn.Module):
    def forward(self, x):
        h = (x + 1) * 2                             # two users: ends a chain
        left = torch.relu(h).sigmoid()
        right = torch.tanh(h) * 3
        return (left + right).exp()                 # two chains reach the add: its first input continues


class ReductionFeedsChain(nn.Module):
    """A naive grouping of mul..sigmoid would need the mean, which needs the relu: a cycle."""

    def forward(self, x):
        b = (x * 2).relu()
        return (b - b.mean(-1, keepdim=True)).sigmoid()


class ReductionsBreak(nn.Module):
    def forward(self, x):
        return torch.relu(x * 2).sum(-1, keepdim=True).sigmoid().mul(3) + x.amax(-1, keepdim=True).tanh().neg()


class MatmulLinearConvBreak(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(width, width) / width ** 0.5)
        self.linear = nn.Linear(width, width)
        self.conv = nn.Conv1d(1, 1, 3, padding=1)

    def forward(self, x):
        h = (x * 2 + 1) @ self.weight
        h = self.linear(torch.relu(h).neg())
        h = self.conv((torch.tanh(h) - 0.5).unsqueeze(1))
        return torch.sigmoid(h) * 2


class GetitemBreaks(nn.Module):
    def forward(self, x):
        a, b = (x * 2 + 1).chunk(2, dim=-1)
        return torch.relu(a).sigmoid() * b.tanh()


class RandomOpsBreak(nn.Module):
    def __init__(self):
        super().__init__()
        self.dropout = nn.Dropout(0.3)

    def forward(self, x):
        h = F.dropout(x * 2 + 1, 0.5, training=True)
        h = torch.sigmoid(h.relu() + torch.rand_like(h)).mul(3)
        return self.dropout(h).tanh().abs()


class InplaceOpsBreak(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        a = self.act(x * 2 + 1)
        b = F.relu(torch.sigmoid(a).mul(2), inplace=True)
        c = b.add_(1).tanh().sub(1)
        return torch.relu_(c * 3).neg().abs()


class ViewsBreak(nn.Module):
    def forward(self, x):
        h = (x * 2 + 1).t().relu().sigmoid().t()
        return h.tanh().neg().unsqueeze(0).exp().squeeze(0).view(-1).abs().reshape(x.shape[0], -1) * 2


class OperandDefinedMidChain(nn.Module):
    """The mul's other operand is computed after the chain's head: the fused node goes at the tail."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(width, width) / width ** 0.5)

    def forward(self, x, y):
        a = torch.relu(x)
        m = y @ self.weight
        return (a * m).tanh()


class ReversedOperands(nn.Module):
    def forward(self, x, y):
        b = 1 - x.sigmoid()
        c = 2.0 / (b + 0.5)
        d = torch.sub(y, c)
        return torch.div(y, d.abs() + 1)


class BroadcastGrows(nn.Module):
    """The chain starts on a [width] parameter and grows to [batch, width] at the add."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(width))

    def forward(self, x):
        return torch.sigmoid(torch.relu(self.bias * 2) + x).mul(3)


class DtypePromotion(nn.Module):
    """int64 -> float32 at the true division -> float64 at the add."""

    def forward(self, x, y):
        return ((x * 3 + 1) / 2 + y).sigmoid() - torch.div(x * 5, 2, rounding_mode="floor").neg()


class AlphaAndRoundingMode(nn.Module):
    def forward(self, x, y):
        a = torch.add(x, y, alpha=0.5)
        b = torch.sub(y, a, alpha=2)
        return torch.div(b, 0.3, rounding_mode="floor").mul(0.25).tanh()


class ValueSquared(nn.Module):
    def forward(self, x):
        a = torch.relu(x + 1)
        return (a * a).tanh()


class ChainsInGraphOrder(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(width, width) / width ** 0.5)

    def forward(self, x):
        h = torch.tanh(x).sigmoid() @ self.weight
        return torch.relu(h).add(1).sum(-1)


class NoChains(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(width, width) / width ** 0.5)

    def forward(self, x):
        a = torch.relu(x)
        return (a @ self.weight).sigmoid().sum(-1) + a.mean()


@dataclass
class Case:
    build: Callable[[], nn.Module]
    inputs: Callable[[int], tuple]
    chains: list[list[str]]
    hint: str
    seeded: bool = False  # the model draws random numbers: compare runs from the same seed


def one(width: int) -> Callable[[int], tuple]:
    return lambda batch: (rand(batch, width),)


def two(width: int) -> Callable[[int], tuple]:
    return lambda batch: (rand(batch, width), rand(batch, width))


SPELLINGS = "the README lists every spelling that counts: operator, torch function, Tensor method and nn module."
ENDS = "an interior node must have exactly one user, the next node of the chain (the output node counts as a user)."
BREAKS = "only the ten elementwise ops of the README, out of place, belong to a chain; everything else ends one."
FIRST_INPUT = "where two inputs could continue a chain, the first one in node.all_input_nodes does."

BASIC = Case(Basic, one(12), [["mul", "add", "relu", "sigmoid"]],
             "walk the graph; link each elementwise node to its elementwise input that has no other user.")

EXACT_CASES: dict[str, Case] = {
    "method_spellings": Case(MethodSpellings, two(9), [
        ["mul", "add", "relu", "sub", "tanh", "neg", "abs_1", "exp", "div", "sigmoid"]], SPELLINGS),
    "function_spellings": Case(FunctionSpellings, two(9), [
        ["add", "mul", "sub", "div", "tanh", "neg", "abs_1", "exp", "relu", "sub_1", "relu_1", "sigmoid"]],
        SPELLINGS),
    "operator_spellings": Case(OperatorSpellings, two(9), [["mul", "add", "abs_1", "sub", "neg", "truediv"]],
                               SPELLINGS),
    "module_spellings": Case(ModuleSpellings, one(10), [["relu", "mul", "sigmoid", "sub", "tanh"]], SPELLINGS),
    "multi_user_interior": Case(MultiUserInterior, one(9), [["mul", "relu"], ["sigmoid", "add", "mul_1"],
                                                            ["sub", "tanh"]], ENDS),
    "graph_output_interior": Case(GraphOutputInterior, one(9), [["mul", "sub", "tanh"], ["sigmoid", "mul_1"]],
                                  ENDS),
    "branch_and_join": Case(BranchAndJoin, one(9), [["add", "mul"], ["relu", "sigmoid", "add_1", "exp"],
                                                    ["tanh", "mul_1"]], FIRST_INPUT),
    "reduction_feeds_chain": Case(ReductionFeedsChain, one(9), [["mul", "relu"], ["sub", "sigmoid"]],
                                  ENDS + " Joining through the relu would need the mean inside the fused node: a cycle."),
    "reductions_break": Case(ReductionsBreak, one(9), [["mul", "relu"], ["sigmoid", "mul_1", "add"], ["tanh", "neg"]],
                             BREAKS),
    "matmul_linear_conv_break": Case(MatmulLinearConvBreak, one(8), [["mul", "add"], ["relu", "neg"],
                                                                      ["tanh", "sub"], ["sigmoid", "mul_1"]], BREAKS),
    "getitem_breaks": Case(GetitemBreaks, one(10), [["mul", "add"], ["relu", "sigmoid", "mul_1"]],
                           BREAKS + " " + FIRST_INPUT),
    "random_ops_break": Case(RandomOpsBreak, one(9), [["mul", "add"], ["relu", "add_1", "sigmoid", "mul_1"],
                                                      ["tanh", "abs_1"]],
                             BREAKS + " Dropout and rand_like draw random numbers: they are not in the list.",
                             seeded=True),
    "inplace_ops_break": Case(InplaceOpsBreak, one(9), [["mul", "add"], ["sigmoid", "mul_1"], ["tanh", "sub", "mul_2"],
                                                        ["neg", "abs_1"]],
                              "in-place ops (relu_, add_, inplace=True) change a tensor others may hold: "
                              "they end chains."),
    "views_break": Case(ViewsBreak, one(9), [["mul", "add"], ["relu", "sigmoid"], ["tanh", "neg"]],
                        BREAKS + " Views (t, view, reshape, unsqueeze) are not elementwise ops."),
    "operand_defined_mid_chain": Case(OperandDefinedMidChain, two(8), [["relu", "mul", "tanh"]],
                                      "the mul's other operand is computed after the relu: put the fused node "
                                      "where the chain's last node was, not where its first was."),
    "reversed_operands": Case(ReversedOperands, two(9), [["sigmoid", "sub", "add", "truediv", "sub_1", "abs_1",
                                                          "add_1", "div"]],
                              "in 1 - v and 2.0 / v the chain's value is the second operand: keep the order."),
    "broadcast_grows": Case(BroadcastGrows, one(8), [["mul", "relu", "add", "sigmoid", "mul_1"]],
                            "the chain's value grows from [8] to [batch, 8] at the add: a buffer of the old "
                            "shape cannot hold the result."),
    "dtype_promotion": Case(DtypePromotion,
                            lambda b: (torch.randint(-20, 20, (b, 9)), rand(b, 9, dtype=torch.float64)),
                            [["mul", "add", "truediv", "add_1", "sigmoid", "sub"], ["mul_1", "div", "neg"]],
                            "int64 * 3 + 1 stays int64, / 2 gives float32, + a float64 tensor gives float64: "
                            "a buffer of the old dtype cannot hold the result."),
    "alpha_and_rounding_mode": Case(AlphaAndRoundingMode, two(9), [["add", "sub", "div", "mul", "tanh"]],
                                    "keep every keyword argument of every op (alpha, rounding_mode)."),
    "value_squared": Case(ValueSquared, one(9), [["add", "relu", "mul", "tanh"]],
                          "a * a reads the chain's value twice: both operands are the value."),
    "chains_in_graph_order": Case(ChainsInGraphOrder, one(8), [["tanh", "sigmoid"], ["relu", "add"]],
                                  "return the chains in graph (topological) order of their first nodes."),
    "no_chains": Case(NoChains, one(8), [],
                      "a single elementwise op is not a chain: a chain has at least two nodes."),
}

# ----------------------------------------------------------------------------------------------
# Hidden models (L4): random programs of elementwise ops in random spellings, with breakers, values
# read twice, extra graph outputs, parameters and random module names. The grader's own finder
# (expected_chains above) says which chains a correct pass finds.

UNARY_SPELLINGS = {
    "relu": [lambda v: v.relu(), torch.relu, F.relu, nn.ReLU],
    "sigmoid": [lambda v: v.sigmoid(), torch.sigmoid, nn.Sigmoid],
    "tanh": [lambda v: v.tanh(), torch.tanh, nn.Tanh],
    "neg": [lambda v: v.neg(), torch.neg, operator.neg],
    "abs": [lambda v: v.abs(), torch.abs, abs],
}
BINARY_SPELLINGS = {
    "add": [operator.add, torch.add, lambda a, b: a.add(b)],
    "sub": [operator.sub, torch.sub, lambda a, b: a.sub(b)],
    "mul": [operator.mul, torch.mul, lambda a, b: a.mul(b)],
}
BREAKERS = [
    lambda m, v: v - v.mean(-1, keepdim=True),
    lambda m, v: v @ m.weight,
    lambda m, v: v.t().t(),
    lambda m, v: v.view(-1).view(v.shape[0], -1),
    lambda m, v: F.relu(v * 1.0, inplace=True),
    lambda m, v: torch.cat(v.chunk(2, dim=-1)[::-1], dim=-1),
    lambda m, v: F.dropout(v, 0.5, training=False),
]


class HiddenNet(nn.Module):
    def __init__(self, width: int, program: list, extra_outputs: list[int]):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(width, width) / width ** 0.5)
        self.bias = nn.Parameter(torch.randn(width))
        self.program, self.extra_outputs = program, extra_outputs

    def forward(self, x, y):
        values = [x, y]
        for op in self.program:
            values.append(op(self, values))
        return (values[-1], *(values[i] for i in self.extra_outputs))


def hidden_case(rng: random.Random) -> Case:
    width = rng.choice([8, 12, 16])
    modules: list[tuple[str, nn.Module]] = []
    program = []

    def pick_source(count: int) -> int:
        return count - 1 if rng.random() < 0.8 else rng.randrange(count)

    for step in range(rng.randint(10, 18)):
        count = 2 + step
        source = pick_source(count)
        roll = rng.random()
        if roll < 0.45:
            spell = rng.choice(UNARY_SPELLINGS[rng.choice(list(UNARY_SPELLINGS))])
            if isinstance(spell, type):
                path = ".".join(random_identifier(rng) for _ in range(rng.randint(1, 2))) + f"_{step}"
                modules.append((path, spell()))
                program.append(lambda m, vs, s=source, p=path: m.get_submodule(p)(vs[s]))
            else:
                program.append(lambda m, vs, s=source, f=spell: f(vs[s]))
        elif roll < 0.85:
            spell = rng.choice(BINARY_SPELLINGS[rng.choice(list(BINARY_SPELLINGS))])
            kind = rng.choice(["scalar", "input", "bias", "value"])
            other = rng.randrange(count) if kind == "value" else rng.randrange(2)
            scalar = round(rng.uniform(0.5, 1.5), 3)
            swap = rng.random() < 0.4 and kind != "scalar"

            def binary(m, vs, s=source, f=spell, kind=kind, other=other, scalar=scalar, swap=swap):
                operand = scalar if kind == "scalar" else m.bias if kind == "bias" else vs[other]
                return f(operand, vs[s]) if swap else f(vs[s], operand)

            program.append(binary)
        elif roll < 0.92:
            scalar = round(rng.uniform(1.5, 3.0), 3)
            program.append(lambda m, vs, s=source, d=scalar: vs[s] / d if d > 2 else torch.div(vs[s], d))
        else:
            program.append(lambda m, vs, s=source, f=rng.choice(BREAKERS): f(m, vs[s]))
    steps = len(program)
    extra_outputs = rng.sample(range(2, 2 + steps - 1), k=rng.randint(0, 2))

    def build() -> nn.Module:
        net = HiddenNet(width, program, extra_outputs)
        for path, module in modules:
            nest_under(net, path, copy.deepcopy(module))
        return net

    return Case(build, two(width), None, "the pass must work for any spelling, name, nesting and graph shape.")


# ----------------------------------------------------------------------------------------------
# Checks

def chain_names(ctx: Context, gm: fx.GraphModule) -> list[list[str]]:
    chains = ctx.call("find_elementwise_chains", gm, returns=list)
    nodes = set(gm.graph.nodes)
    if not all(isinstance(c, (list, tuple)) and all(isinstance(n, fx.Node) and n in nodes for n in c) for c in chains):
        raise CheckFailed("find_elementwise_chains must return a list of chains, each a list of the graph's own "
                          f"torch.fx.Node objects; got {chains!r:.200}.")
    return [[n.name for n in chain] for chain in chains]


def seeded(module: Callable) -> Callable:
    def run(*inputs):
        torch.manual_seed(0)
        return module(*inputs)
    return run


def check_find(ctx: Context, case: Case, where: str) -> dict:
    gm = fx.symbolic_trace(case.build())
    want = case.chains if case.chains is not None else expected_chains(gm)
    got = chain_names(ctx, gm)
    if got != want:
        raise CheckFailed(
            f"find_elementwise_chains on {where} returned {got}; expected {want} (node names, chains in graph "
            f"order). Hint: {case.hint}\n\nThe graph:\n{graph_table(gm)}")
    return {"chains": len(want)}


def check_fuse(ctx: Context, case: Case, where: str) -> dict:
    model = case.build()
    pristine = copy.deepcopy(model)
    before = fx.symbolic_trace(copy.deepcopy(model))
    want = case.chains if case.chains is not None else expected_chains(before)
    gm = fx.symbolic_trace(model)
    count = ctx.call("fuse_elementwise_chains", gm, returns=int)
    assert_valid_graph_module(gm, "fuse_elementwise_chains")
    fused_nodes = sum(len(chain) for chain in want)
    if count != len(want):
        raise CheckFailed(f"fuse_elementwise_chains on {where} returned {count}; it fused {len(want)} chain(s) "
                          f"{want}, so it should return {len(want)}: the number of chains, not of nodes."
                          + before_after(before, gm))
    left, expected_left = elementwise_count(gm), elementwise_count(before) - fused_nodes
    nodes, expected_nodes = len(gm.graph.nodes), len(before.graph.nodes) - fused_nodes + len(want)
    if (left, nodes) != (expected_left, expected_nodes):
        raise CheckFailed(
            f"after fuse_elementwise_chains on {where}, the graph has {left} elementwise node(s) and {nodes} "
            f"node(s) in all; expected {expected_left} and {expected_nodes}: each of the chains {want} becomes "
            f"exactly one node, and nothing else changes. Hint: {case.hint}" + before_after(before, gm))
    run = seeded if case.seeded else (lambda m: m)
    assert_same_outputs(run(pristine), run(gm), input_sets(case.inputs), what=f"the fused {where}",
                        hint=case.hint)
    return {"chains": count}


@KATA.check(level=1)
def find_basic(ctx: Context):
    return check_find(ctx, BASIC, "the basic model (linear, then x * 2 + 1, relu, sigmoid)")


@KATA.check(level=1)
def fuse_basic(ctx: Context):
    return check_fuse(ctx, BASIC, "the basic model (linear, then x * 2 + 1, relu, sigmoid)")


for _name, _case in EXACT_CASES.items():
    KATA.add(2, f"find_{_name}", lambda ctx, case=_case, name=_name: check_find(ctx, case, f"model {name}"))
for _name, _case in EXACT_CASES.items():
    KATA.add(2, f"fuse_{_name}", lambda ctx, case=_case, name=_name: check_fuse(ctx, case, f"model {name}"))


class BenchmarkChain(nn.Module):
    def forward(self, x):
        return torch.sigmoid(torch.relu(x * 1.5 + 0.5) - 0.25)


@KATA.check(level=3)
def five_op_chain_speedup(ctx: Context):
    baseline = fx.symbolic_trace(BenchmarkChain()).to(ctx.device)
    candidate = fx.symbolic_trace(BenchmarkChain()).to(ctx.device)
    ctx.call("fuse_elementwise_chains", candidate, returns=int)
    assert_valid_graph_module(candidate, "fuse_elementwise_chains")
    return assert_speedup(
        ctx, baseline, candidate, lambda: (torch.randn(BENCHMARK_SIZE, BENCHMARK_SIZE, device=ctx.device),),
        SPEEDUP_THRESHOLDS, what="the fused five-op chain on a 4096x4096 tensor",
        hint="a fused node that still runs the five ops one after another writes five 64 MiB tensors, as "
             "before. Write one buffer and let every later op overwrite it in place (README, 'Why this pass "
             "exists').")


def check_hidden(ctx: Context, index: int) -> dict:
    case = hidden_case(random.Random(ctx.seed))
    where = f"hidden model {index}"
    return {**check_find(ctx, case, where), **check_fuse(ctx, case, where)}


for _index in range(1, 6):
    KATA.add(4, f"model_{_index}", lambda ctx, index=_index: check_hidden(ctx, index))
