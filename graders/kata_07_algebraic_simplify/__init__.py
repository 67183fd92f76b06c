"""Grader for kata 07: algebraic simplification (x*1, x/1, x-0, x**2, relu(relu(x)), cancelling permutes)."""
from __future__ import annotations

import copy
import operator
import random
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._pytree import tree_leaves, tree_map

from graders.core import CheckFailed, Context, Kata
from graders.models import nest_under, random_identifier
from graders.numerics import run_module
from graders.structure import assert_valid_graph_module, before_after
from graders.timing import assert_speedup

KATA = Kata("07_algebraic_simplify", api={
    "simplify": "simplify(gm: torch.fx.GraphModule, example_inputs: tuple) -> int (the number of rewrites applied)",
})

# The L3 benchmark: a config-driven residual model whose switched-off features (scale 1.0, temperature
# 1, shift 0.0, a doubled ReLU, a transposed-back view) leave four removable ops per block around the
# two real ones (relu, residual add). At 256x256 the tensors stay in cache, so the ratio is steady:
# reference median 3.0x-3.1x on CPU single-threaded, a no-op 1.00x-1.01x (README).
SPEEDUP_THRESHOLDS = {"cpu": 2.3, "cuda": 1.8}  # CUDA: not measured (no GPU here), launch-bound like CPU
BENCHMARK_BLOCKS, BENCHMARK_SHAPE = 4, (256, 256)

# Every special float value, so that a rewrite that is only "almost" an identity shows.
SPECIALS = [-0.0, 0.0, float("inf"), float("-inf"), float("nan"), 1.0, -1.0]


# ----------------------------------------------------------------------------------------------
# Inputs and the bit-exact comparison. Every rule of the table is exact, so the simplified module
# must reproduce the original's outputs bit for bit: same shape, dtype, NaN positions and sign bits.

