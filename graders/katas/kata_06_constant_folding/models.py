"""Kata 06's model zoo and hidden-model generator. A case's `expect` is the number of call nodes a correct
pass removes (README, "What the count counts"). Constants are built from an attribute (`device=m.w.device`,
`m.w.shape[0]`): a call whose arguments are all plain Python values is run by the tracer, never reaching the graph.
"""
from __future__ import annotations

import copy
import math
import operator
import random

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from graders.run import Case, Program, random_identifier, random_path


class BufferTracer(fx.Tracer):
    """Buffer reads stay get_attr nodes, as in Hugging Face's tracer (symbolic_trace bakes `self.buf.sum()` in)."""
    proxy_buffer_attributes = True


def trace(model: nn.Module) -> fx.GraphModule:  # a hand-built GraphModule stays exactly as built
    hand_built = isinstance(model, fx.GraphModule)
    return copy.deepcopy(model) if hand_built else fx.GraphModule(model, BufferTracer().trace(model))


def param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.randn(*shape))


def case(build, in_shape: tuple, folds: int, hint: str, **options) -> Case:
    options.setdefault("inputs", lambda batch: (torch.randn(batch, *in_shape),))
    options.setdefault("compare", "bit_exact")
    return Case(build, expect=folds, hint=hint, trace=trace, **options)


# The zoo's programs, program(m, x) of a Program (graders/models.py), where one line does not hold them.
def position_table(n: int, inv_freq, device, column=lambda steps: steps.unsqueeze(1)) -> torch.Tensor:
    angles = column(torch.arange(n, dtype=torch.float32, device=device)) * inv_freq
    return torch.cat([angles.sin(), angles.cos()], dim=-1)

def step_counter(m, x):  # a buffer the forward writes on every call: reading it is not reading a constant
    m.steps.add_(1.0)
    return x * m.steps.rsqrt() + m.bias * 2

def decayed_history(m, x):  # the write goes through a view (`history[0]`), so `history` itself changes
    m.history[0].mul_(0.5)
    return x + m.history.sum(0) + m.w.flip(0)

def written_in_place(m, x):  # made from zeros on every call and written: stored once, it would accumulate
    rebuilt = torch.zeros(m.n, device=m.w.device)
    rebuilt.add_(m.w)
    return x * rebuilt

def size_cap(m, x):  # w: 256 KiB when n = 256
    tiled = m.w.repeat(8, 1)           # 2 MiB from 256 KiB: over the cap
    spread = m.w.expand(8, -1, -1)     # a 2 MiB view: over the cap too
    small = m.v.repeat(2, 1)           # 32 KiB: folds
    return x @ tiled.t(), torch.matmul(spread, x.t()), x @ small.t()

def written_by_an_inplace_module(m, x):  # nn.ReLU(inplace=True) writes the buffer it is given, on every call
    m.act(m.state)
    return x * m.state.exp()

def multiple_outputs(m, x):
    q, k = m.qk.chunk(2, dim=0)
    top, where = torch.max(m.w, dim=1)
    return x @ q.t() + k.sum(0), top * x, where

def nested_blocks(m, x):  # the blocks only hold attributes: their own forward is never called
    for block in m.encoder.blocks:
        x = torch.tanh(x @ (block.weight.t() * block.gain))
    return x

def non_tensor_constants(m, x):
    rows = torch.arange(m.w.shape[0], device=m.w.device)  # a tensor: folds, shape and all
    y = x.reshape(x.shape[0], m.w.shape[1])                # an int feeding a runtime node: stays
    return y @ m.w.t() + rows

def same_buffer_read_twice(n: int) -> fx.GraphModule:  # built by hand: two get_attr nodes of one buffer
    graph = fx.Graph()
    x, written, read = graph.placeholder("x"), graph.get_attr("state"), graph.get_attr("state")
    graph.call_method("mul_", (written, 1.5))
    graph.output(graph.call_function(torch.mul, (x, graph.call_method("log", (read,)))))
    return fx.GraphModule(Program(None, state=torch.rand(n) + 1), graph)

def constructors_without_inputs(n: int) -> fx.GraphModule:  # built by hand: symbolic_trace runs these itself
    graph = fx.Graph()
    x = graph.placeholder("x")
    positions = graph.call_function(torch.arange, (n,), {"dtype": torch.float32})  # no input node at all
    ones = graph.call_function(torch.ones, (n,))
    scaled = graph.call_function(torch.mul, (x, positions))
    graph.output(graph.call_function(torch.add, (scaled, graph.call_method("exp", (ones,)))))
    return fx.GraphModule(Program(None), graph)

