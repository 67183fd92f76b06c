"""Kata 05's model zoo and hidden-model generator. A case expects the number of nodes a correct pass merges
away (a (low, high) range where either answer is right); both sides run from one generator state
(`rng=True`), so they draw the same random numbers unless the pass merged a draw away."""
from __future__ import annotations

import itertools
import operator
import random
from functools import reduce
from typing import Callable

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from graders.run import Case, Program, Program2, random_path


def returned_fresh(program: Callable) -> Callable:
    """`program` with each output passed through one more op of its own (output i: `+ i`). A pass may leave
    returned values apart (AOTAutograd's CSE does: README), and a returned duplicate would then hide the trap a
    model sets: so no node a trap is about is itself returned, and the added ops never merge."""
    def forward(m, *inputs):
        outputs = program(m, *inputs)
        if isinstance(outputs, tuple):
            return tuple(output + position for position, output in enumerate(outputs))
        return outputs + 0
    return forward


# Every model is a Program (graders/models.py): its forward a function of (model, *inputs), with the modules it calls.
def case(build, widths, merges: int | tuple[int, int], hint: str, *, fresh_outputs: bool = True, **options) -> Case:
    """A model on random (batch, width) inputs, one per width (or `widths` is the batch -> inputs function).
    `fresh_outputs`: a Program's outputs are passed through `returned_fresh`."""
    inputs = widths if callable(widths) or widths is None else lambda b: tuple(torch.randn(b, w) for w in widths)

    def built():
        model = build()
        if fresh_outputs and isinstance(model, Program):
            model.program = returned_fresh(model.program)
        return model
    return Case(built, inputs, merges, hint, rng=True, batch_sizes=(2, 3), **options)


def duplicate_chains(m, x, y):
    a = torch.sin(x) * y
    first_user = a.cos()          # a user of the first copy before the second copy exists
    b = torch.sin(x) * y          # sin merges, then mul merges: its inputs are now the same nodes
    s1 = x.exp().sum(dim=1, keepdim=True)
    s2 = x.exp().sum(dim=1, keepdim=True)
    return torch.cat([a, s1], dim=1) + torch.cat([b, s2], dim=1), first_user


# The in-place shapes around a write (model, tensor): the hidden generator reuses them with random ones.
def written_twice(*writes: Callable) -> Callable:
    """h = x * 1.5, then each write twice in a row: two identical writes are two writes."""
    def forward(m, x):
        h = x * 1.5
        for write in writes:
            write(m, h)
            write(m, h)
        return (h,)
    return forward


def written_between(read: Callable, write: Callable, view: Callable = lambda h: h) -> Callable:
    """read(view(h)), a write to h, the same read again: the two reads see different values."""
    def forward(m, x):
        h = x * 1.5
        v = view(h)
        before = read(v)
        write(m, h)
        return before, read(v), h
    return forward


def written_after(write: Callable, copy: Callable = lambda h: h + 1) -> Callable:
    """Two copies of an expression, then a write to the second: merged, the first would change with it."""
    def forward(m, x):
        h = x * 1.5
        a, b = copy(h), copy(h)
        write(m, b)
        return a, b
    return forward


def together(*forwards: Callable) -> Callable:
    return lambda m, x: tuple(output for forward in forwards for output in forward(m, x))


# In-place methods other than add_/sub_/mul_/div_: a write between copies, a write twice, a write to a copy.
inplace_methods_beyond_arithmetic = together(
    written_between(lambda h: h.sin(), lambda m, h: h.clamp_(-1.0, 1.0)), written_twice(lambda m, h: h.exp_()),
    written_after(lambda m, b: b.masked_fill_(b > 2, 0.0)))


# The copies read h while the write goes through a view of a view of it, and the other way round.
write_through_an_alias = together(
    written_between(lambda h: h.exp(), lambda m, h: h.view(-1)[:4].add_(1)),
    written_between(lambda ht: ht.sin(), lambda m, h: h.mul_(2), view=lambda h: h.t()))


# Ops that return their input itself here (a contiguous float32 tensor): a write through their result writes b.
written_through_self_returning_ops = together(*(written_after(write) for write in (
    lambda m, b: b.contiguous().mul_(2), lambda m, b: b.detach().mul_(2), lambda m, b: b.float().mul_(2),
    lambda m, b: b.to(torch.float32).mul_(2))))


