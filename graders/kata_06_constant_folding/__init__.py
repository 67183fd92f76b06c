"""Grader for kata 06: constant folding.

Inference-style: parameters and buffers are constants unless the forward writes them. Outputs must be
bit-identical (torch.equal) to the original's, call after call, with the random generator reseeded
before each call, so a frozen random draw or a frozen buffer shows on the second call.
"""
from __future__ import annotations

import copy
import math
import random
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._pytree import tree_flatten

from graders.core import CheckFailed, Context, Kata
from graders.models import nest_under, random_identifier
from graders.numerics import input_sets, run_module
from graders.structure import assert_valid_graph_module, before_after
from graders.timing import assert_speedup

KATA = Kata("06_constant_folding", api={
    "fold_constants": "fold_constants(gm: torch.fx.GraphModule) -> int (the number of call nodes removed)",
})

# The L3 benchmark: a causal attention block that rebuilds its mask, its sinusoidal position table
# and its scaled weight on every call; at length 64 per-op overhead dominates, and folding removes 12
# of its 19 call nodes. Reference median 1.99x-2.20x on CPU single-threaded, a no-op 0.98x-1.03x
# (README, "Measured speedups"). The CUDA threshold is unmeasured: no GPU was available.
SPEEDUP_THRESHOLDS = {"cpu": 1.50, "cuda": 1.50}
BENCHMARK_LENGTH, BENCHMARK_DIM = 64, 32

# The size cap the README states: a node folds only if its result is at most
# max(SIZE_CAP_BYTES, GROWTH_CAP * the bytes of its tensor inputs).
SIZE_CAP_BYTES, GROWTH_CAP = 1 << 20, 4


class BufferTracer(fx.Tracer):
    """symbolic_trace would run `self.buf.sum()` at trace time and bake the result in; proxying buffer
    reads keeps them in the graph as get_attr nodes, as Hugging Face's tracer does."""
    proxy_buffer_attributes = True


def trace(model: nn.Module) -> fx.GraphModule:
    if isinstance(model, fx.GraphModule):  # a hand-built graph: keep it exactly as built
        return copy.deepcopy(model)
    return fx.GraphModule(model, BufferTracer().trace(model))


def call_node_count(gm: fx.GraphModule) -> int:
    return sum(n.op in ("call_function", "call_method", "call_module") for n in gm.graph.nodes)


# ----------------------------------------------------------------------------------------------
# Bit-exact comparison. Folding runs the same ops on the same values, only earlier, so every output
# must match exactly; a tolerance would hide a value computed differently.

def _describe_difference(got: torch.Tensor, want: torch.Tensor) -> str:
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"shape {tuple(got.shape)} and dtype {got.dtype}, expected {tuple(want.shape)} and {want.dtype}"
    differ = (got != want) & ~(got.isnan() & want.isnan()) if got.is_floating_point() else got != want
    largest = (got.double() - want.double()).abs().nan_to_num(posinf=math.inf).max().item()
    return f"{int(differ.sum())} of {want.numel()} elements differ (largest difference {largest:.3g})"


def assert_bit_identical(expected: Callable, candidate: Callable, inputs_list: list[tuple], *,
                         what: str, hint: str) -> None:
    """Call both in lockstep, reseeding the generator before each call; every output must be torch.equal."""
    for call, inputs in enumerate(inputs_list, 1):
        torch.manual_seed(call)
        want = run_module(expected, inputs, "the original model")
        torch.manual_seed(call)
        got = run_module(candidate, inputs, what)
        want_leaves, want_spec = tree_flatten(want)
        got_leaves, got_spec = tree_flatten(got)
        if got_spec != want_spec:
            raise CheckFailed(f"{what} returns {got_spec}, the original returns {want_spec}. Hint: {hint}")
        for index, (g, w) in enumerate(zip(got_leaves, want_leaves)):
            same = (isinstance(g, torch.Tensor) and g.shape == w.shape and g.dtype == w.dtype
                    and torch.equal(g, w)) if isinstance(w, torch.Tensor) else g == w
            if not same:
                detail = _describe_difference(g, w) if isinstance(g, torch.Tensor) and isinstance(w, torch.Tensor) \
                    else f"got {g!r}, expected {w!r}"
                raise CheckFailed(
                    f"{what} is not bit-identical to the original on call {call} of {len(inputs_list)} "
                    f"(output {index}): {detail}. Folding must give exactly the original's results on every "
                    f"call, not just the first. Hint: {hint}")