def written_through_out(m, x):  # torch.mul(..., out=b) writes b as surely as b.mul_(...) does
    torch.mul(m.decay, 0.9, out=m.decay)
    return x * m.decay.exp() + m.w.sin()

def shared_folded_value(m, x):  # one folded value, read by two runtime nodes and the output
    scaled = m.w.t() * 2
    return (x @ scaled) @ scaled, scaled

class DefaultArgument(Program):  # `scale` has a default, but it is an argument: a caller may pass another value
    def forward(self, x, scale=2.0):
        return x @ (self.w.t() * scale)

# Names a pass may pick for its stored values, each read at run time (name: how its tensor is made; a plain tensor
# is a buffer). Storing over a buffer silently changes outputs; over a parameter or submodule, register_buffer raises.
TAKEN = dict.fromkeys(["_folded_constant_0", "_folded_constant_1", "_folded_0", "folded_0", "_const_0",
                       "_tensor_constant0", "_constant_0"], torch.randn) | {"folded_constant_0": param}


L1_CASES = {
    "scaled_transposed_weight": case(
        lambda: Program(lambda m, x: x @ (m.weight.t() * m.scale) + m.bias, weight=param(8, 8), bias=param(8),
                        scale=random.uniform(0.2, 3.0)), (8,), 2,
        "self.weight.t() and its product with the scale read only a parameter and a literal: evaluate them once, "
        "store the result, read it with one get_attr."),
    "causal_mask": case(
        lambda: Program(lambda m, x: x.masked_fill(torch.triu(torch.ones(m.n, m.n, device=m.temperature.device),
                                                              diagonal=1).bool(), -1e4) * m.temperature,
                        n=10, temperature=torch.rand(10) + 0.5), (10, 10), 4,
        "getattr(temperature, 'device'), torch.ones, torch.triu and .bool() all fold into one stored mask (the "
        "getattr counts: it is a call_function node)."),
}
EXACT_CASES: dict[str, Case] = {
    "sinusoidal_positions": case(lambda: Program(lambda m, x: x + position_table(12, m.inv_freq, m.inv_freq.device),
                                                 inv_freq=torch.rand(4) * 0.5), (12, 8), 7,
                                 "every call here reads only attributes and literals: it all folds."),
    "partially_constant": case(
        lambda: Program(lambda m, x: torch.relu(x * (m.a + m.b)) + x * m.c.exp() - m.a, a=param(8), b=param(8),
                        c=torch.randn(8)), (8,), 2,
        "fold only self.a + self.b and self.c.exp(); everything that reads x stays."),
    "depends_on_input": case(
        lambda: Program(lambda m, x: torch.ones_like(x) * x.shape[-1]
                        + torch.arange(x.shape[-1], device=x.device) * x.mean()), (6,), 0,
        "every value here is computed from the input x (its shape too): nothing folds."),
    "random_constructors": case(
        lambda: Program(lambda m, x: x @ (F.dropout(m.w * 2, 0.3) + torch.randn_like(m.w))
                        + torch.rand(m.n, device=m.w.device), n=6, w=param(6, 6)), (6,), 1,
        "torch.rand, torch.randn_like and F.dropout draw new numbers on every call: never fold them (only "
        "self.w * 2 folds)."),
    "dropout_module_on_constant": case(  # the Dropout is in training mode: a fresh mask per call
        lambda: Program(lambda m, x: x * m.drop(m.table.exp()), table=param(6), drop=nn.Dropout(0.5)), (6,), 1,
        "call_module nodes never fold (a module may draw random numbers or keep state); self.table.exp() does."),
    "buffer_mutated_in_place": case(lambda: Program(step_counter, steps=torch.rand(6) + 1, bias=param(6)), (6,), 1,
        "self.steps.add_(1.0) changes the buffer on every call, so nothing read from it is constant, and the add_ "
        "itself must stay (it has no users, but it is not dead: graph.eliminate_dead_code() deletes it anyway)."),
    "buffer_mutated_through_view": case(
        lambda: Program(decayed_history, history=torch.randn(3, 6), w=param(6)), (6,), 1,
        "self.history[0].mul_(0.5) writes into a view of self.history: follow the written node's first argument "
        "back to the buffer."),
    "constant_written_in_place": case(lambda: Program(written_in_place, n=6, w=param(6)), (6,), 0,
        "torch.zeros(...) is written by m.add_(...): stored once, it would accumulate call after call. A value "
        "something writes into never folds."),
    "same_buffer_read_twice": case(lambda: same_buffer_read_twice(6), (6,), 0,
        "two get_attr nodes read the same buffer, and one of them is written: a mutated *attribute* (node.target), "
        "not just a mutated node, is not constant."),
    "size_cap": case(lambda: Program(size_cap, w=param(256, 256), v=param(16, 256)), (256,), 2,
        "self.w.repeat(8, 1) and self.w.expand(8, ...) are 2 MiB from a 256 KiB weight: over the cap (a result folds "
        "only if at most max(1048576 bytes, 4 x its tensor inputs)). Only self.v.repeat(2, 1) and its .t() fold."),
    "result_exactly_at_the_cap": case(lambda: Program(lambda m, x: x @ m.w.repeat(4, 1).t(), w=param(128, 512)), (512,), 2,
        "self.w.repeat(4, 1) is exactly 1 MiB, and exactly 4 x its 256 KiB input: the cap is *at most* "
        "max(1048576 bytes, 4 x its tensor inputs), so it folds (and so does the .t() of it)."),
    "buffer_written_by_an_inplace_module": case(
        lambda: Program(written_by_an_inplace_module, state=torch.randn(6), act=nn.ReLU(inplace=True)), (6,), 0,
        "self.act is nn.ReLU(inplace=True): calling it on self.state writes the buffer, so self.state.exp() is not "
        "constant. A call_module node of a module built with inplace=True writes its input as add_ does."),
    "multiple_outputs": case(lambda: Program(multiple_outputs, qk=param(12, 6), w=param(6, 6)), (6,), 8,
        "chunk and torch.max return tuples: fold them with their getitem nodes and store each tensor that a runtime "
        "node or the output reads (the output returns a copy of a stored value: .clone())."),
    "nested_attribute_names": case(
        lambda: Program(nested_blocks, encoder=Program(None, blocks=nn.ModuleList(
            Program(None, weight=param(6, 6), gain=torch.rand(6) + 0.5) for _ in range(2)))), (6,), 4,
        "get_attr targets are dotted paths ('encoder.blocks.0.weight'): getattr(gm, target) fails on them; walk the "
        "path one name at a time. A name you register must not contain a dot."),
    "non_tensor_constants": case(lambda: Program(non_tensor_constants, w=param(6, 6)), (6,), 5,
        "an int or shape that a runtime node reads stays in the graph with what it is computed from; "
        "torch.arange(self.w.shape[0]) is a tensor and folds whole."),
    "constant_model_outputs": case(
        lambda: Program(lambda m, x: (x * 2, m.w.t() + 1, m.w.sum()), w=param(6, 6)), (6,), 3,
        "a constant the graph returns directly is stored like any other, and the output returns a copy of it made at "
        "every call (stored.clone(); the count does not subtract it): the original returns a fresh tensor, and the "
        "stored value itself would let a caller's in-place write change the module."),
    # Calls 1-2 use the default, calls 3-4 pass scale=0.5: the default is not a constant.
    "argument_with_default": case(lambda: DefaultArgument(None, w=param(6, 6)), None, 1,
        "`scale=2.0` is an argument with a default, not a constant: the caller may pass another value. A placeholder "
        "never folds, whatever its default; only self.w.t() does.",
        inputs=lambda batch: (torch.randn(batch, 6),) + (() if batch == 1 else (0.5,))),
    "constructors_without_inputs": case(lambda: constructors_without_inputs(6), (6,), 3,
        "torch.arange(6) and torch.ones(6) read no node at all (all_input_nodes is empty): a node with no inputs is "
        "constant, like one whose inputs all are. They fold, and so does the exp of the ones (a hand-built graph: "
        "symbolic_trace would have run them itself, as make_fx and torch.export do not).",
        cpu_only="the hand-built constructors name no device, so they make CPU tensors"),
    "buffer_written_through_out": case(
        lambda: Program(written_through_out, decay=torch.rand(6) + 0.5, w=param(6)), (6,), 1,
        "torch.mul(self.decay, 0.9, out=self.decay) writes self.decay: a call with an out= tensor is an in-place op "
        "on that tensor. Never run it at fold time (it would write the real buffer), and nothing read from the "
        "buffer folds; only self.w.sin() does."),
    "module_on_constant": case(
        lambda: Program(lambda m, x: x @ m.lin(m.w).t() + x * m.norm(m.table).sum(0), w=param(6, 6),
                        table=torch.randn(4, 6), lin=nn.Linear(6, 6), norm=nn.BatchNorm1d(6)), (6,), 0,
        "call_module nodes never fold, even on constant inputs: the pass sees no code inside a leaf module. "
        "self.lin(self.w) happens to be pure, but self.norm (a BatchNorm1d in training mode) updates its running "
        "statistics on every call, and a Dropout draws a fresh mask."),
    "folded_value_read_twice": case(lambda: Program(shared_folded_value, w=param(6, 6)), (6,), 2,
        "self.w.t() * 2 is read by two matmuls and the output: store it once and read it with one new get_attr "
        "node (node.replace_all_uses_with), not one get_attr per user; the output returns a copy of it (.clone())."),
    "attribute_names_taken": case(
        lambda: Program(lambda m, x: m._folded_1(x * m.w.exp()) + m.w.sin() + sum(x * getattr(m, t) for t in TAKEN),
                        w=param(6), _folded_1=nn.Identity(), **{name: make(6) for name, make in TAKEN.items()}),
        (6,), 2,
        "the module already has attributes named _folded_constant_0, _folded_0, _const_0, _tensor_constant0 and more "
        "(buffers, a parameter, a submodule): a stored value needs a name that is still free (hasattr(gm, name))."),
}