def tensor_constant_args() -> fx.GraphModule:
    """torch.add(x, t) for t in (t1, t2, t1): tensors as literal arguments, built by hand (its code cannot
    run, so only its structure is graded). `==` on two tensors is elementwise: comparing them with == raises."""
    graph, t1, t2 = fx.Graph(), torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 4.0])
    x = graph.placeholder("x")
    graph.output(tuple(graph.call_function(torch.add, (x, t)) for t in (t1, t2, t1)))
    return fx.GraphModule(nn.Module(), graph)


DUPLICATE_CHAINS = case(
    lambda: Program2(duplicate_chains), (5, 5), 5,
    "sin, mul, exp, sum and cat each appear twice with the same inputs once the earlier ones are merged. "
    "Walk the nodes in order, keep the first of each expression, and replace a later copy's uses at once "
    "so its users' keys name the first copy too.")
NOTHING_TO_MERGE = case(
    lambda: Program2(lambda m, x, y: (x - y, y - x, torch.sin(x), torch.sin(y), x.sum(0), x.sum(1), m.proj(x),
                                      m.proj(y)), proj=nn.Linear(6, 6)), (6, 6), 0,
    "two nodes are the same expression only if op, target, args (in order) and kwargs all match.")

KEEP_RANDOM = "a random op draws new numbers at each call: two calls are two different values."
KEEP_INPLACE = "an in-place op is a write, not a value: never merge it, and never merge across it."
EXACT_CASES: dict[str, Case] = {
    "int_and_float_constants": case(
        lambda: Program(lambda m, x: (x + 1, x + 1.0, x * 2, x * 2.0)), lambda b: (torch.randint(-5, 5, (b, 6)),), 0,
        "1 == 1.0 and hash(1) == hash(1.0), but x + 1 keeps an integer x integer and x + 1.0 does not: "
        "a key must hold each constant's type."),
    "bool_and_int_constants": case(
        lambda: Program(lambda m, x: (torch.full(x.shape, True), torch.full(x.shape, 1))), (6,), 1,
        "True == 1 and hash(True) == hash(1), but torch.full(shape, True) is a bool tensor; only the two "
        "`x.shape` reads may merge."),
    "zero_and_negative_zero": case(
        lambda: Program(lambda m, x: (torch.signbit(x * 0.0), torch.signbit(x * -0.0))), (6,), 0,
        "0.0 == -0.0 and they hash alike, but x * -0.0 flips the sign of every zero: compare floats by repr."),
    "differing_kwargs": case(
        lambda: Program(lambda m, x: (F.leaky_relu(x, negative_slope=0.1), F.leaky_relu(x, negative_slope=0.3),
                                      x.sum(dim=1, keepdim=True), x.sum(dim=1, keepdim=False),
                                      torch.softmax(x, dim=1), torch.softmax(x, dim=0))),
        lambda b: (torch.randn(b, b),), 0,
        "the keyword arguments are part of the expression: put node.kwargs into the key."),
    "random_functions": case(
        lambda: Program(lambda m, x: (torch.rand_like(x), torch.rand_like(x), torch.randn_like(x), torch.randn_like(x),
                                      torch.rand(x.shape), torch.rand(x.shape))), (6,), 1,
        KEEP_RANDOM + " Only the two `x.shape` reads may merge."),
    "dropout_function_training": case(
        lambda: Program(lambda m, x: F.dropout(x, 0.3, training=True) + F.dropout(x, 0.3, training=True)
                        - F.dropout(x, p=0.3)), (6,), 0, KEEP_RANDOM),
    "dropout_module_training": case(
        lambda: Program(lambda m, x: m.drop(x) - m.drop(x), drop=nn.Dropout(0.3).train()), (6,), 0,
        "an nn.Dropout in training mode is random: merge a call_module only for a pure module."),
    "dropout_variants_training": case(
        lambda: Program(lambda m, x: (m.alpha(x) - m.alpha(x), m.feature(x) - m.feature(x), m.drop2d(x) - m.drop2d(x)),
                        alpha=nn.AlphaDropout(0.3), feature=nn.FeatureAlphaDropout(0.3), drop2d=nn.Dropout2d(0.3)).train(),
        lambda b: (torch.randn(b, 4, 3, 3),), 0,
        "nn.AlphaDropout, nn.FeatureAlphaDropout and nn.Dropout2d draw random numbers in training mode like nn.Dropout: "
        "every dropout module (they share the base class nn.modules.dropout._DropoutNd) is random while training."),
    "batchnorm_training": case(
        lambda: Program(lambda m, x: m.bn(x) + m.bn(x), bn=nn.BatchNorm1d(6).train()), (6,), 0,
        "a BatchNorm in training mode updates its running statistics at each call: it is not pure."),
    "inplace_activation_module": case(
        lambda: Program(written_twice(lambda m, h: m.act(h)), act=nn.LeakyReLU(0.2, inplace=True)), (6,), 0,
        "a module built with inplace=True writes to its input: " + KEEP_INPLACE),
    "pure_modules_merge": case(
        lambda: Program2(lambda m, x, y: m.act(m.proj(x)) * m.act(m.proj(x)) + m.proj(y), proj=nn.Linear(6, 6),
                         act=nn.GELU()), (6, 6), 2,
        "a Linear or a GELU module computes the same output from the same input: merge those calls."),
    "inplace_between_duplicates": case(
        lambda: Program(written_between(lambda h: h.exp(), lambda m, h: h.add_(1))), (6,), 0,
        "h.exp() before h.add_(1) and h.exp() after it read different values: " + KEEP_INPLACE),
    "identical_inplace_methods": case(
        lambda: Program(written_twice(lambda m, h: h.mul_(2), lambda m, h: h.add_(0.5))), (6,), 0,
        "h.mul_(2) twice multiplies by 4, since a method ending in `_` writes to its tensor: " + KEEP_INPLACE),
    "identical_inplace_functions": case(
        lambda: Program(written_twice(lambda m, h: F.leaky_relu(h, 0.2, inplace=True), lambda m, h: torch.sigmoid_(h))),
        (6,), 0, "F.leaky_relu(h, inplace=True) and torch.sigmoid_(h) write to their input: " + KEEP_INPLACE),
    "duplicate_mutated_later": case(
        lambda: Program(written_after(lambda m, b: b.mul_(2))), (6,), 0,
        "b.mul_(2) changes b after both copies exist: merged, a would change with it. Never merge a value "
        "that some in-place op writes to."),
    "duplicate_mutated_through_view": case(
        lambda: Program(written_after(lambda m, b: b[:, :3].mul_(2))), (6,), 0,
        "b[:, :3] is a view of b: writing to it writes to b. Follow views back to the tensor they alias."),
    "write_with_out_keyword": case(
        lambda: Program(written_between(lambda h: h.exp(), lambda m, h: torch.mul(h, 2, out=h))), (6,), 0,
        "torch.mul(h, 2, out=h) writes to h as surely as h.mul_(2): an out= keyword is a write. " + KEEP_INPLACE),
    "duplicate_mutated_through_self_returning_ops": case(
        lambda: Program(written_through_self_returning_ops), (6,), 0,
        "b.contiguous(), b.detach(), b.float() and b.to(torch.float32) return b itself (or share its memory) when "
        "there is nothing to change: a write through them writes b. Follow every op that may return its input "
        "back to that input, not only views."),
    "inplace_methods_beyond_arithmetic": case(
        lambda: Program(inplace_methods_beyond_arithmetic), (6,), 0,
        "h.clamp_(...), h.exp_() and b.masked_fill_(...) write to their tensor as h.add_(1) does: every method "
        "whose name ends in a single `_` is in-place. " + KEEP_INPLACE),
    "write_through_an_alias": case(
        lambda: Program(write_through_an_alias), (6,), 0,
        "h.view(-1)[:4].add_(1) writes to h, and h.mul_(2) changes h.t() too: a view shares its base's memory. "
        "Forgetting only the keys of nodes that read the written node itself misses both: forget every key."),
    "three_copies_of_one_expression": case(
        lambda: Program(lambda m, x: (torch.sin(x * 2) + torch.sin(x * 2) * torch.sin(x * 2),
                                      x.exp() - x.exp() * x.exp() + x.exp())), (6,), 7,
        "x * 2 and sin(x * 2) appear three times, x.exp() four times: return the nodes merged away (one per "
        "copy erased), not the number of distinct expressions that absorbed copies."),
    "list_and_tuple_args": case(
        lambda: Program2(lambda m, x, y: (torch.cat([torch.sin(x), y], 1) - torch.cat([torch.sin(x), y], 1) * 2,
                                          torch.stack((x, y)) + torch.stack((x, y)),
                                          x.permute([1, 0]) * x.permute([1, 0]))), (4, 4), 4,
        "torch.cat([...]), torch.stack((...)) and x.permute([...]) take lists and tuples: a key must hold "
        "them, with the nodes inside replaced too."),
    # Returned copies: AOTAutograd's CSE leaves them apart (the caller gets two tensors, as in eager), torch.fx's
    # CSEPass merges them; only sin(x), read by both cats, must merge.
    "returned_copies": case(
        lambda: Program2(lambda m, x, y: (torch.cat([torch.sin(x), y], 1), torch.cat([torch.sin(x), y], 1),
                                          torch.stack((x, y)), torch.stack((x, y)))), (4, 4), (1, 3),
        "sin(x) is read by both cats and returned by neither: it merges. The cats and the stacks are returned: "
        "leaving them apart (as AOTAutograd's fx_graph_cse does) and merging them are both accepted.",
        fresh_outputs=False),
    # The op kind is part of the expression: x.neg() is a call_method with target "neg", a submodule installed as
    # `neg` is a call_module with the same target string.
    "method_and_module_of_one_name": case(
        lambda: Program(lambda m, x: x.neg() * 2 + m.neg(x) * 2, neg=nn.Linear(6, 6)), (6,), 0,
        "x.neg() (call_method, target 'neg') and self.neg(x) (call_module of a Linear named 'neg', target 'neg') "
        "share target and arguments: put node.op into the key."),
    # Modules that are pure in the state they are in: their calls merge.
    "eval_mode_modules_merge": case(
        lambda: Program(lambda m, x: m.drop(x) + m.drop(x) * m.bn(x) - m.bn(x) + m.batch_stats(x) * m.batch_stats(x),
                        drop=nn.Dropout(0.3).eval(), bn=nn.BatchNorm1d(6).eval(),
                        batch_stats=nn.BatchNorm1d(6, track_running_stats=False)), (6,), 3,
        "an nn.Dropout in eval mode returns its input, a BatchNorm in eval mode only reads its running statistics, "
        "and one built with track_running_stats=False has none to update: all three are pure, so their calls "
        "merge. Look at the module's `training` and `track_running_stats`."),
    "kwargs_in_any_order": case(
        lambda: Program(lambda m, x: x.sum(dim=1, keepdim=True) * x.sum(keepdim=True, dim=1)
                        + torch.clamp(x, min=-0.5, max=0.5) - torch.clamp(x, max=0.5, min=-0.5)), (6,), 2,
        "f(x, a=1, b=2) and f(x, b=2, a=1) are one call: symbolic_trace keeps keyword arguments in the order the "
        "source wrote them, so a key must not depend on it (sort them by name)."),
    "slice_args": case(
        lambda: Program(lambda m, x: (x[:, 0:2] * 2, x[:, 0:2] * 2, x[:, 1:3] * 2)), (6,), (0, 2),
        "x[:, 0:2] holds slice objects, unhashable before Python 3.12: the pass must not crash on them "
        "(merging the two equal ones is optional; merging the different one is wrong)."),
    "tensor_constant_args": case(  # a GraphModule already: not traced again
        tensor_constant_args, None, (0, 1),
        "a tensor argument is compared by identity at most; `t1 == t2` is elementwise and raises inside `if`.",
        trace=lambda gm: gm, compare=None),
}

