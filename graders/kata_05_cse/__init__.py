"""Grader for kata 05: common-subexpression elimination."""
from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from graders.core import CheckFailed, Context, Kata
from graders.models import nest_under, random_identifier
from graders.numerics import assert_same_outputs
from graders.structure import assert_valid_graph_module, before_after
from graders.timing import assert_speedup

PASS = "eliminate_common_subexpressions"
KATA = Kata("05_cse", api={PASS: "eliminate_common_subexpressions(gm: torch.fx.GraphModule) -> int (nodes merged)"})

# The L3 benchmark: a gated unit that calls the same Linear three times on the same input (a common
# result of inlining helper functions). Reference medians 2.47x-2.71x on CPU single-threaded (ideal 3x),
# a no-op 0.96x-1.12x (README, "Measured speedups"). The CUDA threshold is a guess: not measured on a GPU.
SPEEDUP_THRESHOLDS = {"cpu": 1.8, "cuda": 1.2}
BENCHMARK_ROWS, BENCHMARK_WIDTH = 128, 1024

# Random ops are compared by running the original and the rewritten module from the same generator
# state: they draw the same numbers in the same order unless the pass merged a draw away.
RANDOM_SEED = 1234


# ----------------------------------------------------------------------------------------------
# Models. Each forward is a plain function of (model, inputs); `Net` holds it and any leaf modules.

class Net(nn.Module):
    def __init__(self, forward: Callable, **modules: nn.Module):
        super().__init__()
        self.body = forward
        for path, module in modules.items():
            nest_under(self, path, module)

    def forward(self, x):
        return self.body(self, x)


class Net2(Net):
    def forward(self, x, y):
        return self.body(self, x, y)


@dataclass
class Case:
    build: Callable[[], nn.Module | fx.GraphModule]
    make_inputs: Callable[[int], tuple] | None  # None: the graph cannot run, only its structure is checked
    merges: int | tuple[int, int]                # nodes a correct pass removes (a range: either is correct)
    hint: str


def floats(*widths: int) -> Callable[[int], tuple]:
    return lambda batch: tuple(torch.randn(batch, w) for w in widths)


def duplicate_chains(m, x, y):
    a = torch.sin(x) * y
    first_user = a.cos()          # a user of the first copy before the second copy exists
    b = torch.sin(x) * y          # sin merges, then mul merges: its inputs are now the same nodes
    s1 = x.exp().sum(dim=1, keepdim=True)
    s2 = x.exp().sum(dim=1, keepdim=True)
    return torch.cat([a, s1], dim=1) + torch.cat([b, s2], dim=1), first_user


def nothing_to_merge(m, x, y):
    return (x - y, y - x, torch.sin(x), torch.sin(y), x.sum(0), x.sum(1), m.proj(x), m.proj(y))


def int_and_float_constants(m, x):
    return x + 1, x + 1.0, x * 2, x * 2.0


def bool_and_int_constants(m, x):
    return torch.full(x.shape, True), torch.full(x.shape, 1)


def zero_and_negative_zero(m, x):
    return torch.signbit(x * 0.0), torch.signbit(x * -0.0)


def differing_kwargs(m, x):
    return (F.leaky_relu(x, negative_slope=0.1), F.leaky_relu(x, negative_slope=0.3),
            x.sum(dim=1, keepdim=True), x.sum(dim=1, keepdim=False), torch.softmax(x, dim=1), torch.softmax(x, dim=0))


def random_functions(m, x):
    return (torch.rand_like(x), torch.rand_like(x), torch.randn_like(x), torch.randn_like(x),
            torch.rand(x.shape), torch.rand(x.shape))


def dropout_function_training(m, x):
    return F.dropout(x, 0.3, training=True) + F.dropout(x, 0.3, training=True) - F.dropout(x, p=0.3)


def dropout_module_training(m, x):
    return m.drop(x) - m.drop(x)


def batchnorm_training(m, x):
    return m.bn(x) + m.bn(x)  # each call updates the running statistics once


def inplace_activation_module(m, x):
    h = x * 1.5
    m.act(h)
    m.act(h)
    return h


def pure_modules(m, x, y):
    return m.act(m.proj(x)) * m.act(m.proj(x)) + m.proj(y)


def inplace_between_duplicates(m, x):
    h = x * 1.5
    before = h.exp()
    h.add_(1)
    after = h.exp()
    return before, after, h