def floats(*shape, dtype=torch.float32, device="cpu") -> torch.Tensor:
    """Random values with every special value at random positions (each at least once)."""
    values = torch.randn(*shape) * 3
    flat = values.view(-1)
    positions = torch.randperm(flat.numel())[: max(len(SPECIALS), flat.numel() // 5)]
    flat[positions] = torch.tensor(SPECIALS * (len(positions) // len(SPECIALS) + 1))[: len(positions)]
    return values.to(dtype=dtype, device=device)


def integers(*shape, device="cpu") -> torch.Tensor:
    return torch.randint(-9, 10, shape, device=device)


def bools(*shape, device="cpu") -> torch.Tensor:
    return torch.rand(*shape, device=device) < 0.5


def describe_difference(got: torch.Tensor, want: torch.Tensor) -> str | None:
    if got.shape != want.shape or got.dtype != want.dtype:
        return (f"the original returns shape {tuple(want.shape)} dtype {want.dtype}, the simplified module "
                f"shape {tuple(got.shape)} dtype {got.dtype}")
    same = (got == want) | (got.isnan() & want.isnan() if want.is_floating_point() else False)
    if want.is_floating_point():
        same &= (got.signbit() == want.signbit()) | (got.isnan() & want.isnan())
    if bool(same.all()):
        return None
    where = tuple(int(i) for i in (~same).nonzero()[0])
    g, w = got[where].item(), want[where].item()
    sign = " (the same value with the other sign bit: IEEE -0.0 vs +0.0)" if g == w else ""
    return (f"at index {where} the original gives {w!r}, the simplified module {g!r}{sign}; "
            f"{int((~same).sum())} of {same.numel()} elements differ")


def assert_bit_exact(pristine: Callable, gm: fx.GraphModule, inputs_list: list[tuple], *, before: fx.GraphModule,
                     hint: str) -> None:
    """Outputs bit for bit, on private copies of each input (a wrong rewrite may mutate an input)."""
    clone = lambda inputs: tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, inputs)  # noqa: E731
    for inputs in inputs_list:
        want = run_module(pristine, clone(inputs), "the original model")
        got = run_module(gm, clone(inputs), "the module after simplify")
        want_leaves, got_leaves = tree_leaves(want), tree_leaves(got)
        if len(got_leaves) != len(want_leaves):
            raise CheckFailed(f"the module after simplify returns {len(got_leaves)} values, the original "
                              f"{len(want_leaves)}.{before_after(before, gm)}")
        for index, (g, w) in enumerate(zip(got_leaves, want_leaves)):
            problem = describe_difference(g, w)
            if problem:
                shapes = ", ".join(f"{tuple(t.shape)} {t.dtype}" for t in inputs)
                raise CheckFailed(f"after simplify, output {index} is not bit-identical to the original's on inputs "
                                  f"[{shapes}] (which hold -0.0, inf and NaN): {problem}. Hint: {hint}"
                                  f"{before_after(before, gm)}")


# ----------------------------------------------------------------------------------------------
# Structure: which ops the graph computes, by one name per operation whatever its spelling.

ALIASES = {"truediv": "div", "true_divide": "div", "relu_": "relu"}


def op_name(node: fx.Node, modules: dict) -> str:
    if node.op == "call_module":
        name = type(modules[node.target]).__name__.lower()
    elif node.op == "call_function":
        name = getattr(node.target, "__name__", str(node.target))
    elif node.op == "get_attr":
        name = "get_attr"
    else:
        name = str(node.target)
    return ALIASES.get(name, name)


def computed_ops(gm: fx.GraphModule) -> Counter:
    modules = dict(gm.named_modules())
    return Counter(op_name(n, modules) for n in gm.graph.nodes if n.op not in ("placeholder", "output"))


def show(ops: Counter) -> str:
    return "[" + ", ".join(sorted(ops.elements())) + "]" if ops else "[] (nothing)"


def unread_nodes(gm: fx.GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes if n.op not in ("placeholder", "output") and not n.users]


def assert_structure(gm: fx.GraphModule, before: fx.GraphModule, expected_ops: Counter, rewrites: int,
                     expected_rewrites: int, hint: str) -> None:
    graphs = before_after(before, gm)
    dead = [name for name in unread_nodes(gm) if name not in unread_nodes(before)]  # y.add_(1) is unread, and stays
    if dead:
        raise CheckFailed(f"after simplify the graph still holds nodes nobody reads: {', '.join(dead)}. A rewrite "
                          "can leave its constant (torch.ones_like(x)) or the inner permute of a pair without "
                          f"users: erase those too.{graphs}")
    got_ops = computed_ops(gm)
    if got_ops != expected_ops:
        missing, extra = expected_ops - got_ops, got_ops - expected_ops
        raise CheckFailed(f"after simplify the graph computes {show(got_ops)}; expected {show(expected_ops)} "
                          f"(missing {show(missing)}, unexpected {show(extra)}). Hint: {hint}{graphs}")
    if isinstance(rewrites, bool) or rewrites != expected_rewrites:
        raise CheckFailed(f"simplify returned {rewrites!r}, but the rule table allows exactly {expected_rewrites} "
                          "rewrite(s) here: count one per rewrite (x**2 -> x*x is one, relu(relu(relu(x))) two).")


def check_graph(ctx: Context, gm: fx.GraphModule, make_inputs: Callable[[], tuple], expected_rewrites: int,
                kept_ops: Counter | None, hint: str) -> dict:
    """Run the learner's pass on `gm`; kept_ops None: nothing may change."""
    before, pristine = copy.deepcopy(gm), copy.deepcopy(gm)
    expected_ops = computed_ops(before) if kept_ops is None else kept_ops
    rewrites = ctx.call("simplify", gm, make_inputs(), returns=int)
    assert_valid_graph_module(gm, "simplify")
    assert_bit_exact(pristine, gm, [make_inputs() for _ in range(3)], before=before, hint=hint)
    assert_structure(gm, before, expected_ops, rewrites, expected_rewrites, hint)
    return {"rewrites": rewrites, "nodes_before": len(before.graph.nodes), "nodes_after": len(gm.graph.nodes)}


@dataclass
class Case:
    build: Callable  # a function or nn.Module to trace
    make_inputs: Callable[[torch.device], tuple]
    rewrites: int
    kept: list[str] | None  # the ops a correct pass leaves; None: the graph must stay as it is
    hint: str


def check_case(ctx: Context, case: Case) -> dict:
    built = case.build()
    model = built.to(ctx.device) if isinstance(built, nn.Module) else built
    kept = None if case.kept is None else Counter(case.kept)
    return check_graph(ctx, fx.symbolic_trace(model), lambda: case.make_inputs(ctx.device), case.rewrites, kept,
                       case.hint)


# ----------------------------------------------------------------------------------------------
# L1: the rules, each on its own, spelled the plainest way.

def identities(x):
    return torch.tanh(x * 1.0) + (1 * x / 1 - 0)


def relu_of_relu(x):
    return F.relu(torch.relu(x * 2.0)).relu()


def squares(x):
    return x ** 2 + torch.pow(x, 2)


def transposed_back(x):
    return x.transpose(1, 2).transpose(1, 2) * 3.0


def x3(*shape):
    return lambda device: (floats(3, *shape, device=device),)


L1_CASES = {
    "identities": Case(lambda: identities, x3(4, 5), 4, ["tanh", "add"],
                       "x * 1.0, 1 * x, x / 1 and x - 0 all return x: point their users at x and erase them."),
    "relu_of_relu": Case(lambda: relu_of_relu, x3(4, 5), 2, ["mul", "relu"],
                         "relu(relu(x)) is relu(x): point the outer relu's users at the inner relu."),
    "square": Case(lambda: squares, x3(4, 5), 2, ["mul", "mul", "add"],
                   "replace x ** 2 by a new node x * x (graph.inserting_before + graph.call_function)."),
    "double_transpose": Case(lambda: transposed_back, x3(4, 5), 1, ["mul"],
                             "x.transpose(1, 2).transpose(1, 2) is x: point the outer transpose's users at x."),
}


# ----------------------------------------------------------------------------------------------
# L2: other spellings, and every trap.

class Spellings(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = nn.ReLU()

    def forward(self, x):
        y = torch.mul(x.mul(1), True)
        y = torch.div(y.div(1.0), 1)
        y = torch.sub(y.sub(0), 0.0)
        y = self.act(F.relu(y))
        return torch.pow(y, 2.0) + y.pow(2)


def integer_identities(i):
    return (0 + (i + 0) * 1 - 0) // 2


def plus_negative_zero(x):
    return torch.sigmoid(x + -0.0) - 0.0


def half_precision(h):
    return (h * 1.0 / 1) ** 2


def ones_and_zeros_tensors(x):
    return (x * torch.ones_like(x) - torch.zeros_like(x)) + torch.ones(x.shape[-1]) * x


def inverse_permutes(x):
    return x.permute(1, 2, 0).permute(2, 0, 1) + torch.permute(x.permute(2, 0, 1), (1, 2, 0))


def negative_dims(x):
    return x.transpose(-1, -2).transpose(1, 2) - x.permute(0, -1, 1).permute(0, 2, -2)


def relu_chain_with_other_user(x):
    y = torch.relu(x)
    return F.relu(y.relu()) * y


def double_t(m):
    return m.t().t() + torch.t(torch.t(m)) * 2.0


def float_plus_zero(x):
    return x + 0.0, 0 + x, torch.add(x, 0), x - -0.0


def times_zero(x):
    return x * 0, 0.0 * x, x * False


def x_over_x(x):
    return x / x, x - x


def exp_of_log(x):
    return torch.exp(torch.log(x)), torch.log(torch.exp(x))


def broadcast(x, y):
    return x * torch.ones_like(y), x - torch.zeros_like(y), torch.ones(y.shape) * x


def dtype_promotion(i, b, h):
    return i * 1.0, i / 1, b * 1, h * torch.ones(h.shape[-1]), i ** 2.0


class ParameterEqualToOne(nn.Module):
    def __init__(self):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(5))
        self.register_buffer("offset", torch.zeros(5))

    def forward(self, x):
        return x * self.gain - self.offset


def same_permute_twice(x):
    return x.permute(1, 2, 0).permute(1, 2, 0), x.transpose(0, 1).transpose(1, 2)


def div_with_rounding_mode(x):
    return torch.div(x, 1, rounding_mode="floor"), torch.div(x, 1, rounding_mode="trunc"), x // 1


def in_place_on_result(x):
    y = x * 1.0
    y.add_(1.0)
    return x - y


def other_repeated_ops(x):
    return torch.sigmoid(torch.sigmoid(x)), torch.tanh(x).tanh(), F.gelu(F.gelu(x))


def two_inputs(shape_x, shape_y):
    return lambda device: (floats(*shape_x, device=device), floats(*shape_y, device=device))


NOT_SAFE = "this rewrite is not exact for every input: leave the node alone."
L2_CASES = {
    "spellings": Case(Spellings, x3(4, 5), 9, ["relu", "mul", "mul", "add"],
                      "the same op has several spellings: operator.mul, torch.mul, Tensor.mul (call_method 'mul'), "
                      "and ReLU also nn.ReLU (call_module); True is a literal 1 too."),
    "integer_identities": Case(lambda: integer_identities, lambda d: (integers(3, 4, device=d),), 4, ["floordiv"],
                               "for integer tensors x + 0 is exact (there is no -0 among integers)."),
    "plus_negative_zero": Case(lambda: plus_negative_zero, x3(4, 5), 2, ["sigmoid"],
                               "x + (-0.0) returns x for every x, -0.0 included: -0.0 + -0.0 = -0.0."),
    "half_precision": Case(lambda: half_precision, lambda d: (floats(3, 4, 5, dtype=torch.float16, device=d),),
                           3, ["mul"], "a Python scalar does not promote a float16 tensor: h * 1.0 is still float16."),
    "ones_and_zeros_tensors": Case(lambda: ones_and_zeros_tensors, x3(4, 5), 3, ["add"],
                                   "a tensor of ones (torch.ones_like, torch.ones(...) in forward) is a literal 1 "
                                   "too, when the result keeps x's shape and dtype; erase it once unused."),
    "inverse_permutes": Case(lambda: inverse_permutes, x3(4, 5), 2, ["add"],
                             "permute(1, 2, 0) then permute(2, 0, 1) is the identity: compose the two "
                             "permutations (output dim i reads inner dim q[i], which reads input dim p[q[i]])."),
    "negative_dims": Case(lambda: negative_dims, x3(4, 5), 2, ["sub"],
                          "dim -1 of a rank-3 tensor is dim 2: normalise dims with d % rank before comparing."),
    "relu_chain_with_other_user": Case(lambda: relu_chain_with_other_user, x3(4, 5), 2, ["relu", "mul"],
                                       "relu(relu(relu(x))) is relu(x), even when the inner relu has other users."),
    "double_t": Case(lambda: double_t, lambda d: (floats(4, 6, device=d),), 2, ["mul", "add"],
                     "m.t().t() and torch.t(torch.t(m)) are m."),
    "float_plus_zero": Case(lambda: float_plus_zero, x3(4, 5), 0, None,
                            "x + 0.0 is not x for floats: -0.0 + 0.0 = +0.0 (the sign bit flips), and x - (-0.0) "
                            "is x + 0.0. Only x - 0 and x + (-0.0) are exact for floats."),
    "times_zero": Case(lambda: times_zero, x3(4, 5), 0, None,
                       "x * 0 is not 0 for floats: inf * 0 and NaN * 0 are NaN, -3.0 * 0 is -0.0."),
    "x_over_x": Case(lambda: x_over_x, x3(4, 5), 0, None, "x / x is NaN where x is 0, inf or NaN; x - x where x is inf."),
    "exp_of_log": Case(lambda: exp_of_log, x3(4, 5), 0, None,
                       "log of a negative number is NaN, exp overflows to inf above 88, and even for positive x "
                       "exp(log(x)) rounds to a neighbour of x: " + NOT_SAFE),
    "broadcasting": Case(lambda: broadcast, two_inputs((5,), (4, 5)), 0, None,
                         "x of shape (5,) times ones of shape (4, 5) has shape (4, 5), not x's: compare the "
                         "node's shape with x's (ShapeProp) before rewriting."),
    "dtype_promotion": Case(lambda: dtype_promotion,
                            lambda d: (integers(3, 5, device=d), bools(3, 5, device=d),
                                       floats(3, 5, dtype=torch.float16, device=d)), 0, None,
                            "int * 1.0 and int / 1 are float tensors, bool * 1 is int64, float16 times a float32 "
                            "tensor of ones is float32, int ** 2.0 is float: compare the node's dtype with x's."),
    "parameter_equal_to_one": Case(ParameterEqualToOne, x3(4, 5), 0, None,
                                   "a parameter or buffer that holds ones today is state: training or "
                                   "load_state_dict changes it. Only literals fold; a get_attr never does."),
    "same_permute_twice": Case(lambda: same_permute_twice, x3(4, 5), 0, None,
                               "permute(1, 2, 0) twice is permute(2, 0, 1), not the identity: compose, don't compare."),
    "div_with_rounding_mode": Case(lambda: div_with_rounding_mode, x3(4, 5), 0, None,
                                   "torch.div(x, 1, rounding_mode='floor') is floor(x): a call with extra keyword "
                                   "arguments is another operation."),
    "in_place_on_result": Case(lambda: in_place_on_result, x3(4, 5), 0, None,
                               "y = x * 1.0 is a new tensor; y.add_(1.0) mutates it. Replace y by x and add_ "
                               "mutates x. Skip a rewrite when an in-place op (name ending in '_', inplace=True) "
                               "uses the node or its replacement."),
    "other_repeated_ops": Case(lambda: other_repeated_ops, x3(4, 5), 0, None,
                               "only relu is idempotent here: sigmoid(sigmoid(x)), tanh(tanh(x)) and gelu(gelu(x)) "
                               "are not sigmoid(x), tanh(x), gelu(x)."),
}


# ----------------------------------------------------------------------------------------------
# L3: a model whose config switches features off, leaving identities everywhere.

class ConfigBlock(nn.Module):
    def __init__(self, scale=1.0, temperature=1, shift=0.0):
        super().__init__()
        self.scale, self.temperature, self.shift = scale, temperature, shift  # plain floats: literals when traced
        self.act = nn.ReLU()

    def forward(self, x):
        h = F.relu(self.act(x * self.scale / self.temperature - self.shift))
        return x + h.transpose(-1, -2).transpose(-1, -2)


# ----------------------------------------------------------------------------------------------
# L4: graphs generated from the seed, built node by node with random spellings, names and shapes.

# What each step leaves producing the chain's value; the identity steps and side traps leave the previous one.
SURVIVOR = {"relu_chain": "relu", "same_permute_twice": "permute", "square": "mul", "scale_shift": "add",
            "parameter_one": "mul"}
KIND_OP = {"relu_chain": "relu", "inverse_permute": "permute", "same_permute_twice": "permute"}


class HiddenBuilder:
    def __init__(self, rng: random.Random):
        self.rng, self.root, self.graph = rng, nn.Module(), fx.Graph()
        self.rewrites, self.kept, self.side_outputs = 0, Counter(), []
        self.last_survivor = "placeholder"  # the op that produces the chain's value once simplified

    def binary(self, name: str, x, literal, literal_first=False):
        """x <op> literal in one of its spellings."""
        functions = {"mul": (operator.mul, torch.mul), "div": (operator.truediv, torch.div),
                     "add": (operator.add, torch.add), "sub": (operator.sub, torch.sub),
                     "pow": (operator.pow, torch.pow)}[name]
        if literal_first:
            return self.graph.call_function(functions[0], (literal, x))
        spelling = self.rng.randrange(3)
        if spelling == 2:
            return self.graph.call_method(name, (x, literal))
        return self.graph.call_function(functions[spelling], (x, literal))

    def relu(self, x, spelling: int):
        if spelling == 0:  # an nn.ReLU nested in containers, as in real models
            path = ".".join(random_identifier(self.rng) for _ in range(self.rng.randint(2, 3)))
            while any(path == p or path.startswith(p + ".") or p.startswith(path + ".")
                      for p, _ in self.root.named_modules() if p):
                path = random_identifier(self.rng)
            nest_under(self.root, path, nn.ReLU())
            return self.graph.call_module(path, (x,))
        if spelling == 1:
            return self.graph.call_method("relu", (x,))
        return self.graph.call_function((torch.relu, F.relu)[spelling - 2], (x,))

    def permute(self, x, dims):
        if self.rng.random() < 0.5:
            return self.graph.call_method("permute", (x, *dims))
        return self.graph.call_function(torch.permute, (x, tuple(dims)))

    def step(self, x, shape: list[int]):
        rng, g = self.rng, self.graph
        kind = rng.choice(["mul_one", "div_one", "sub_zero", "add_neg_zero", "square", "relu_chain",
                           "relu_chain", "inverse_permute", "ones_like", "scale_shift", "scale_shift", "parameter_one",
                           "same_permute_twice", "side_trap"])
        # Once the identities in between are gone, two relu chains or two permute steps would meet and
        # cancel across steps: the expected counts below would be wrong. Keep them apart.
        while kind in ("relu_chain", "inverse_permute", "same_permute_twice") and KIND_OP[kind] == self.last_survivor:
            kind = rng.choice(["scale_shift", "square", "parameter_one"])
        self.last_survivor = SURVIVOR.get(kind, self.last_survivor)
        if kind in ("mul_one", "div_one", "sub_zero", "add_neg_zero", "ones_like"):
            self.rewrites += 1
            if kind == "mul_one":
                return self.binary("mul", x, rng.choice([1, 1.0]), literal_first=rng.random() < 0.3)
            if kind == "div_one":
                return self.binary("div", x, rng.choice([1, 1.0]))
            if kind == "sub_zero":
                return self.binary("sub", x, rng.choice([0, 0.0]))
            if kind == "add_neg_zero":
                return self.binary("add", x, -0.0)
            return self.binary("mul", x, g.call_function(torch.ones_like, (x,)))
        if kind == "square":
            self.rewrites += 1
            self.kept["mul"] += 1
            return self.binary("pow", x, rng.choice([2, 2.0]))
        if kind == "relu_chain":
            count = rng.randint(2, 3)
            self.rewrites += count - 1
            self.kept["relu"] += 1
            spellings = [0] + [rng.randrange(4) for _ in range(count - 1)]  # at least one nn.ReLU
            rng.shuffle(spellings)
            for spelling in spellings:
                x = self.relu(x, spelling)
            return x
        if kind == "inverse_permute":
            p = list(range(len(shape)))
            while p == sorted(p):
                rng.shuffle(p)
            inverse = [p.index(i) for i in range(len(p))]
            negative = [d - len(p) if rng.random() < 0.3 else d for d in inverse]  # -1 is the last dim
            self.rewrites += 1
            return self.permute(self.permute(x, p), negative)
        if kind == "scale_shift":
            self.kept.update(["mul", "add"])
            scale, shift = rng.choice([0.5, 0.75, 1.25, 1.5, -2.0]), rng.choice([-0.5, 0.25, 0.75, 1.5])
            return self.binary("add", self.binary("mul", x, scale), shift)
        if kind == "parameter_one":
            name = random_identifier(self.rng)
            while hasattr(self.root, name):
                name = random_identifier(self.rng)
            setattr(self.root, name, nn.Parameter(torch.ones(shape[-1])))
            self.kept.update(["get_attr", "mul"])
            return self.binary("mul", x, g.get_attr(name))
        if kind == "same_permute_twice":
            cycle = rng.choice([[1, 2, 0], [2, 0, 1]])
            self.kept["permute"] += 2
            shape[:] = [shape[cycle[cycle[i]]] for i in range(3)]
            return self.permute(self.permute(x, cycle), cycle)
        # side_trap: an unsafe rewrite whose result is an extra output, so its NaNs stay out of the chain
        trap = rng.choice(["plus_zero", "times_zero", "x_over_x", "exp_log", "minus_neg_zero"])
        if trap == "exp_log":
            self.kept.update(["exp", "log"])
            self.side_outputs.append(g.call_function(torch.exp, (g.call_function(torch.log, (x,)),)))
        elif trap == "x_over_x":
            self.kept["div"] += 1
            self.side_outputs.append(self.binary("div", x, x))
        else:
            name, literal = {"plus_zero": ("add", 0.0), "times_zero": ("mul", 0), "minus_neg_zero": ("sub", -0.0)}[trap]
            self.kept[name] += 1
            self.side_outputs.append(self.binary(name, x, literal))
        return x


def hidden_graph(rng: random.Random) -> tuple[fx.GraphModule, list[int], int, Counter]:
    builder = HiddenBuilder(rng)
    shape = [rng.choice([2, 3]), *rng.sample([3, 4, 5, 6, 7], 2)]
    x = builder.graph.placeholder(random_identifier(rng))
    input_shape = list(shape)
    for _ in range(rng.randint(6, 10)):
        x = builder.step(x, shape)
    builder.graph.output((x, *builder.side_outputs) if builder.side_outputs else x)
    gm = fx.GraphModule(builder.root, builder.graph)
    return gm, input_shape, builder.rewrites, builder.kept


def check_hidden(ctx: Context) -> dict:
    gm, shape, rewrites, kept = hidden_graph(random.Random(ctx.seed))
    return check_graph(ctx, gm.to(ctx.device), lambda: (floats(*shape, device=ctx.device),), rewrites, kept,
                       "the pass must work for every spelling of the rule table's ops and refuse every unsafe one.")


# ----------------------------------------------------------------------------------------------
# Checks

for _level, _cases in ((1, L1_CASES), (2, L2_CASES)):
    for _name, _case in _cases.items():
        KATA.add(_level, _name, lambda ctx, case=_case: check_case(ctx, case))


@KATA.check(level=3)
def switched_off_features_speedup(ctx: Context):
    model = nn.Sequential(*(ConfigBlock() for _ in range(BENCHMARK_BLOCKS))).to(ctx.device)
    baseline, candidate = fx.symbolic_trace(copy.deepcopy(model)), fx.symbolic_trace(model)
    make_inputs = lambda: (torch.randn(*BENCHMARK_SHAPE, device=ctx.device),)  # noqa: E731
    ctx.call("simplify", candidate, make_inputs(), returns=int)
    assert_valid_graph_module(candidate, "simplify")
    return assert_speedup(ctx, baseline, candidate, make_inputs, SPEEDUP_THRESHOLDS,
                          what="the simplified config-driven model",
                          hint="each block computes one real relu; x * 1.0, / 1, - 0.0, the second relu and the "
                               "transpose pair are all removable.")


for _index in range(1, 6):
    KATA.add(4, f"model_{_index}", check_hidden)