# The L3 benchmark, a gated unit: the same 1024x1024 Linear called three times on the same 128 rows (a
# common result of inlining helpers). Reference 2.47x-2.71x on CPU single-threaded (ideal 3x), a no-op
# 0.96x-1.12x (README, "Measured speedups"). The CUDA threshold is a guess: not measured on a GPU.
BENCHMARK = Case(lambda: Program(lambda m, x: torch.sigmoid(m.proj(x)) * torch.tanh(m.proj(x)) + F.gelu(m.proj(x)),
                                 proj=nn.Linear(1024, 1024)),
                 lambda rows: (torch.randn(rows, 1024),), mode="eval", batch_sizes=(128,))


# ----------------------------------------------------------------------------------------------
# Hidden models (L4): chains of random steps, spelled at random, in blocks that must merge, must not
# merge, or merge only a prefix. The generator counts the merges a correct pass makes.

def random_step(rng: random.Random) -> tuple[Callable, Callable]:
    """A pure elementwise step with random constants, spelled as a method or a function at random, and its
    near twin: the same call but for one detail (a constant's type, a keyword, the op)."""
    method, n, c = rng.random() < 0.5, rng.choice([2, 3]), rng.choice([0.1, 0.2, 0.3])

    def op(name: str, *args, **kwargs) -> Callable:  # h.name(*args) or torch.name(h, *args)
        return lambda h: getattr(h, name)(*args, **kwargs) if method else getattr(torch, name)(h, *args, **kwargs)

    def clamp_both(low: float, high: float) -> Callable:
        """clamp(h, min=low, max=high), its keywords in the other order at every other call: copies still merge."""
        calls = itertools.count()

        def step(h):
            kwargs = {"min": low, "max": high} if next(calls) % 2 else {"max": high, "min": low}
            return h.clamp(**kwargs) if method else torch.clamp(h, **kwargs)
        return step

    return rng.choice([
        (op("sin"), op("cos")), (op("tanh"), op("sigmoid")), (op("sigmoid"), op("tanh")),
        (op("mul", n), op("mul", float(n))), (lambda h: h * n, lambda h: h * float(n)),
        (op("add", n), op("add", float(n))), (lambda h: h + n, lambda h: h + float(n)),
        (op("clamp", min=c), op("clamp", max=c)),
        (lambda h: F.leaky_relu(h, negative_slope=c), lambda h: F.leaky_relu(h, negative_slope=c + 0.5)),
        (lambda h: F.softplus(h, beta=1 + c), lambda h: F.softplus(h, beta=1.5 + c)),
        (clamp_both(-c, c), clamp_both(-c, c + 0.5)),
    ])