def identical_inplace_methods(m, x):
    h = x * 1.5
    h.mul_(2)
    h.mul_(2)
    h.add_(0.5)
    h.add_(0.5)
    return h


def identical_inplace_functions(m, x):
    h, g = x * 1.5, x * 0.5
    torch.sigmoid_(h)
    torch.sigmoid_(h)
    F.leaky_relu(g, 0.2, inplace=True)
    F.leaky_relu(g, 0.2, inplace=True)
    return h, g


def duplicate_mutated_later(m, x):
    h = x * 1.5
    a, b = h + 1, h + 1
    b.mul_(2)
    return a, b


def duplicate_mutated_through_view(m, x):
    h = x * 1.5
    a, b = h + 1, h + 1
    b[:, :3].mul_(2)
    return a, b


def list_and_tuple_args(m, x, y):
    return (torch.cat([torch.sin(x), y], 1), torch.cat([torch.sin(x), y], 1),
            torch.stack((x, y)), torch.stack((x, y)), x.permute([1, 0]), x.permute([1, 0]))


def slice_args(m, x):
    return x[:, 0:2] * 2, x[:, 0:2] * 2, x[:, 1:3] * 2


def tensor_constant_args() -> fx.GraphModule:
    """torch.add(x, t1), torch.add(x, t2), torch.add(x, t1): tensors as literal arguments (built by hand;
    `==` on two tensors is elementwise, so comparing arguments with == raises)."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    t1, t2 = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 4.0])
    adds = [graph.call_function(torch.add, (x, t)) for t in (t1, t2, t1)]
    graph.output(tuple(adds))
    return fx.GraphModule(nn.Module(), graph)


def proj(cin: int = 6, cout: int = 6) -> nn.Linear:
    return nn.Linear(cin, cout)


KEEP_RANDOM = "a random op draws new numbers at each call: two calls are two different values."
KEEP_INPLACE = "an in-place op is a write, not a value: never merge it, and never merge across it."
EXACT_CASES: dict[str, Case] = {
    "int_and_float_constants": Case(
        lambda: Net(int_and_float_constants), lambda b: (torch.randint(-5, 5, (b, 6)),), 0,
        "1 == 1.0 and hash(1) == hash(1.0), but x + 1 keeps an integer x integer and x + 1.0 does not: "
        "a key must hold each constant's type."),
    "bool_and_int_constants": Case(
        lambda: Net(bool_and_int_constants), floats(6), 1,
        "True == 1 and hash(True) == hash(1), but torch.full(shape, True) is a bool tensor; only the two "
        "`x.shape` reads may merge."),
    "zero_and_negative_zero": Case(
        lambda: Net(zero_and_negative_zero), floats(6), 0,
        "0.0 == -0.0 and they hash alike, but x * -0.0 flips the sign of every zero: compare floats by repr."),
    "differing_kwargs": Case(
        lambda: Net(differing_kwargs), lambda b: (torch.randn(b, b),), 0,
        "the keyword arguments are part of the expression: put node.kwargs into the key."),
    "random_functions": Case(
        lambda: Net(random_functions), floats(6), 1,
        KEEP_RANDOM + " Only the two `x.shape` reads may merge."),
    "dropout_function_training": Case(lambda: Net(dropout_function_training), floats(6), 0, KEEP_RANDOM),
    "dropout_module_training": Case(
        lambda: Net(dropout_module_training, drop=nn.Dropout(0.3).train()), floats(6), 0,
        "an nn.Dropout in training mode is random: merge a call_module only for a pure module."),
    "batchnorm_training": Case(
        lambda: Net(batchnorm_training, bn=nn.BatchNorm1d(6).train()), floats(6), 0,
        "a BatchNorm in training mode updates its running statistics at each call: it is not pure."),
    "inplace_activation_module": Case(
        lambda: Net(inplace_activation_module, act=nn.LeakyReLU(0.2, inplace=True)), floats(6), 0,
        "a module built with inplace=True writes to its input: " + KEEP_INPLACE),
    "pure_modules_merge": Case(
        lambda: Net2(pure_modules, proj=proj(), act=nn.GELU()), floats(6, 6), 2,
        "a Linear or a GELU module computes the same output from the same input: merge those calls."),
    "inplace_between_duplicates": Case(
        lambda: Net(inplace_between_duplicates), floats(6), 0,
        "h.exp() before h.add_(1) and h.exp() after it read different values: " + KEEP_INPLACE),
    "identical_inplace_methods": Case(
        lambda: Net(identical_inplace_methods), floats(6), 0,
        "h.mul_(2) twice multiplies by 4, since a method ending in `_` writes to its tensor: " + KEEP_INPLACE),
    "identical_inplace_functions": Case(
        lambda: Net(identical_inplace_functions), floats(6), 0,
        "torch.sigmoid_(h) and F.leaky_relu(g, inplace=True) write to their input: " + KEEP_INPLACE),
    "duplicate_mutated_later": Case(
        lambda: Net(duplicate_mutated_later), floats(6), 0,
        "b.mul_(2) changes b after both copies exist: merged, a would change with it. Never merge a value "
        "that some in-place op writes to."),
    "duplicate_mutated_through_view": Case(
        lambda: Net(duplicate_mutated_through_view), floats(6), 0,
        "b[:, :3] is a view of b: writing to it writes to b. Follow views back to the tensor they alias."),
    "list_and_tuple_args": Case(
        lambda: Net2(list_and_tuple_args), floats(4, 4), 4,
        "torch.cat([...]), torch.stack((...)) and x.permute([...]) take lists and tuples: a key must hold "
        "them, with the nodes inside replaced too."),
    "slice_args": Case(
        lambda: Net(slice_args), floats(6), (0, 2),
        "x[:, 0:2] holds slice objects, unhashable before Python 3.12: the pass must not crash on them "
        "(merging the two equal ones is optional; merging the different one is wrong)."),
    "tensor_constant_args": Case(
        tensor_constant_args, None, (0, 1),
        "a tensor argument is compared by identity at most; `t1 == t2` is elementwise and raises inside `if`."),
}


# ----------------------------------------------------------------------------------------------
# Hidden models (L4): chains of random steps, spelled at random, in blocks that must merge, must not
# merge, or merge only a prefix. The generator counts the merges a correct pass makes.

class Step:
    """One pure elementwise op with its constant, in function or method spelling."""

    KINDS = ["sin", "tanh", "sigmoid", "scale", "shift", "clamp", "leaky_relu", "softplus"]

    def __init__(self, rng: random.Random, kind: str | None = None):
        self.kind = kind or rng.choice(self.KINDS)
        self.method = rng.random() < 0.5
        self.const = rng.choice([2, 3]) if self.kind in ("scale", "shift") else rng.choice([0.1, 0.2, 0.3])
        self.option = "min"

    def twin(self, rng: random.Random) -> "Step":
        """The same step but for one detail that makes it a different expression."""
        other = copy.copy(self)
        if self.kind in ("scale", "shift"):
            other.const = float(self.const)               # x * 2 versus x * 2.0
        elif self.kind == "clamp":
            other.option = "max"                          # clamp(min=c) versus clamp(max=c)
        elif self.kind in ("leaky_relu", "softplus"):
            other.const = self.const + 0.5                # another keyword value
        else:
            other.kind = {"sin": "cos", "tanh": "sigmoid", "sigmoid": "tanh"}[self.kind]
        return other

    def __call__(self, h):
        k, c = self.kind, self.const
        if k == "scale":
            return h.mul(c) if self.method else h * c
        if k == "shift":
            return h.add(c) if self.method else h + c
        if k == "clamp":
            return h.clamp(**{self.option: c}) if self.method else torch.clamp(h, **{self.option: c})
        if k == "leaky_relu":
            return F.leaky_relu(h, negative_slope=c)
        if k == "softplus":
            return F.softplus(h, beta=1 + c)
        return getattr(h, k)() if self.method else getattr(torch, k)(h)


def chain(steps: list[Step], h):
    for step in steps:
        h = step(h)
    return h


RANDOM_DRAWS = {
    "rand_like": lambda m, h: torch.rand_like(h),
    "randn_like": lambda m, h: torch.randn_like(h),
    "randint_like": lambda m, h: torch.randint_like(h, 3),
    "normal": lambda m, h: torch.normal(h, 0.5),
    "bernoulli": lambda m, h: torch.bernoulli(h, 0.5),
    "dropout": lambda m, h: F.dropout(h, 0.25, training=True),
    "alpha_dropout": lambda m, h: F.alpha_dropout(h, 0.25, training=True),
}


def inplace_write(rng: random.Random):
    """A random in-place op (on the tensor it is given), and the leaf module it needs, if any."""
    kind = rng.choice(["add_", "mul_", "sigmoid_", "leaky_relu_inplace", "module"])
    c = rng.choice([0.5, 1.5, 2.0])
    if kind == "add_":
        return (lambda m, t: t.add_(c)), None
    if kind == "mul_":
        return (lambda m, t: t.mul_(c)), None
    if kind == "sigmoid_":
        return (lambda m, t: torch.sigmoid_(t)), None
    if kind == "leaky_relu_inplace":
        return (lambda m, t: F.leaky_relu(t, 0.2, inplace=True)), None
    return None, nn.LeakyReLU(0.2, inplace=True)


@dataclass
class Block:
    kind: str
    forward: Callable          # (module_holder, h) -> h
    merges: int


def hidden_block(rng: random.Random, width: int, modules: dict[str, nn.Module]) -> Block:
    kind = rng.choice(["dup_chain", "dup_chain", "near_miss", "near_miss", "random", "inplace_between",
                       "inplace_twice", "mutated_later", "pure_module", "impure_module"])
    steps = [Step(rng) for _ in range(rng.randint(1, 3))]

    def add_module(module: nn.Module) -> str:
        path = ".".join(random_identifier(rng) for _ in range(rng.randint(1, 2))) + f"_{len(modules)}"
        modules[path] = module
        return path

    def write_op():
        write, module = inplace_write(rng)
        if module is None:
            return write
        path = add_module(module)
        return lambda m, t: m.get_submodule(path)(t)

    if kind == "dup_chain":
        return Block(kind, lambda m, h: chain(steps, h) * 0.5 + chain(steps, h), len(steps))
    if kind == "near_miss":
        differ_at = rng.randrange(len(steps))
        other = steps[:differ_at] + [steps[differ_at].twin(rng)] + steps[differ_at + 1:]
        return Block(kind, lambda m, h: chain(steps, h) - chain(other, h), differ_at)
    if kind == "random":
        draw, c = RANDOM_DRAWS[rng.choice(sorted(RANDOM_DRAWS))], rng.choice([0.5, 2.0])
        return Block(kind, lambda m, h: h + draw(m, h) * c - draw(m, h), 0)
    if kind == "inplace_between":
        write, c = write_op(), rng.choice([1.25, 0.75])

        def forward(m, h):
            t = h * c
            before = chain(steps, t)
            write(m, t)
            return before + chain(steps, t) + t
        return Block(kind, forward, 0)
    if kind == "inplace_twice":
        write, c = write_op(), rng.choice([1.25, 0.75])

        def forward(m, h):
            t = h * c
            write(m, t)
            write(m, t)
            return t + h
        return Block(kind, forward, 0)
    if kind == "mutated_later":
        write = write_op()

        def forward(m, h):
            a, b = steps[0](h), steps[0](h)
            write(m, b)
            return a - b * 0.5
        return Block(kind, forward, 0)
    if kind == "pure_module":
        lin = add_module(nn.Linear(width, width))
        act = add_module(rng.choice([nn.GELU(), nn.Tanh(), nn.SiLU()]))
        return Block(kind, lambda m, h: m.get_submodule(act)(m.get_submodule(lin)(h))
                     + m.get_submodule(act)(m.get_submodule(lin)(h)) * 0.5, 2)
    impure = rng.choice([nn.Dropout(0.25), nn.BatchNorm1d(width), nn.LeakyReLU(0.2, inplace=True)]).train()
    path = add_module(impure)
    if isinstance(impure, nn.LeakyReLU):
        return Block(kind, lambda m, h: m.get_submodule(path)(h * 1.5) + m.get_submodule(path)(h * 1.5), 0)
    return Block(kind, lambda m, h: m.get_submodule(path)(h) - m.get_submodule(path)(h) * 0.5, 0)


def hidden_case(rng: random.Random) -> Case:
    width = rng.choice([5, 8, 12, 16])
    modules: dict[str, nn.Module] = {}
    blocks = [hidden_block(rng, width, modules) for _ in range(rng.randint(4, 7))]

    def forward(m, x):
        h = x
        for block in blocks:
            h = block.forward(m, h)
        return h

    kinds = ", ".join(b.kind for b in blocks)
    return Case(lambda: Net(forward, **modules), floats(width), sum(b.merges for b in blocks),
                f"a generated model of blocks ({kinds}): the pass must work for any op, spelling and name.")


# ----------------------------------------------------------------------------------------------
# Checks

def seeded(module: Callable) -> Callable:
    """Run `module` from a fixed generator state, so random ops draw the same numbers every run."""
    def run(*inputs):
        with torch.random.fork_rng():
            torch.manual_seed(RANDOM_SEED)
            return module(*inputs)
    return run


def describe(merges: int | tuple[int, int]) -> str:
    return f"{merges}" if isinstance(merges, int) else f"between {merges[0]} and {merges[1]}"


def check_case(ctx: Context, name: str, case: Case) -> dict:
    built = case.build()
    if isinstance(built, fx.GraphModule):
        gm, pristine = built, None
    else:
        model = built.to(ctx.device)
        pristine = copy.deepcopy(model)
        gm = fx.symbolic_trace(model)
    before = copy.deepcopy(gm)
    nodes_before = len(gm.graph.nodes)
    merged = ctx.call(PASS, gm, returns=int)
    assert_valid_graph_module(gm, PASS)
    removed = nodes_before - len(gm.graph.nodes)
    if merged != removed:
        raise CheckFailed(f"on the model `{name}`, {PASS} returned {merged} but removed {removed} node(s) from "
                          "the graph: return the number of nodes merged away." + before_after(before, gm))
    low, high = (case.merges, case.merges) if isinstance(case.merges, int) else case.merges
    if not low <= removed <= high:
        raise CheckFailed(f"on the model `{name}`, {PASS} merged away {removed} node(s); expected "
                          f"{describe(case.merges)}. Hint: {case.hint}" + before_after(before, gm))
    if pristine is not None:
        inputs = [tuple(t.to(ctx.device) for t in case.make_inputs(batch)) for batch in (2, 3) for _ in range(2)]
        assert_same_outputs(seeded(pristine), seeded(gm), inputs, what=f"the model `{name}` after the pass",
                            hint=case.hint)
    return {"merged": merged, "nodes_before": nodes_before}


@KATA.check(level=1)
def duplicate_chains_merge(ctx: Context):
    return check_case(ctx, "duplicate_chains", Case(
        lambda: Net2(duplicate_chains), floats(5, 5), 5,
        "sin, mul, exp, sum and cat each appear twice with the same inputs once the earlier ones are merged. "
        "Walk the nodes in order, keep the first of each expression, and replace a later copy's uses at once "
        "so its users' keys name the first copy too."))


@KATA.check(level=1)
def nothing_to_merge_left_alone(ctx: Context):
    return check_case(ctx, "nothing_to_merge", Case(
        lambda: Net2(nothing_to_merge, proj=proj()), floats(6, 6), 0,
        "two nodes are the same expression only if op, target, args (in order) and kwargs all match."))


for _name, _case in EXACT_CASES.items():
    KATA.add(2, _name, lambda ctx, name=_name, case=_case: check_case(ctx, name, case))


class GatedUnit(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        gate = torch.sigmoid(self.proj(x))
        value = torch.tanh(self.proj(x))
        return gate * value + F.gelu(self.proj(x))


@KATA.check(level=3)
def gated_unit_speedup(ctx: Context):
    model = GatedUnit(BENCHMARK_WIDTH).eval().to(ctx.device)
    baseline = fx.symbolic_trace(copy.deepcopy(model))
    candidate = fx.symbolic_trace(model)
    ctx.call(PASS, candidate, returns=int)
    assert_valid_graph_module(candidate, PASS)
    return assert_speedup(ctx, baseline, candidate,
                          lambda: (torch.randn(BENCHMARK_ROWS, BENCHMARK_WIDTH, device=ctx.device),),
                          SPEEDUP_THRESHOLDS, what="the gated unit after the pass",
                          hint="self.proj(x) is computed three times on the same x: a Linear module is pure, "
                               "so its calls merge into one.")


for _index in range(1, 6):
    KATA.add(4, f"model_{_index}",
             lambda ctx, index=_index: check_case(ctx, f"model_{index}", hidden_case(random.Random(ctx.seed))))
