"""Kata 07's graded models: the rule table case by case, the L3 config-driven model, the hidden generator.

Every float input holds -0.0, +0.0, inf, -inf and NaN at random positions and every comparison is bit for
bit, so a rewrite that is only "almost" an identity shows."""
from __future__ import annotations

from typing import Callable

import copy
import operator
from collections import Counter

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from graders.run import Case, Program, nest_under, random_identifier

SPECIALS = [-0.0, 0.0, float("inf"), float("-inf"), float("nan"), 1.0, -1.0]


def floats(*shape, dtype=torch.float32) -> torch.Tensor:
    """Random values with every special value at random positions (each at least once)."""
    values = torch.randn(*shape).view(-1) * 3
    positions = torch.randperm(values.numel())[: max(len(SPECIALS), values.numel() // 5)]
    values[positions] = torch.tensor(SPECIALS * len(positions))[: len(positions)]
    return values.view(shape).to(dtype)


def cases(*rows) -> dict[str, Case]:
    """The model is a function, or an nn.Module each check traces a fresh copy of; the input, unless given, one
    float tensor of shape (3, 4, 5). The batch is always 3: simplify specialises to its example inputs' shapes.
    A row may end with `optional`: rewrites the table allows but does not ask for (CONVERSIONS)."""
    return {name: Case(lambda model=model: copy.deepcopy(model) if isinstance(model, nn.Module) else model,
                       inputs[0] if inputs else lambda batch: (floats(batch, 4, 5),), (rewrites, kept), hint,
                       compare="bit_exact", batch_sizes=(3,), samples=3,
                       extra={"optional": inputs[1]} if len(inputs) > 1 else {},
                       cpu_only=CPU_ONLY.get(name, ""))
            for name, model, rewrites, kept, hint, *inputs in rows}


# Zoo models that cannot run on a GPU, and why: their cases are graded on the CPU whatever the device.
CPU_ONLY = {"plain_tensor_of_ones": "plain tensor attributes (and torch.ones(5) in the forward) stay on the CPU "
                                    "when the module moves: .to(device) moves parameters and buffers only"}


# Optional rewrites: the ops each takes away and the ops it leaves instead. `int * 1.0` may become
# `x.to(torch.float32)` (exact: the op converts x, then multiplies by 1.0), as Inductor's remove_no_ops does.
def conversion(*removed: str) -> tuple[Counter, Counter]:
    return Counter(removed), Counter(["to"])


# L1: the rules one by one, plainly spelled. A row: name, model, rewrites allowed, ops left (None: unchanged), hint.
L1_CASES = cases(
    ("identities", lambda x: torch.tanh(x * 1.0) + (1 * x / 1 - 0), 4, ["tanh", "add"],
     "x * 1.0, 1 * x, x / 1 and x - 0 all return x: point their users at x and erase them."),
    ("relu_of_relu", lambda x: F.relu(torch.relu(x * 2.0)).relu(), 2, ["mul", "relu"],
     "relu(relu(x)) is relu(x): point the outer relu's users at the inner relu."),
    ("square", lambda x: x ** 2 + torch.pow(x, 2), 2, ["mul", "mul", "add"],
     "replace x ** 2 by a new node x * x (graph.inserting_before + graph.call_function)."),
    ("double_transpose", lambda x: x.transpose(1, 2).transpose(1, 2) * 3.0, 1, ["mul"],
     "x.transpose(1, 2).transpose(1, 2) is x: point the outer transpose's users at x."),
)


# L2: other spellings, and every trap. A model with state is a Program (graders/models.py).
def spellings(m, x):
    y = torch.div(torch.mul(x.mul(1), True).div(1.0), 1)
    y = m.act(F.relu(torch.sub(y.sub(0), 0.0)))
    return torch.pow(y, 2.0) + y.pow(2)


def in_place_on_replacement(x):
    s = x * 2.0
    y = s * 1.0   # a copy of s, taken before the write
    s.add_(1.0)
    return y - s


class PlainOnes(nn.Module):  # tensor attributes that are no parameter: the GraphModule holds them as buffers
    def __init__(self):
        super().__init__()
        self.unit, self.wide = torch.ones(3, 4, 5), torch.ones(2, 3, 4, 5)

    def forward(self, x):
        return x * self.unit, x * torch.ones(5), self.wide * x


def in_place_on_result(x):
    y = x * 1.0
    y.add_(1.0)
    return x - y


def written_through_out(x):
    y = x * 1.0
    torch.mul(x, 2.0, out=y)  # writes y: replace y by x and this writes x, the caller's input
    return y


def in_place_through_views(x):
    y = x * 1.0
    y.view(-1)[:2].add_(1.0)  # writes y through a view of a view: replace y by x and this writes x
    s = x * 2.0
    z = s * 1.0               # a copy of s, taken before the write through s[0]
    s[0].mul_(3.0)
    return x - y, z - s


def complex_numbers() -> Callable:
    """A complex tensor with inf, nan and signed zeros in both parts."""
    def draw(batch):
        return (torch.complex(floats(batch, 4, 5), floats(batch, 4, 5)),)
    return draw


L2_CASES = cases(
    ("spellings", Program(spellings, act=nn.ReLU()), 9, ["relu", "mul", "mul", "add"],
     "the same op has several spellings: operator.mul, torch.mul, Tensor.mul (call_method 'mul'), and ReLU also "
     "nn.ReLU (call_module); True is a literal 1 too."),
    ("integer_identities", lambda i: (0 + (i + 0) * 1 - 0) // 2, 4, ["floordiv"],
     "for integer tensors x + 0 is exact (there is no -0 among integers).",
     lambda batch: (torch.randint(-9, 10, (batch, 4)),)),
    ("plus_negative_zero", lambda x: torch.sigmoid(x + -0.0) - 0.0, 2, ["sigmoid"],
     "x + (-0.0) returns x for every x, -0.0 included: -0.0 + -0.0 = -0.0."),
    ("half_precision", lambda h: (h * 1.0 / 1) ** 2, 3, ["mul"],
     "a Python scalar does not promote a float16 tensor: h * 1.0 is still float16.",
     lambda batch: (floats(batch, 4, 5, dtype=torch.float16),)),
    ("ones_and_zeros_tensors",
     lambda x: (x * torch.ones_like(x) - torch.zeros_like(x)) + torch.ones(x.shape[-1], device=x.device) * x, 3,
     ["add"], "a tensor of ones (torch.ones_like, torch.ones(...) in forward) is a literal 1 too, when the result "
              "keeps x's shape and dtype; erase it once unused."),
    ("inverse_permutes", lambda x: x.permute(1, 2, 0).permute(2, 0, 1) + torch.permute(x.permute(2, 0, 1), (1, 2, 0)),
     2, ["add"], "permute(1, 2, 0) then permute(2, 0, 1) is the identity: compose the two permutations (output dim "
                 "i reads inner dim q[i], which reads input dim p[q[i]])."),
    ("negative_dims", lambda x: x.transpose(-1, -2).transpose(1, 2) - x.permute(0, -1, 1).permute(0, 2, -2), 2,
     ["sub"], "dim -1 of a rank-3 tensor is dim 2: normalise dims with d % rank before comparing."),
    ("relu_chain_with_other_user", lambda x: F.relu((y := torch.relu(x)).relu()) * y, 2, ["relu", "mul"],
     "relu(relu(relu(x))) is relu(x), even when the inner relu has other users."),
    ("double_t", lambda m: m.t().t() + torch.t(torch.t(m)) * 2.0, 2, ["mul", "add"],
     "m.t().t() and torch.t(torch.t(m)) are m.", lambda batch: (floats(4, 6),)),
    # Left alone: each of these looks like an identity and is not one for some input.
    ("float_plus_zero", lambda x: (x + 0.0, 0 + x, torch.add(x, 0), x - -0.0), 0, None,
     "x + 0.0 is not x for floats: -0.0 + 0.0 = +0.0 (the sign bit flips), and x - (-0.0) is x + 0.0. Only x - 0 "
     "and x + (-0.0) are exact for floats."),
    ("times_zero", lambda x: (x * 0, 0.0 * x, x * False), 0, None,
     "x * 0 is not 0 for floats: inf * 0 and NaN * 0 are NaN, -3.0 * 0 is -0.0."),
    ("x_over_x", lambda x: (x / x, x - x), 0, None, "x / x is NaN where x is 0, inf or NaN; x - x where x is inf."),
    ("exp_of_log", lambda x: (torch.exp(torch.log(x)), torch.log(torch.exp(x))), 0, None,
     "log of a negative number is NaN, exp overflows to inf above 88, and even for positive x exp(log(x)) rounds "
     "to a neighbour of x: this rewrite is not exact for every input: leave the node alone."),
    ("broadcasting",
     lambda x, y: (x * torch.ones_like(y), x - torch.zeros_like(y), torch.ones(y.shape, device=y.device) * x), 0,
     None, "x of shape (5,) times ones of shape (4, 5) has shape (4, 5), not x's: compare the node's shape with "
           "x's (ShapeProp) before rewriting.", lambda batch: (floats(5), floats(4, 5))),
    ("broadcasting_same_rank",
     lambda x, y: (x * torch.ones_like(y), torch.ones(y.shape, device=y.device) * x, x / torch.ones_like(y)), 0,
     None, "x of shape (3, 1, 5) times ones of shape (3, 4, 5) has shape (3, 4, 5): the same rank is not the same "
           "shape. Compare the whole shape.", lambda batch: (floats(batch, 1, 5), floats(batch, 4, 5))),
    ("dtype_promotion",
     lambda i, b, h: (i * 1.0, i / 1, b * 1, h * torch.ones(h.shape[-1], device=h.device), i ** 2.0), 0, None,
     "int * 1.0 and int / 1 are float tensors, bool * 1 is int64, float16 times a float32 tensor of ones is "
     "float32, int ** 2.0 is float: compare the node's dtype with x's. Leave them, or replace one by "
     "x.to(node's dtype), which is exact; never by x itself.",
     lambda batch: (torch.randint(-9, 10, (batch, 5)), torch.rand(batch, 5) < 0.5, floats(batch, 5, dtype=torch.half)),
     [conversion("mul"), conversion("truediv"), conversion("mul"),
      conversion("mul", "ones", "getattr", "getattr", "getitem")]),
    ("plain_tensor_of_ones", PlainOnes(), 0, None,
     "a tensor attribute that is no parameter (self.unit = torch.ones(...), or torch.ones(5) with literal sizes, "
     "which the tracer stores as _tensor_constant0) is still a get_attr, not a literal: the module may reassign it "
     "(gm.unit = ...) and the graph would have forgotten it. x * self.wide also broadcasts x to a larger shape."),
    ("parameter_equal_to_one", Program(lambda m, x: x * m.gain - m.offset, gain=nn.Parameter(torch.ones(5)),
                                       offset=torch.zeros(5)), 0, None,
     "a parameter or buffer that holds ones today is state: training or load_state_dict changes it. Only literals "
     "fold; a get_attr never does."),
    ("parameter_of_inputs_shape", Program(lambda m, x: x * m.gain - m.offset, gain=nn.Parameter(torch.ones(3, 4, 5)),
                                          offset=torch.zeros(3, 4, 5)), 0, None,
     "a parameter of ones with x's very shape is still state, not a literal: a get_attr never folds, whatever its "
     "shape or value."),
    # A cube: on (3, 4, 5) every permutation but the identity changes the shape, and the shape check alone would
    # refuse a pair that does not cancel, however the pass composed it.
    ("same_permute_twice", lambda x: (x.permute(1, 2, 0).permute(1, 2, 0), x.transpose(0, 1).transpose(1, 2)), 0,
     None, "permute(1, 2, 0) twice is permute(2, 0, 1), and transpose(0, 1) then transpose(1, 2) is permute(1, 2, 0): "
           "neither is the identity, though on this 3x3x3 input both keep x's shape. Compose the two permutations "
           "(a transpose undoes only a transpose of the same two dims); don't compare them.",
     lambda batch: (floats(3, 3, 3),)),
    ("div_with_rounding_mode",
     lambda x: (torch.div(x, 1, rounding_mode="floor"), torch.div(x, 1, rounding_mode="trunc"), x // 1), 0, None,
     "torch.div(x, 1, rounding_mode='floor') is floor(x): a call with extra keyword arguments is another operation."),
    ("reversed_operands", lambda x: (1 / x, 0 - x, 1.0 / x, torch.ones_like(x) / x, torch.zeros_like(x) - x), 0,
     None, "/ and - do not commute: 1 / x is the reciprocal and 0 - x the negation, not x. Only x / 1 and x - 0 "
           "are identities; 1 * x, 0 + x and -0.0 + x are, since * and + commute."),
    ("in_place_on_replacement", in_place_on_replacement, 0, None,
     "y = s * 1.0 is a copy of s taken before s.add_(1.0) writes s. Replace y by s and y reads the written value: "
     "skip a rewrite when an in-place op uses the node or its replacement (Inductor's remove_no_ops: is_mutated)."),
    ("permute_pair_with_other_user",
     lambda x: ((y := x.transpose(1, 2)).transpose(1, 2) * 2.0, y.relu()), 1, ["transpose", "mul", "relu"],
     "x.transpose(1, 2).transpose(1, 2) is x, but the inner transpose is also read by y.relu(): point the outer "
     "node's users at x and keep the inner one for its other users (erase a node only once it has no users)."),
    ("in_place_through_a_view", in_place_through_views, 0, None,
     "y.view(-1)[:2].add_(1.0) writes y though no user of y is in place: a view shares its base's memory. Follow "
     "every view (view, getitem, t, ...) of the node and of its replacement to the ops that use it.", ),
    ("complex_identities", lambda c: (c * 1, c / 1.0, torch.ones_like(c) * c, c + 0, c + 0.0), 0, None,
     "for a complex tensor, * 1 multiplies by 1+0j: inf+0j becomes inf+nanj and a -0.0 real part +0.0; + 0 adds "
     "0+0j, which flips the sign of a -0.0 part. A complex tensor is not an integer one: leave these alone.",
     complex_numbers()),
    ("bool_squared", lambda b: (b ** 2, torch.pow(b, 2)), 0, None,
     "a bool tensor ** 2 is int64 (True ** 2 is 1), but b * b stays bool: compare the node's dtype with x's before "
     "squaring by a multiplication.", lambda batch: (torch.rand(batch, 4, 5) < 0.5,)),
    ("in_place_on_result", in_place_on_result, 0, None,
     "y = x * 1.0 is a new tensor; y.add_(1.0) mutates it. Replace y by x and add_ mutates x. Skip a rewrite when "
     "an in-place op (name ending in '_', inplace=True) uses the node or its replacement."),
    ("written_through_out", written_through_out, 0, None,
     "torch.mul(x, 2.0, out=y) writes its result into y: a call with out= writes that tensor as an in-place op "
     "writes its self. Replace y by x and the call writes x, the caller's input."),
    ("other_repeated_ops", lambda x: (torch.sigmoid(torch.sigmoid(x)), torch.tanh(x).tanh(), F.gelu(F.gelu(x))), 0,
     None, "only relu is idempotent here: sigmoid(sigmoid(x)), tanh(tanh(x)) and gelu(gelu(x)) are not sigmoid(x), "
           "tanh(x), gelu(x)."),
    ("relu_lookalikes",  # "relu" in their names, and not relu
     Program(lambda m, x: (F.relu6(F.relu(x)), torch.relu(F.leaky_relu(x, 0.1)), m.clip(x.relu()), m.leaky(x).relu()),
             clip=nn.ReLU6(), leaky=nn.LeakyReLU(0.1)), 0, None,
     "relu6 and leaky_relu are not relu, whatever their names: relu6(relu(x)) clips at 6 and relu(leaky_relu(x)) "
     "zeroes the negatives leaky_relu keeps. Know relu by its function, method or module, never by its name."),
)


# L3: a model whose config switches features off (scale 1.0, temperature 1, shift 0.0: plain values, so
# literals when traced), leaving identities everywhere. At 256x256 the tensors stay in cache: the ratio is steady.
def config_block(m, x):
    h = F.relu(m.act(x * m.scale / m.temperature - m.shift))
    return x + h.transpose(-1, -2).transpose(-1, -2)


BENCHMARK = Case(lambda: nn.Sequential(*(Program(config_block, scale=1.0, temperature=1, shift=0.0, act=nn.ReLU())
                                         for _ in range(4))), lambda batch: (torch.randn(256, 256),), batch_sizes=(1,))


# L4: graphs generated from the seed, built node by node: 6-10 random steps on one chain, in random
# spellings, names and shapes. Unsafe rewrites hang off the chain as extra outputs, so their NaNs stay out.
BINARY = {"mul": (operator.mul, torch.mul), "div": (operator.truediv, torch.div), "add": (operator.add, torch.add),
          "sub": (operator.sub, torch.sub), "pow": (operator.pow, torch.pow)}
# kind: (the rewrites a correct pass makes, the ops it leaves, the step: (builder, chain value) -> new value).
# Relu chains and permute pairs start with a real scale, so that two of them never meet across steps once
# the identities between them are gone (they would cancel, and the expected counts would be wrong).
STEPS = {
    "mul_one": (1, [], lambda b, x: b.binary("mul", x, b.rng.choice([1, 1.0]), literal_first=b.rng.random() < 0.3)),
    "div_one": (1, [], lambda b, x: b.binary("div", x, b.rng.choice([1, 1.0]))),
    "sub_zero": (1, [], lambda b, x: b.binary("sub", x, b.rng.choice([0, 0.0]))),
    "add_neg_zero": (1, [], lambda b, x: b.binary("add", x, -0.0)),
    "ones_like": (1, [], lambda b, x: b.binary("mul", x, b.graph.call_function(torch.ones_like, (x,)))),
    "square": (1, ["mul"], lambda b, x: b.binary("pow", x, b.rng.choice([2, 2.0]))),
    "scale_shift": (0, ["mul", "add"], lambda b, x: b.binary("add", b.scale(x), b.rng.choice([-0.5, 0.25, 0.75, 1.5]))),
    "parameter_one": (0, ["get_attr", "mul"], lambda b, x: b.binary("mul", x, b.parameter_of_ones())),  # state
    "tensor_of_ones": (0, ["get_attr", "mul"], lambda b, x: b.binary("mul", x, b.tensor_of_ones())),  # an attribute
    "copy_then_write": (0, ["mul", "mul", "add_"], lambda b, x: b.copy_then_write(x)),
    "relu_chain": (0, ["mul", "relu"], lambda b, x: b.relu_chain(b.scale(x))),  # books 1 or 2 rewrites itself
    "inverse_permute": (1, ["mul"], lambda b, x: b.permute_pair(b.scale(x), cancelling=True)),
    "same_permute_twice": (0, ["mul"], lambda b, x: b.permute_pair(b.scale(x), cancelling=False)),  # books its pair
    "plus_zero": (0, ["add"], lambda b, x: b.side(x, b.binary("add", x, 0.0))),
    "minus_negative_zero": (0, ["sub"], lambda b, x: b.side(x, b.binary("sub", x, -0.0))),
    "one_over_x": (0, ["div"], lambda b, x: b.side(x, b.binary("div", x, b.rng.choice([1, 1.0]), literal_first=True))),
    "zero_minus_x": (0, ["sub"], lambda b, x: b.side(x, b.binary("sub", x, b.rng.choice([0, 0.0]), literal_first=True))),
    "times_zero": (0, ["mul"], lambda b, x: b.side(x, b.binary("mul", x, 0))),
    "x_over_x": (0, ["div"], lambda b, x: b.side(x, b.binary("div", x, x))),
    "exp_of_log": (0, ["exp", "log"], lambda b, x: b.side(x, b.call(torch.exp, b.call(torch.log, x)))),
}
KINDS = [*STEPS, "scale_shift", "relu_chain"]  # those two twice as often
# Steps that leave the chain's value as it was once a correct pass is done: the identities (with the ops each
# rewrite takes away) and the traps that hang off the chain.
IDENTITIES = {"mul_one": ["mul"], "div_one": ["div"], "sub_zero": ["sub"], "add_neg_zero": ["add"],
              "ones_like": ["mul", "ones_like"]}
TRAPS = {"plus_zero", "minus_negative_zero", "one_over_x", "zero_minus_x", "times_zero", "x_over_x", "exp_of_log"}


class HiddenBuilder:
    """Appends random steps to a graph, booking the rewrites a correct pass makes and the ops it leaves."""

    def __init__(self, rng, shape: list[int]):
        self.rng, self.shape, self.root, self.graph = rng, shape, nn.Module(), fx.Graph()
        self.rewrites, self.kept, self.side_outputs, self.paths = 0, Counter(), [], 0
        self.inner_permute_returned = False  # permute_pair: the inner permute of the last pair is an output

    def call(self, function, *args):
        return self.graph.call_function(function, args)

    def binary(self, name: str, x, other, literal_first=False):
        """x <op> other as the operator, the torch function or the method (other <op> x: the operator)."""
        spelling = 0 if literal_first else self.rng.randrange(3)
        if spelling == 2:
            return self.graph.call_method(name, (x, other))
        return self.call(BINARY[name][spelling], *((other, x) if literal_first else (x, other)))

    def scale(self, x):
        return self.binary("mul", x, self.rng.choice([0.5, 0.75, 1.25, 1.5, -2.0]))

    def side(self, x, trap):
        self.side_outputs.append(trap)
        return x

    def fresh_path(self, parts: int) -> str:
        """Random names, numbered so that no two paths share their first part."""
        self.paths += 1
        first = f"{random_identifier(self.rng)}{self.paths}"
        return ".".join([first] + [random_identifier(self.rng) for _ in range(parts - 1)])

    def parameter_of_ones(self):
        name = self.fresh_path(1)
        setattr(self.root, name, nn.Parameter(torch.ones(self.shape[-1])))
        return self.graph.get_attr(name)

    def tensor_of_ones(self):
        """A plain tensor attribute (no parameter; fx.GraphModule keeps it as a buffer): a get_attr, not a literal."""
        name = self.fresh_path(1)
        setattr(self.root, name, torch.ones(self.shape[-1]))
        return self.graph.get_attr(name)

    def copy_then_write(self, x):
        """y = s * 1 copies s before s.add_ writes it: replacing y by s would read the written value."""
        s = self.scale(x)
        y = self.binary("mul", s, 1)
        self.graph.call_method("add_", (s, 0.5))
        return y

    def relu_chain(self, x):
        """2 or 3 relus in random spellings, at least one an nn.ReLU nested in containers: all but one go."""
        spellings = ["module"] + self.rng.choices(["module", "method", torch.relu, F.relu], k=self.rng.randint(1, 2))
        self.rewrites += len(spellings) - 1
        for spelling in self.rng.sample(spellings, len(spellings)):
            if spelling == "module":
                path = self.fresh_path(self.rng.randint(2, 3))
                nest_under(self.root, path, nn.ReLU())
                x = self.graph.call_module(path, (x,))
            else:
                x = self.graph.call_method("relu", (x,)) if spelling == "method" else self.call(spelling, x)
        return x

    def permute_pair(self, x, cancelling: bool):
        """Two permutes that cancel (some dims negative), or a 3-cycle twice: the other 3-cycle, not the identity. One
        pair in three is two transposes: of the same two dims (cancelling), or of two pairs that share a dim (a
        3-cycle: transpose(0, 1) then transpose(1, 2) is permute(1, 2, 0))."""
        self.inner_permute_returned = False
        if self.rng.random() < 1 / 3:
            return self.transpose_pair(x, cancelling)
        if cancelling:
            p = self.rng.choice([[0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]])  # any but the identity
            q = [p.index(i) - 3 if self.rng.random() < 0.3 else p.index(i) for i in range(3)]
        else:
            p = q = self.rng.choice([[1, 2, 0], [2, 0, 1]])
            self.shape[:] = [self.shape[p[p[i]]] for i in range(3)]
            self.kept["permute"] += 2  # both stay
        for dims in (p, q):
            as_method = self.rng.random() < 0.5
            x = self.graph.call_method("permute", (x, *dims)) if as_method else self.call(torch.permute, x, tuple(dims))
            if dims is p and cancelling:
                self.read_elsewhere(x, "permute")
        return x

    def transpose_pair(self, x, cancelling: bool):
        a, b, c = self.rng.sample(range(3), 3)
        pairs = [(a, b), (b, a) if self.rng.random() < 0.5 else (a, b)] if cancelling else [(a, b), (b, c)]
        if not cancelling:
            self.kept["transpose"] += 2  # both stay
        for i, dims in enumerate(pairs):
            dims = tuple(d - 3 if self.rng.random() < 0.3 else d for d in dims)
            as_method = self.rng.random() < 0.5
            x = self.graph.call_method("transpose", (x, *dims)) if as_method else self.call(torch.transpose, x, *dims)
            self.shape[dims[0]], self.shape[dims[1]] = self.shape[dims[1]], self.shape[dims[0]]
            if i == 0 and cancelling:
                self.read_elsewhere(x, "transpose")
        return x

    def read_elsewhere(self, x, op: str) -> None:
        """The inner `op` of a cancelling pair, now and then an output too: it stays for that reader."""
        if self.rng.random() < 0.3:
            self.side_outputs.append(x)
            self.kept[op] += 1
            self.inner_permute_returned = True


def hidden_case(rng) -> Case:
    # A cube now and then: there a pair of permutes that does not cancel keeps the shape, so only composing the
    # two permutations refuses it (elsewhere the shape alone would).
    shape = [3, 3, 3] if rng.random() < 0.25 else [rng.choice([2, 3]), *rng.sample([3, 4, 5, 6, 7], 2)]
    builder = HiddenBuilder(rng, list(shape))
    x = builder.graph.placeholder(random_identifier(rng))
    kinds = [rng.choice(KINDS) for _ in range(rng.randint(6, 10))]
    if "relu_chain" not in kinds:  # every model holds an nn.ReLU nested in containers: a pass that finds only the
        kinds[rng.randrange(len(kinds))] = "relu_chain"  # top-level modules the visible models have fails every seed
    returned_view, trailing = False, []  # after a correct pass: is the chain's value also returned as a view, and
    for kind in kinds:                   # the identities since the step that made that value
        rewrites, kept, step = STEPS[kind]
        builder.rewrites += rewrites
        builder.kept.update(kept)
        x = step(builder, x)
        if kind in IDENTITIES:
            trailing.append(IDENTITIES[kind])
        elif kind not in TRAPS:
            returned_view, trailing = kind == "inverse_permute" and builder.inner_permute_returned, []
    builder.graph.output((x, *builder.side_outputs) if builder.side_outputs else x)
    gm = fx.GraphModule(builder.root, builder.graph)
    # The model returns the chain's last identity and, through the inner permute of a cancelled pair, a view of the
    # value that identity stands for: rewriting it gives two outputs one storage, which eager PyTorch kept apart.
    # Allowed (docs/grading.md: outputs may share), and so is keeping it as the copy it is (Inductor's
    # remove_noop_ops: "Don't introduce new aliasing between inputs and outputs"), whichever identity of them stays.
    alternatives = [(builder.rewrites - 1, builder.kept + Counter(ops)) for ops in trailing] if returned_view else []
    return Case(lambda: gm, lambda batch: (floats(*shape),), (builder.rewrites, builder.kept),
                "the pass must work for every spelling of the rule table's ops and refuse every unsafe one.",
                compare="bit_exact", batch_sizes=(3,), samples=3, trace=lambda graph_module: graph_module,
                extra={"alternatives": alternatives})