def chain(steps: list[Callable], h):
    return reduce(lambda value, step: step(value), steps, h)


# Random draws and pure modules: those no visible model calls come first. A generated model holds a block of each
# kind (hidden_case), and each such block one of those first ones, so a pass that knows only the visible models'
# random ops or pure modules fails the hidden level at every seed, not at one in four.
UNSEEN_DRAWS = [lambda h: torch.randint_like(h, 3), lambda h: torch.normal(h, 0.5), lambda h: torch.bernoulli(h, 0.5),
                lambda h: F.alpha_dropout(h, 0.25, training=True)]
RANDOM_DRAWS = UNSEEN_DRAWS + [lambda h: torch.rand_like(h), lambda h: torch.randn_like(h),
                               lambda h: F.dropout(h, 0.25, training=True)]
UNSEEN_PURE = [nn.Tanh, nn.SiLU]
PURE = UNSEEN_PURE + [nn.GELU, lambda width: nn.Dropout(0.25).eval(), lambda width: nn.BatchNorm1d(width).eval(),
                      lambda width: nn.BatchNorm1d(width, track_running_stats=False)]
# In-place writes in every spelling, with a random constant c; None: an nn.LeakyReLU(inplace=True) module.
WRITES = [lambda t, c: t.add_(c), lambda t, c: t.mul_(c), lambda t, c: torch.sigmoid_(t),
          lambda t, c: F.leaky_relu(t, 0.2, inplace=True), lambda t, c: t.clamp_(max=c), lambda t, c: t.tanh_(),
          lambda t, c: t.masked_fill_(t > c, 0.0), None]