# ----------------------------------------------------------------------------------------------
# Models. Constants are built from an attribute (`device=self.w.device`, `self.w.shape[0]`): a call
# whose arguments are all plain Python values is run by the tracer itself and never reaches the graph.

def param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.randn(*shape))


class ScaledTransposedWeight(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.weight, self.bias, self.scale = param(n, n), param(n), random.uniform(0.2, 3.0)

    def forward(self, x):
        return x @ (self.weight.t() * self.scale) + self.bias


class CausalMask(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.n = n
        self.register_buffer("temperature", torch.rand(n) + 0.5)

    def forward(self, x):
        mask = torch.triu(torch.ones(self.n, self.n, device=self.temperature.device), diagonal=1).bool()
        return x.masked_fill(mask, -1e4) * self.temperature


class SinusoidalPositions(nn.Module):
    def __init__(self, n: int, d: int):
        super().__init__()
        self.n = n
        self.register_buffer("inv_freq", torch.rand(d // 2) * 0.5)

    def forward(self, x):
        angles = torch.arange(self.n, dtype=torch.float32, device=self.inv_freq.device).unsqueeze(1) * self.inv_freq
        return x + torch.cat([angles.sin(), angles.cos()], dim=-1)


class PartiallyConstant(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.a, self.b = param(n), param(n)
        self.register_buffer("c", torch.randn(n))

    def forward(self, x):
        return torch.relu(x * (self.a + self.b)) + x * self.c.exp() - self.a


class DependsOnInput(nn.Module):
    def forward(self, x):
        return torch.ones_like(x) * x.shape[-1] + torch.arange(x.shape[-1], device=x.device) * x.mean()


class RandomConstructors(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.n, self.w = n, param(n, n)

    def forward(self, x):
        noise = torch.rand(self.n, device=self.w.device)
        dropped = F.dropout(self.w * 2, 0.3)
        return x @ (dropped + torch.randn_like(self.w)) + noise


class DropoutModuleOnConstant(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.table, self.drop = param(n), nn.Dropout(0.5)  # training mode: a fresh mask per call

    def forward(self, x):
        return x * self.drop(self.table.exp())


class StepCounter(nn.Module):
    """A buffer the forward writes on every call: reading it is not reading a constant."""

    def __init__(self, n: int):
        super().__init__()
        self.register_buffer("steps", torch.rand(n) + 1)
        self.bias = param(n)

    def forward(self, x):
        self.steps.add_(1.0)
        return x * self.steps.rsqrt() + self.bias * 2


class DecayedHistory(nn.Module):
    """The write goes through a view (`history[0]`), so `history` itself changes."""

    def __init__(self, n: int):
        super().__init__()
        self.register_buffer("history", torch.randn(3, n))
        self.w = param(n)

    def forward(self, x):
        self.history[0].mul_(0.5)
        return x + self.history.sum(0) + self.w.flip(0)


class ConstantWrittenInPlace(nn.Module):
    """`m` is rebuilt from zeros on every call; stored once, the add_ would accumulate into it."""

    def __init__(self, n: int):
        super().__init__()
        self.n, self.w = n, param(n)

    def forward(self, x):
        m = torch.zeros(self.n, device=self.w.device)
        m.add_(self.w)
        return x * m


class SizeCap(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.w, self.v = param(n, n), param(16, n)  # w: 256 KiB when n = 256

    def forward(self, x):
        tiled = self.w.repeat(8, 1)                # 2 MiB from 256 KiB: over the cap
        spread = self.w.expand(8, -1, -1)          # a 2 MiB view: over the cap too
        small = self.v.repeat(2, 1)                # 32 KiB: folds
        return x @ tiled.t(), torch.matmul(spread, x.t()), x @ small.t()


class MultipleOutputs(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.qk, self.w = param(2 * n, n), param(n, n)

    def forward(self, x):
        q, k = self.qk.chunk(2, dim=0)
        top, where = torch.max(self.w, dim=1)
        return x @ q.t() + k.sum(0), top * x, where


class Block(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.weight = param(n, n)
        self.register_buffer("gain", torch.rand(n) + 0.5)

    def forward(self, x):
        return x @ (self.weight.t() * self.gain)


class NestedBlocks(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.encoder = nn.Module()
        self.encoder.blocks = nn.ModuleList([Block(n), Block(n)])

    def forward(self, x):
        for block in self.encoder.blocks:
            x = torch.tanh(block(x))
        return x


class NonTensorConstants(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.w = param(n, n)

    def forward(self, x):
        rows = torch.arange(self.w.shape[0], device=self.w.device)  # a tensor: folds, shape and all
        y = x.reshape(x.shape[0], self.w.shape[1])                   # an int feeding a runtime node: stays
        return y @ self.w.t() + rows


class ConstantModelOutputs(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.w = param(n, n)

    def forward(self, x):
        return x * 2, self.w.t() + 1, self.w.sum()


def same_buffer_read_twice(n: int) -> fx.GraphModule:
    """A hand-built graph with two get_attr nodes of one buffer; only the first is written."""
    root = nn.Module()
    root.register_buffer("state", torch.rand(n) + 1)
    graph = fx.Graph()
    x = graph.placeholder("x")
    written, read = graph.get_attr("state"), graph.get_attr("state")
    graph.call_method("mul_", (written, 1.5))
    graph.output(graph.call_function(torch.mul, (x, graph.call_method("log", (read,)))))
    return fx.GraphModule(root, graph)


@dataclass
class Case:
    build: Callable[[], nn.Module]
    in_shape: tuple[int, ...]
    folded: int        # call nodes a correct pass removes (README, "What the count counts")
    hint: str


FOLD_ALL = "every call here reads only attributes and literals: it all folds."
EXACT_CASES: dict[str, Case] = {
    "sinusoidal_positions": Case(lambda: SinusoidalPositions(12, 8), (12, 8), 7, FOLD_ALL),
    "partially_constant": Case(lambda: PartiallyConstant(8), (8,), 2,
                               "fold only self.a + self.b and self.c.exp(); everything that reads x stays."),
    "depends_on_input": Case(lambda: DependsOnInput(), (6,), 0,
                             "every value here is computed from the input x (its shape too): nothing folds."),
    "random_constructors": Case(lambda: RandomConstructors(6), (6,), 1,
                                "torch.rand, torch.randn_like and F.dropout draw new numbers on every call: "
                                "never fold them (only self.w * 2 folds)."),
    "dropout_module_on_constant": Case(lambda: DropoutModuleOnConstant(6), (6,), 1,
                                       "call_module nodes never fold (a module may draw random numbers or keep "
                                       "state); self.table.exp() does."),
    "buffer_mutated_in_place": Case(lambda: StepCounter(6), (6,), 1,
                                    "self.steps.add_(1.0) changes the buffer on every call, so nothing read from "
                                    "it is constant, and the add_ itself must stay (it has no users, but it is "
                                    "not dead: graph.eliminate_dead_code() deletes it anyway)."),
    "buffer_mutated_through_view": Case(lambda: DecayedHistory(6), (6,), 1,
                                        "self.history[0].mul_(0.5) writes into a view of self.history: follow the "
                                        "written node's first argument back to the buffer."),
    "constant_written_in_place": Case(lambda: ConstantWrittenInPlace(6), (6,), 0,
                                      "torch.zeros(...) is written by m.add_(...): stored once, it would "
                                      "accumulate call after call. A value something writes into never folds."),
    "same_buffer_read_twice": Case(lambda: same_buffer_read_twice(6), (6,), 0,
                                   "two get_attr nodes read the same buffer, and one of them is written: a "
                                   "mutated *attribute* (node.target), not just a mutated node, is not constant."),
    "size_cap": Case(lambda: SizeCap(256), (256,), 2,
                     "self.w.repeat(8, 1) and self.w.expand(8, ...) are 2 MiB from a 256 KiB weight: over the "
                     f"cap (a result folds only if at most max({SIZE_CAP_BYTES} bytes, {GROWTH_CAP} x its "
                     "tensor inputs)). Only self.v.repeat(2, 1) and its .t() fold."),
    "multiple_outputs": Case(lambda: MultipleOutputs(6), (6,), 8,
                             "chunk and torch.max return tuples: fold them with their getitem nodes and store "
                             "each tensor that a runtime node or the output reads."),
    "nested_attribute_names": Case(lambda: NestedBlocks(6), (6,), 4,
                                   "get_attr targets are dotted paths ('encoder.blocks.0.weight'): getattr(gm, "
                                   "target) fails on them; walk the path one name at a time. A name you register "
                                   "must not contain a dot."),
    "non_tensor_constants": Case(lambda: NonTensorConstants(6), (6,), 5,
                                 "an int or shape that a runtime node reads stays in the graph with what it is "
                                 "computed from; torch.arange(self.w.shape[0]) is a tensor and folds whole."),
    "constant_model_outputs": Case(lambda: ConstantModelOutputs(6), (6,), 3,
                                   "a constant the graph returns directly is stored like any other."),
}


def inputs_for(in_shape: tuple[int, ...], device: torch.device) -> Callable[[int], tuple]:
    return lambda batch: (torch.randn(batch, *in_shape, device=device),)


# ----------------------------------------------------------------------------------------------
# Checks

def run_fold(ctx: Context, model: nn.Module) -> tuple[fx.GraphModule, fx.GraphModule, int]:
    """Trace the model and run the learner's pass: (traced before the pass, result, returned count)."""
    before = trace(copy.deepcopy(model))
    gm = trace(model)
    folded = ctx.call("fold_constants", gm, returns=int)
    assert_valid_graph_module(gm, "fold_constants")
    removed = call_node_count(before) - call_node_count(gm)
    if folded != removed:
        raise CheckFailed(
            f"fold_constants returned {folded}, but the graph has {removed} fewer call nodes than before. The "
            "count is the number of call_function/call_method nodes removed: count a node when you erase it, "
            "and erase every folded node that nothing reads any more." + before_after(before, gm))
    return before, gm, folded


def check_case(ctx: Context, case: Case) -> dict:
    model = case.build().to(ctx.device)
    pristine = copy.deepcopy(model)
    before, gm, folded = run_fold(ctx, model)
    assert_bit_identical(pristine, gm, input_sets(inputs_for(case.in_shape, ctx.device)),
                         what="the folded module", hint=case.hint)
    if folded != case.folded:
        raise CheckFailed(f"fold_constants removed {folded} call nodes from this model; a correct pass removes "
                          f"{case.folded}. Hint: {case.hint}" + before_after(before, gm))
    return {"folded": folded}


@KATA.check(level=1)
def scaled_transposed_weight(ctx: Context):
    return check_case(ctx, Case(lambda: ScaledTransposedWeight(8), (8,), 2,
                                "self.weight.t() and its product with the scale read only a parameter and a "
                                "literal: evaluate them once, store the result, read it with one get_attr."))


@KATA.check(level=1)
def causal_mask(ctx: Context):
    return check_case(ctx, Case(lambda: CausalMask(10), (10, 10), 4,
                                "getattr(temperature, 'device'), torch.ones, torch.triu and .bool() all fold "
                                "into one stored mask (the getattr counts: it is a call_function node)."))


for _name, _case in EXACT_CASES.items():
    KATA.add(2, _name, lambda ctx, case=_case: check_case(ctx, case))


class CausalAttention(nn.Module):
    """Rebuilds its mask, position table and scaled weight on every call, as much model code does."""

    def __init__(self, n: int, d: int):
        super().__init__()
        self.n, self.d = n, d
        self.weight = nn.Parameter(torch.randn(d, d) / math.sqrt(d))
        self.register_buffer("inv_freq", torch.rand(d // 2) * 0.5)

    def forward(self, x):
        n, device = self.n, self.weight.device
        mask = torch.triu(torch.ones(n, n, device=device), diagonal=1).bool()
        angles = torch.arange(n, dtype=torch.float32, device=device).unsqueeze(1) * self.inv_freq
        h = x + torch.cat([angles.sin(), angles.cos()], dim=-1)
        q = h @ (self.weight.t() * self.d ** -0.5)
        scores = (q @ h.transpose(-2, -1)).masked_fill(mask, float("-inf"))
        return scores.softmax(-1) @ h


@KATA.check(level=3)
def causal_attention_speedup(ctx: Context):
    model = CausalAttention(BENCHMARK_LENGTH, BENCHMARK_DIM).eval().to(ctx.device)
    baseline = trace(copy.deepcopy(model))
    _, candidate, _ = run_fold(ctx, model)
    return assert_speedup(ctx, baseline, candidate,
                          lambda: (torch.randn(1, BENCHMARK_LENGTH, BENCHMARK_DIM, device=ctx.device),),
                          SPEEDUP_THRESHOLDS, what="the folded causal attention block",
                          hint="the mask, the position table and the scaled weight read no input: all 12 of "
                               "their call nodes fold.")


# ----------------------------------------------------------------------------------------------
# Hidden models (L4): a sum of random pieces, each with its own random names, nesting, sizes and
# spellings; the generator knows how many call nodes each piece lets a correct pass remove.

TRANSPOSES = [lambda w: w.t(), lambda w: w.T, lambda w: torch.transpose(w, 0, 1), lambda w: w.permute(1, 0)]
SCALES = [lambda t, s: t * s, lambda t, s: torch.mul(t, s), lambda t, s: t.mul(s)]
RANDOM_DRAWS = {  # name: (draw from a constant vector v, call nodes a correct pass removes)
    "rand": (lambda v: torch.rand(v.shape[0], device=v.device), 0),
    "randn_like": (lambda v: torch.randn_like(v), 0),
    "rand_like": (lambda v: torch.rand_like(v), 0),
    "randint": (lambda v: torch.randint(0, 5, (v.shape[0],), device=v.device), 0),
    "normal": (lambda v: torch.normal(v, 1.0), 0),
    "bernoulli": (lambda v: torch.bernoulli(v.sigmoid()), 1),
    "dropout": (lambda v: F.dropout(v * 2, 0.5), 1),
    "randperm": (lambda v: v[torch.randperm(v.shape[0], device=v.device)], 0),
}
IN_PLACE_WRITES = {
    "add_": lambda b: b.add_(0.25), "mul_": lambda b: b.mul_(1.1), "sub_": lambda b: b.sub_(0.1),
    "div_": lambda b: b.div_(1.5), "clamp_": lambda b: b.clamp_(max=1.2),
    "view_add_": lambda b: b[1:].add_(0.5), "out=": lambda b: torch.mul(b, 0.9, out=b),
    "zero_": lambda b: b.zero_(), "torch.sqrt_": lambda b: torch.sqrt_(b),
}


class Piece(nn.Module):
    """One term of a hidden model; `kind` picks the forward, `names` the attribute names."""

    def __init__(self, rng: random.Random, kind: str, n: int):
        super().__init__()
        self.kind, self.n = kind, n
        self.names = [random_identifier(rng) + f"_{i}" for i in range(2)]
        first, second = self.names
        self.choice = rng.randrange(1 << 30)
        if kind in ("scaled_weight", "triangular"):
            setattr(self, first, nn.Parameter(torch.randn(n, n) / math.sqrt(n)))
            self.scale = rng.uniform(0.3, 2.0)
        elif kind == "positions":
            self.register_buffer(first, torch.rand(n // 2) * 0.5)
        elif kind == "exp_sum":
            setattr(self, first, param(n))
            self.register_buffer(second, torch.randn(n) * 0.3)
        elif kind == "random":
            self.register_buffer(first, torch.randn(n))
        elif kind == "mutated":
            self.register_buffer(first, torch.rand(n) + 0.5)
        elif kind == "capped":
            rows = (1 << 16) // n  # 256 KiB of float32; repeated 8 times, 2 MiB
            self.register_buffer(first, torch.randn(rows, n) / rows)

    def pick(self, options: list | dict):
        keys = list(options) if isinstance(options, dict) else range(len(options))
        return options[keys[self.choice % len(keys)]]

    def forward(self, x):
        a = getattr(self, self.names[0], None)  # input_dependent pieces have no attribute
        if self.kind == "scaled_weight":
            return x @ self.pick(SCALES)(self.pick(TRANSPOSES)(a), self.scale)
        if self.kind == "triangular":
            make = torch.triu if self.choice % 2 else torch.tril
            ones = torch.ones(self.n, self.n, device=a.device) if self.choice % 3 else torch.ones(self.n, self.n, dtype=a.dtype)
            return x @ (make(ones, diagonal=self.choice % 3 - 1) * a)
        if self.kind == "positions":
            steps = torch.arange(self.n, device=a.device)
            angles = (steps.unsqueeze(1) if self.choice % 2 else steps[:, None]) * a
            return x @ torch.cat([angles.sin(), angles.cos()], dim=-1)
        if self.kind == "exp_sum":
            return x * (a + getattr(self, self.names[1])).exp()
        if self.kind == "random":
            draw, _ = self.pick(RANDOM_DRAWS)
            return x + draw(a)
        if self.kind == "mutated":
            write = self.pick(IN_PLACE_WRITES)
            if self.choice % 2:
                write(a)
                return x * a.cos()
            y = x * a.cos()
            write(a)
            return y
        if self.kind == "capped":
            tiled = a.repeat(8, 1) if self.choice % 2 else a.expand(8, -1, -1)
            return x * tiled.sum(0).sum(0)
        return x * torch.arange(x.shape[-1], device=x.device) + torch.ones_like(x) * x.mean()  # input_dependent


FOLDS = {"scaled_weight": 2, "triangular": 4, "positions": 7, "exp_sum": 2, "mutated": 0, "capped": 0,
         "input_dependent": 0}
TRAPS = ["random", "mutated", "capped", "input_dependent"]


def piece_folds(piece: Piece) -> int:
    if piece.kind == "random":
        return piece.pick(RANDOM_DRAWS)[1]
    return FOLDS[piece.kind]


class HiddenNet(nn.Module):
    def __init__(self, pieces: list[tuple[str, Piece]]):
        super().__init__()
        self.order = [path for path, _ in pieces]
        for path, piece in pieces:
            nest_under(self, path, piece)

    def forward(self, x):
        out = x
        for path in self.order:
            out = out + self.get_submodule(path)(x)
        return out


def hidden_case(rng: random.Random) -> Case:
    n = rng.choice([8, 12, 16, 24])
    # At least one piece whose trap takes knowing a whole family of ops (random draws, in-place writes).
    kinds = [rng.choice(["random", "mutated"])] + [rng.choice(TRAPS) for _ in range(rng.randint(0, 1))]
    kinds += [rng.choice(list(FOLDS)[:4] + TRAPS) for _ in range(rng.randint(2, 4))]
    rng.shuffle(kinds)
    pieces = []
    for index, kind in enumerate(kinds):
        path = ".".join(random_identifier(rng) for _ in range(rng.randint(1, 3))) + f"_{index}"
        pieces.append((path, Piece(rng, kind, n)))
    return Case(lambda: HiddenNet(pieces), (n,), sum(piece_folds(p) for _, p in pieces),
                f"this model's pieces are {', '.join(kinds)}; the pass must work for any names, nesting and "
                "spellings.")


for _index in range(1, 6):
    KATA.add(4, f"model_{_index}", lambda ctx: check_case(ctx, hidden_case(random.Random(ctx.seed))))