def causal_attention(m, x):  # rebuilds its mask, position table and scaled weight on every call, as much code does
    n, device = m.n, m.weight.device
    mask = torch.triu(torch.ones(n, n, device=device), diagonal=1).bool()
    h = x + position_table(n, m.inv_freq, device)
    q = h @ (m.weight.t() * m.d ** -0.5)
    scores = (q @ h.transpose(-2, -1)).masked_fill(mask, float("-inf"))
    return scores.softmax(-1) @ h


# The L3 benchmark: at length 64 per-op overhead dominates; folding removes 12 of its 19 call nodes (README).
LENGTH, DIM = 64, 32
BENCHMARK = case(lambda: Program(causal_attention, n=LENGTH, d=DIM, inv_freq=torch.rand(DIM // 2) * 0.5,
                                 weight=nn.Parameter(torch.randn(DIM, DIM) / math.sqrt(DIM))),
                 (LENGTH, DIM), 12, "", mode="eval", batch_sizes=(1,))


# ----------------------------------------------------------------------------------------------
# Hidden models (L4): a sum of random pieces, each with its own random names, nesting, sizes and
# spellings; the generator knows how many call nodes each piece lets a correct pass remove.

TRANSPOSES = [lambda w: w.t(), lambda w: w.T, lambda w: torch.transpose(w, 0, 1), lambda w: w.permute(1, 0)]
SCALES = [lambda t, s: t * s, lambda t, s: torch.mul(t, s), lambda t, s: t.mul(s)]
# Random draws and in-place writes: those no visible model makes first (the zoo draws with torch.rand,
# torch.randn_like and F.dropout, and writes with add_, mul_ and out=). Every generated model holds a random piece
# and a mutated piece of those first ones, so a pass that lists the visible ones by hand fails every seed.
UNSEEN_DRAWS = [  # (draw from a constant vector v, call nodes a correct pass removes)
    (lambda v: torch.rand_like(v), 0), (lambda v: torch.randint(0, 5, (v.shape[0],), device=v.device), 0),
    (lambda v: torch.normal(v, 1.0), 0), (lambda v: torch.bernoulli(v.sigmoid()), 1),
    (lambda v: v[torch.randperm(v.shape[0], device=v.device)], 0)]
RANDOM_DRAWS = UNSEEN_DRAWS + [(lambda v: torch.rand(v.shape[0], device=v.device), 0),
                               (lambda v: torch.randn_like(v), 0), (lambda v: F.dropout(v * 2, 0.5), 1)]
UNSEEN_WRITES = [lambda b: b.sub_(0.1), lambda b: b.div_(1.5), lambda b: b.clamp_(max=1.2), lambda b: b.zero_(),
                 lambda b: torch.sqrt_(b)]
IN_PLACE_WRITES = UNSEEN_WRITES + [lambda b: b.add_(0.25), lambda b: b.mul_(1.1), lambda b: b[1:].add_(0.5),
                                   lambda b: torch.mul(b, 0.9, out=b)]
TRAPS = ["random", "mutated", "capped", "input_dependent", "module_on_constant"]
KINDS = ["scaled_weight", "triangular", "positions", "exp_sum"] + TRAPS
ONES = [  # (an n x n matrix of ones like the weight w, its call nodes): each spelling folds whole
    (lambda w, n: torch.ones(n, n, device=w.device), 2), (lambda w, n: w.new_ones(n, n), 1),
    (lambda w, n: torch.ones(n, n, dtype=w.dtype, device=w.device), 3)]
COLUMNS = [lambda steps: steps.unsqueeze(1), lambda steps: steps[:, None]]


def hidden_piece(rng: random.Random, kind: str, n: int, unseen: bool = False) -> tuple[Program, int]:
    """One term of a hidden model, its attributes under random names, and the call nodes a correct pass removes.
    `unseen`: a random or mutated piece draws or writes as no visible model does."""
    name, other = (random_identifier(rng) + f"_{i}" for i in range(2))
    weight, get = {name: nn.Parameter(torch.randn(n, n) / math.sqrt(n))}, operator.attrgetter(name)
    if kind == "scaled_weight":
        transpose, scale, s = rng.choice(TRANSPOSES), rng.choice(SCALES), rng.uniform(0.3, 2.0)
        if rng.random() < 0.5:  # the folded weight read by two matmuls: still one stored value, one get_attr
            return Program(lambda m, x: (x @ (w := scale(transpose(get(m)), s))) @ w, **weight), 2
        return Program(lambda m, x: x @ scale(transpose(get(m)), s), **weight), 2
    if kind == "triangular":
        make, diagonal, (ones, calls) = rng.choice([torch.triu, torch.tril]), rng.randrange(3) - 1, rng.choice(ONES)
        return Program(lambda m, x: x @ (make(ones(w := get(m), n), diagonal=diagonal) * w), **weight), calls + 2
    if kind == "positions":
        column = rng.choice(COLUMNS)
        return Program(lambda m, x: x @ position_table(n, w := get(m), w.device, column),
                       **{name: torch.rand(n // 2) * 0.5}), 7
    if kind == "exp_sum":
        return Program(lambda m, x: x * (get(m) + getattr(m, other)).exp(),
                       **{name: param(n), other: torch.randn(n) * 0.3}), 2
    if kind == "random":
        draw, calls = rng.choice(UNSEEN_DRAWS if unseen else RANDOM_DRAWS)
        return Program(lambda m, x: x + draw(get(m)), **{name: torch.randn(n)}), calls
    if kind == "mutated":  # the buffer is written before or after it is read (a tuple runs left to right)
        write = rng.choice(UNSEEN_WRITES if unseen else IN_PLACE_WRITES)
        written_first, read = rng.random() < 0.5, lambda m, x: x * get(m).cos()
        mutated = lambda m, x: (write(get(m)), read(m, x))[1] if written_first else (read(m, x), write(get(m)))[0]
        return Program(mutated, **{name: torch.rand(n) + 0.5}), 0
    if kind == "module_on_constant":  # a leaf module on a constant: a call_module node never folds
        return Program(lambda m, x: x * getattr(m, other)(get(m)).sum(0), **weight, **{other: nn.Linear(n, n)}), 0
    if kind == "capped":  # 256 KiB of float32; repeated or expanded 8 times, 2 MiB: over the cap
        spread, rows = rng.choice([lambda a: a.repeat(8, 1), lambda a: a.expand(8, -1, -1)]), (1 << 16) // n
        return Program(lambda m, x: x * spread(get(m)).sum(0).sum(0), **{name: torch.randn(rows, n) / rows}), 0
    return Program(lambda m, x: x * torch.arange(x.shape[-1], device=x.device) + torch.ones_like(x) * x.mean()), 0


def hidden_case(rng: random.Random) -> Case:
    n = rng.choice([8, 12, 16, 24])
    # Two pieces whose traps take knowing a whole family of ops, a random draw and an in-place write, each as no
    # visible model spells it (the first two below); then up to one more trap and two to four pieces of any kind.
    kinds = ["random", "mutated"] + [rng.choice(TRAPS) for _ in range(rng.randint(0, 1))]
    kinds += [rng.choice(KINDS) for _ in range(rng.randint(2, 4))]
    order = rng.sample(range(len(kinds)), len(kinds))
    kinds, unseen = [kinds[i] for i in order], [i < 2 for i in order]
    paths = [random_path(rng, 3, i) for i in range(len(kinds))]
    pieces = [hidden_piece(rng, kind, n, first) for kind, first in zip(kinds, unseen)]
    sum_of_terms = lambda m, x: sum((m.get_submodule(path)(x) for path in paths), x)  # x plus every piece's term
    return case(lambda: Program(sum_of_terms, **{path: piece for path, (piece, _) in zip(paths, pieces)}), (n,),
                sum(calls for _, calls in pieces),
                f"this model's pieces are {', '.join(kinds)}; the pass must work for any names, nesting and spellings.")