# What a write (or a read) goes through: the tensor itself, or a view of a view of it (of the same shape).
ALIASES = [lambda t: t, lambda t: t, lambda t: t[:, :], lambda t: t.t().t(), lambda t: t.unsqueeze(0)[0],
           lambda t: t.view(-1).view_as(t)]


# Tensor methods that a submodule may be named after: x.neg() is call_method 'neg', self.neg(x) call_module 'neg'.
METHOD_NAMES = ["neg", "sin", "cos", "tanh", "sigmoid", "exp", "abs", "relu"]


BLOCK_KINDS = ["dup_chain", "dup_chain", "near_miss", "near_miss", "random", "inplace_between", "inplace_twice",
               "mutated_later", "pure_module", "impure_module", "named_like_a_method"]
IN_EVERY_MODEL = ["random", "pure_module"]


def pure_module(width: int, make) -> nn.Module:
    """An instance of a PURE entry: a module class (built without arguments) or a function of the width."""
    return make() if isinstance(make, type) else make(width)


def hidden_block(rng: random.Random, kind: str, width: int, modules: dict[str, nn.Module]) -> tuple[str, Callable, int]:
    """(kind, forward (model, h) -> h, the merges a correct pass makes in it)."""
    pairs = [random_step(rng) for _ in range(rng.randint(1, 3))]
    steps = [step for step, _ in pairs]

    def module_at_random_path(module: nn.Module) -> Callable:
        path = random_path(rng, 2, len(modules))
        modules[path] = module
        return lambda m, t: m.get_submodule(path)(t)

    if kind == "dup_chain":  # two or three copies: each later copy merges len(steps) nodes away
        copies = rng.choice([2, 3])
        return kind, lambda m, h: sum((chain(steps, h) for _ in range(copies - 1)), chain(steps, h) * 0.5), \
            len(steps) * (copies - 1)
    if kind == "near_miss":  # only the steps before the twin merge
        differ_at = rng.randrange(len(pairs))
        other = steps[:differ_at] + [pairs[differ_at][1]] + steps[differ_at + 1:]
        return kind, lambda m, h: chain(steps, h) - chain(other, h), differ_at
    if kind == "random":  # two draws, one of them no visible model calls; each called twice
        draws, c = [rng.choice(UNSEEN_DRAWS), rng.choice(RANDOM_DRAWS)], rng.choice([0.5, 2.0])
        rng.shuffle(draws)
        return kind, lambda m, h: reduce(operator.add, (draw(h) * c - draw(h) for draw in draws), h), 0
    if kind in ("inplace_between", "inplace_twice", "mutated_later"):
        write, c = rng.choice(WRITES), rng.choice([0.5, 1.5, 2.0])
        alias, view = rng.choice(ALIASES), rng.choice(ALIASES)
        module = module_at_random_path(nn.LeakyReLU(0.2, inplace=True)) if write is None else None
        write_to = (lambda m, t: module(m, alias(t))) if module else (lambda m, t: write(alias(t), c))
        forward = {"inplace_between": written_between(lambda h: chain(steps, h), write_to, view),
                   "inplace_twice": written_twice(write_to), "mutated_later": written_after(write_to, steps[0])}[kind]
        return kind, lambda m, h: reduce(operator.add, forward(m, h)), 0
    if kind == "named_like_a_method":  # h.<name>() and a Linear installed as self.<name>: nothing merges
        name = rng.choice([name for name in METHOD_NAMES if name not in modules] or [random_path(rng, 1, len(modules))])
        modules[name] = nn.Linear(width, width)
        method = rng.random() < 0.5
        return kind, lambda m, h: (getattr(h, name)() if method else m.get_submodule(name)(h)) * 0.5 + \
            (m.get_submodule(name)(h) if method else getattr(h, name)()), 0
    if kind == "pure_module":  # in the state it is in: eval-mode Dropout and BatchNorm are pure, so is a
        # BatchNorm without running statistics in training mode. A Linear, then two such modules, one of them of a
        # kind no visible model calls: the copy of all three merges
        lin = module_at_random_path(nn.Linear(width, width))
        acts = [module_at_random_path(pure_module(width, make))
                for make in rng.sample([rng.choice(UNSEEN_PURE), rng.choice(PURE)], 2)]
        return kind, lambda m, h: chain([lambda t, act=act: act(m, t) for act in acts], lin(m, h)) * 1.5 + \
            chain([lambda t, act=act: act(m, t) for act in acts], lin(m, h)), 3
    module = rng.choice([nn.Dropout(0.25), nn.BatchNorm1d(width), nn.LeakyReLU(0.2, inplace=True)]).train()
    impure = module_at_random_path(module)
    # Only the two h * 1.5 merge, unless the module writes to them (an inplace LeakyReLU).
    return kind, lambda m, h: impure(m, h * 1.5) - impure(m, h * 1.5) * 0.5, int(not isinstance(module, nn.LeakyReLU))


def hidden_case(rng: random.Random) -> Case:
    width = rng.choice([5, 8, 12, 16])
    modules: dict[str, nn.Module] = {}
    kinds = [rng.choice(BLOCK_KINDS) for _ in range(rng.randint(4, 7))]
    missing = [kind for kind in IN_EVERY_MODEL if kind not in kinds]
    free = [place for place, kind in enumerate(kinds) if kind not in IN_EVERY_MODEL]
    for place, kind in zip(rng.sample(free, len(missing)), missing):
        kinds[place] = kind
    blocks = [hidden_block(rng, kind, width, modules) for kind in kinds]

    def forward(m, h):
        for _, block, _ in blocks:
            h = block(m, h)
        return h

    kinds = ", ".join(kind for kind, _, _ in blocks)
    return case(lambda: Program(forward, **modules), (width,), sum(merges for _, _, merges in blocks),
                f"a generated model of blocks ({kinds}): the pass must work for any op, spelling and name.")
