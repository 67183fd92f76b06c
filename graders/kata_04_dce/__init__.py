"""Grader for kata 04: dead-code elimination that keeps every side effect."""
from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from operator import setitem
from typing import Callable

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._pytree import tree_map

from graders.core import CheckFailed, Context, Kata
from graders.models import nest_under, random_identifier
from graders.numerics import ATOL, RTOL, run_module
from graders.structure import assert_valid_graph_module, before_after, graph_table
from graders.timing import assert_speedup

# symbolic_trace cannot trace `y[i] = v` (a Proxy has no __setitem__); a wrapped setitem records an
# operator.setitem node, which is what torch.compile and torch.export graphs contain.
fx.wrap("setitem")

KATA = Kata("04_dce", api={
    "eliminate_dead_code": "eliminate_dead_code(gm: torch.fx.GraphModule) -> int (the number of nodes removed)",
})

# The L3 benchmark: one Linear on the live path, a three-Linear auxiliary head whose result is never
# returned. Reference median 4.0x-4.3x on CPU single-threaded, a no-op 0.95x-1.02x (README). The CUDA
# threshold is unmeasured (no GPU here): there the small head is launch-bound and the gain is smaller.
SPEEDUP_THRESHOLDS = {"cpu": 2.5, "cuda": 1.8}
BENCHMARK_BATCH, BENCHMARK_WIDTH = 64, 512

WIDTH = 6
BATCH_SIZES = (2, 3)  # at least 2: a BatchNorm in training mode rejects a batch of one


# ----------------------------------------------------------------------------------------------
# Running a model and recording everything it can change: outputs, its inputs (mutated in place),
# its parameters and buffers, and the random-number generator.

def rng_state(device: torch.device) -> torch.Tensor:
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


@dataclass
class Effects:
    output: object
    inputs_after: tuple
    state_after: dict[str, torch.Tensor]
    rng_after: torch.Tensor


def run_recording(module: Callable, owner: nn.Module, inputs: tuple, seed: int, device: torch.device,
                  what: str) -> Effects:
    """Run on private copies of `inputs` from a fixed RNG seed; `owner` holds the state it may change."""
    inputs = tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, inputs)
    torch.manual_seed(seed)
    output = run_module(module, inputs, what)
    state = {k: v.detach().clone() for k, v in owner.state_dict().items()}
    return Effects(output, inputs, state, rng_state(device).clone())


def assert_same_effects(pristine: nn.Module, traced_model: nn.Module, gm: fx.GraphModule,
                        inputs_list: list[tuple], device: torch.device, *, before: fx.GraphModule, hint: str):
    """Outputs, mutated inputs, parameters, buffers and RNG state must all match the original's.

    `traced_model` is the model that was traced: the GraphModule shares its submodules and tensors,
    so a buffer the GraphModule mutates is read back from there.
    """
    graphs = before_after(before, gm)
    for index, inputs in enumerate(inputs_list):
        seed = 1000 + index
        want = run_recording(pristine, pristine, inputs, seed, device, "the original model")
        got = run_recording(gm, traced_model, inputs, seed, device, "the module after eliminate_dead_code")
        try:
            torch.testing.assert_close(got.output, want.output, rtol=RTOL, atol=ATOL)
        except AssertionError as exc:
            detail = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
            raise CheckFailed(f"after eliminate_dead_code the module returns something else than the original: "
                              f"{detail} Hint: {hint}{graphs}") from None
        for position, (g, w) in enumerate(zip(got.inputs_after, want.inputs_after)):
            if isinstance(w, torch.Tensor) and not torch.equal(g, w):
                raise CheckFailed(f"the original model changes its input #{position} in place, the module after "
                                  f"eliminate_dead_code leaves it {'unchanged' if torch.equal(g, inputs[position]) else 'different'}. "
                                  f"A node that mutates a tensor the caller can see must stay. Hint: {hint}{graphs}")
        for name, w in want.state_after.items():
            if not torch.equal(got.state_after[name], w):
                raise CheckFailed(f"after one forward call, the model's {name!r} differs from the original's: "
                                  f"the original updates it, the node that did so was removed. Hint: {hint}{graphs}")
        if not torch.equal(got.rng_after, want.rng_after):
            raise CheckFailed("after one forward call, the random-number generator is in a different state than "
                              "after the original: a node that draws random numbers was removed, so every later "
                              f"random draw shifts. Hint: {hint}{graphs}")


# ----------------------------------------------------------------------------------------------
# The check every case goes through.

@dataclass
class Case:
    build: Callable[[], nn.Module]
    removed: tuple[int, ...]   # the node counts a correct pass may remove (several where get_attr may go)
    hint: str
    make_inputs: Callable[[int, torch.device], tuple] = lambda batch, device: (torch.randn(batch, WIDTH, device=device),)
    trace: Callable[[nn.Module], fx.GraphModule] = fx.symbolic_trace


def call_pass(ctx: Context, gm: fx.GraphModule, which: str) -> int:
    removed = ctx.call("eliminate_dead_code", gm, returns=int)
    if isinstance(removed, bool):
        raise CheckFailed(f"eliminate_dead_code returned {removed} ({which}), a bool like Graph.eliminate_dead_code's "
                          "'changed'; the kata asks for the number of nodes removed.")
    return removed


def check_case(ctx: Context, case: Case) -> dict:
    model = case.build().to(ctx.device)
    pristine = copy.deepcopy(model)
    before = case.trace(copy.deepcopy(model))
    gm = case.trace(model)
    nodes_before = len(gm.graph.nodes)
    removed = call_pass(ctx, gm, "on the first call")
    assert_valid_graph_module(gm, "eliminate_dead_code")
    actually_removed = nodes_before - len(gm.graph.nodes)
    if removed != actually_removed:
        raise CheckFailed(f"eliminate_dead_code returned {removed}, but the graph went from {nodes_before} to "
                          f"{len(gm.graph.nodes)} nodes: it removed {actually_removed}. Count each erase_node."
                          + before_after(before, gm))

    placeholders = lambda g: [n.name for n in g.graph.nodes if n.op == "placeholder"]  # noqa: E731
    if placeholders(gm) != placeholders(before):
        raise CheckFailed(f"the placeholders were {placeholders(before)}, after eliminate_dead_code they are "
                          f"{placeholders(gm)}: an unused input is still part of forward's signature, and callers "
                          "pass it. Never erase a placeholder." + before_after(before, gm))

    inputs = [case.make_inputs(batch, ctx.device) for batch in BATCH_SIZES for _ in range(2)]
    assert_same_effects(pristine, model, gm, inputs, ctx.device, before=before, hint=case.hint)

    if actually_removed not in case.removed:
        expected = " or ".join(map(str, case.removed))
        raise CheckFailed(f"eliminate_dead_code removed {actually_removed} node(s); this model has {expected} "
                          f"node(s) that are dead and free of side effects. Hint: {case.hint}" + before_after(before, gm))

    graph_after_first = graph_table(gm)
    again = call_pass(ctx, gm, "on the second call")
    if again != 0 or graph_table(gm) != graph_after_first:
        raise CheckFailed(f"a second call of eliminate_dead_code on its own result removed {again} more node(s): "
                          "the first call must remove every dead node, whole dead chains included. Hint: walk "
                          "the graph so that a node's users are visited before the node.")
    return {"nodes_before": nodes_before, "nodes_removed": actually_removed}


# ----------------------------------------------------------------------------------------------
# Level 1: plain dead chains.

class DeadChain(nn.Module):
    def forward(self, x):
        y = torch.tanh(x) * 3
        unused = torch.sigmoid(x)
        unused = unused * 2 + 1
        unused = unused.sum(dim=1)
        return y + 1


class DeadTree(nn.Module):
    """A dead value that forks and joins again: it dies only once both of its users have gone."""

    def forward(self, x):
        live = x.cos() - x
        shared = x.exp()
        left, right = shared + 1, shared.neg()
        joined = torch.maximum(left, right)
        joined.mean()
        return live


CHAIN_HINT = ("a node is dead when nothing uses its result; erasing it can make its inputs dead in turn, "
              "so visit every user before the node it uses.")


@KATA.check(level=1)
def dead_chain(ctx: Context):
    return check_case(ctx, Case(DeadChain, (4,), CHAIN_HINT))


@KATA.check(level=1)
def dead_tree(ctx: Context):
    return check_case(ctx, Case(DeadTree, (5,), CHAIN_HINT))


# ----------------------------------------------------------------------------------------------
# Level 2: the zoo. Each model has its dead nodes and the traps a naive pass falls into.

class UnusedInput(nn.Module):
    def forward(self, x, mask):
        x.abs().max()
        return x * 2


class UsesInsideList(nn.Module):
    def forward(self, x):
        a, b = x.sin(), x.cos()
        x.exp()
        return torch.cat([a, b], dim=1)


class UsesInsideKwargs(nn.Module):
    def forward(self, x):
        a = x.sin()
        x.exp()
        return torch.add(x, other=a, alpha=2)


class NestedOutput(nn.Module):
    def forward(self, x):
        a, b, c = x.sin(), x.cos(), x.exp()
        x.tan()
        return {"main": a, "extras": (b, [c])}


class InplaceMethod(nn.Module):
    def forward(self, x):
        y = x * 2
        y.add_(1)
        y.mul_(3)
        y.sum()
        return y


class InplaceOnInput(nn.Module):
    """Updates the caller's running-average tensor and returns something else."""

    def forward(self, x, running):
        running.mul_(0.9).add_(x.mean(dim=0), alpha=0.1)
        x.sum()
        return x * 2


class MutationThroughView(nn.Module):
    """The mutated views have no user after the in-place op, but their base tensor is returned."""

    def forward(self, x):
        y = x * 1.5
        head = y[:, :2]
        head.zero_()
        y.narrow(1, 3, 2).mul_(-1)
        return y


class InplaceKeyword(nn.Module):
    def forward(self, x):
        y = x - 0.5
        F.relu(y, inplace=True)
        return y


class InplacePositional(nn.Module):
    def forward(self, x):
        y = x * 4
        F.hardtanh(y, -1.0, 1.0, True)
        return y


class InplaceTorchFunction(nn.Module):
    def forward(self, x):
        y = x + 0.25
        torch.relu_(y)
        torch.sigmoid_(y)
        return y


def trace_with_positional_arguments(model: nn.Module) -> fx.GraphModule:
    """symbolic_trace passes a torch.nn.functional call's options as keywords; graphs built by hand or by
    other passes (graph.call_function(F.hardtanh, (y, -1.0, 1.0, True))) pass them by position."""
    gm = fx.symbolic_trace(model)
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is F.hardtanh:
            node.args = (*node.args, node.kwargs["min_val"], node.kwargs["max_val"], node.kwargs["inplace"])
            node.kwargs = {}
    gm.recompile()
    return gm


class InplaceModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = nn.LeakyReLU(0.1, inplace=True)

    def forward(self, x):
        y = x * 2
        self.act(y)
        return y


class OutKeyword(nn.Module):
    def forward(self, x):
        buffer = torch.zeros_like(x)
        torch.mul(x, 3, out=buffer)
        x.exp()
        return buffer + 1


class SetItem(nn.Module):
    def forward(self, x):
        y = x * 2
        setitem(y, (slice(None), 0), -7.0)
        return y


class RandomFunction(nn.Module):
    def forward(self, x):
        torch.randn_like(x)
        return x + 0.1 * torch.rand_like(x)


class DropoutFunction(nn.Module):
    def forward(self, x):
        F.dropout(x, 0.5, training=True)
        return x * 2


class DropoutModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.3)  # nn.Module starts in training mode

    def forward(self, x):
        self.drop(x)
        return x * 2


class BatchNormTraining(nn.Module):
    """Nothing uses the BN's output, but in training mode every call updates its running statistics."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(WIDTH)

    def forward(self, x):
        self.bn(x)
        return x * 2


class StateMutation(nn.Module):
    """A call counter. It is a frozen Parameter, not a buffer: symbolic_trace records reads of
    parameters as get_attr nodes but runs buffer code eagerly at trace time (torch.export records both)."""

    def __init__(self):
        super().__init__()
        self.calls = nn.Parameter(torch.zeros(()), requires_grad=False)

    def forward(self, x):
        self.calls.add_(1)
        return x * 2


class UnusedParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(WIDTH))

    def forward(self, x):
        self.weight * 2
        return x + 1


class DeadSubmodule(nn.Module):
    def __init__(self):
        super().__init__()
        self.live, self.aux_head = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, 3)

    def forward(self, x):
        torch.relu(self.aux_head(x))
        return self.live(x)


INPLACE = "an in-place op changes a tensor that others read; its own result being unused does not make it dead."
RANDOM = "a node that draws random numbers advances the generator; removing it shifts every later draw."


def _with_running(batch, device):
    return torch.randn(batch, WIDTH, device=device), torch.randn(WIDTH, device=device)


def _with_mask(batch, device):
    return torch.randn(batch, WIDTH, device=device), torch.rand(batch, WIDTH, device=device) > 0.5


EXACT_CASES: dict[str, Case] = {
    "unused_input": Case(UnusedInput, (2,), "a placeholder is an argument of forward: it stays even when unused.",
                         _with_mask),
    "uses_inside_list": Case(UsesInsideList, (1,), "torch.cat([a, b]) uses a and b: node.users sees uses inside "
                             "lists, tuples and dicts, a scan of node.args for Nodes does not."),
    "uses_inside_kwargs": Case(UsesInsideKwargs, (1,), "torch.add(x, other=a) uses a through its kwargs."),
    "nested_output": Case(NestedOutput, (1,), "the output node's argument is a nested structure; everything "
                          "inside it is live."),
    "inplace_method": Case(InplaceMethod, (1,), "y.add_(1) is a call_method node: " + INPLACE),
    "inplace_on_input": Case(InplaceOnInput, (1,), "running.mul_(...).add_(...) updates the caller's tensor: "
                             + INPLACE, _with_running),
    "mutation_through_view": Case(MutationThroughView, (0,), "y[:, :2] and y.narrow(...) are views of y: "
                                  "mutating a view mutates y, even though the view itself is never read again."),
    "inplace_keyword": Case(InplaceKeyword, (0,), "F.relu(y, inplace=True) mutates y: " + INPLACE),
    "inplace_positional": Case(InplacePositional, (0,), "this graph calls F.hardtanh(y, -1.0, 1.0, True): the "
                               "fourth positional argument is inplace. Bind the call to the function's signature "
                               "(inspect.signature(fn).bind(*args, **kwargs)).",
                               trace=trace_with_positional_arguments),
    "inplace_torch_function": Case(InplaceTorchFunction, (0,), "torch.relu_ and torch.sigmoid_ are call_function "
                                   "nodes whose name ends in '_': " + INPLACE),
    "inplace_module": Case(InplaceModule, (0,), "nn.LeakyReLU(inplace=True) mutates its input: look at the "
                           "module of a call_module node, too."),
    "out_keyword": Case(OutKeyword, (1,), "torch.mul(x, 3, out=buffer) writes into buffer and its own result "
                        "is unused; the write is the point."),
    "setitem": Case(SetItem, (0,), "operator.setitem (y[:, 0] = v) returns nothing and mutates y."),
    "random_function": Case(RandomFunction, (0,), RANDOM),
    "dropout_function": Case(DropoutFunction, (0,), "F.dropout(training=True) draws a random mask: " + RANDOM),
    "dropout_module": Case(DropoutModule, (0,), "an nn.Dropout in training mode draws a random mask: " + RANDOM),
    "batchnorm_training": Case(BatchNormTraining, (0,), "a BatchNorm in training mode updates running_mean, "
                               "running_var and num_batches_tracked on every call."),
    "state_mutation": Case(StateMutation, (0,), "self.calls.add_(1) updates the model's state: " + INPLACE),
    "unused_parameter": Case(UnusedParameter, (1, 2), "self.weight * 2 is dead; reading the parameter "
                             "(get_attr) has no side effect, so it may go too."),
    "dead_submodule": Case(DeadSubmodule, (2,), "a call of an nn.Linear has no side effect: a dead one must go."),
}

for _name, _case in EXACT_CASES.items():
    KATA.add(2, _name, lambda ctx, case=_case: check_case(ctx, case))


# ----------------------------------------------------------------------------------------------
# Level 3: a model that computes an expensive auxiliary head and never returns it.

class ModelWithStaleHead(nn.Module):
    """The classic leftover: an auxiliary head whose loss was removed, still computed in forward."""

    def __init__(self, width: int):
        super().__init__()
        self.body = nn.Linear(width, width)
        self.aux = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width), nn.GELU(),
                                 nn.Linear(width, width))

    def forward(self, x):
        features = torch.tanh(self.body(x))
        aux_logits = self.aux(features)
        aux_logits.softmax(dim=-1)
        return features


@KATA.check(level=3)
def stale_aux_head_speedup(ctx: Context):
    model = ModelWithStaleHead(BENCHMARK_WIDTH).eval().to(ctx.device)
    baseline = fx.symbolic_trace(copy.deepcopy(model))
    candidate = fx.symbolic_trace(model)
    call_pass(ctx, candidate, "on the benchmark model")
    assert_valid_graph_module(candidate, "eliminate_dead_code")
    return assert_speedup(ctx, baseline, candidate,
                          lambda: (torch.randn(BENCHMARK_BATCH, BENCHMARK_WIDTH, device=ctx.device),),
                          SPEEDUP_THRESHOLDS, what="the module after eliminate_dead_code",
                          hint="the auxiliary head (three Linears, two GELUs, a softmax) is never returned: "
                               "all of it is dead.")


# ----------------------------------------------------------------------------------------------
# Level 4: models generated from the seed. Each step of the forward is live, dead or a side effect;
# the generator counts the dead nodes it emits.

PURE_OPS: list[Callable[[float], Callable]] = [
    lambda c: lambda u: torch.tanh(u),
    lambda c: lambda u: u.sigmoid(),
    lambda c: lambda u: u * c,
    lambda c: lambda u: F.gelu(u),
    lambda c: lambda u: c - u,
    lambda c: lambda u: u.clamp(min=-c),
]

# In-place spellings, each (nodes it emits, function of (net, v, c, name)). All stay.
INPLACE_OPS: list[tuple[int, Callable]] = [
    (1, lambda net, v, c, name: v.add_(c)),
    (1, lambda net, v, c, name: v.sub_(c)),
    (1, lambda net, v, c, name: v.mul_(c)),
    (1, lambda net, v, c, name: v.div_(c + 1)),
    (1, lambda net, v, c, name: v.clamp_(-c, c)),
    (1, lambda net, v, c, name: v.tanh_()),
    (1, lambda net, v, c, name: v.sigmoid_()),
    (1, lambda net, v, c, name: v.abs_()),
    (1, lambda net, v, c, name: torch.relu_(v)),
    (1, lambda net, v, c, name: torch.tanh_(v)),
    (1, lambda net, v, c, name: F.relu(v, inplace=True)),
    (1, lambda net, v, c, name: F.leaky_relu(v, c / 10, True)),
    (1, lambda net, v, c, name: F.hardtanh(v, -c, c, inplace=True)),
    (1, lambda net, v, c, name: F.elu(v, c, True)),
    (1, lambda net, v, c, name: torch.mul(v, c, out=v)),
    (1, lambda net, v, c, name: torch.clamp(v, -c, c, out=v)),
    (1, lambda net, v, c, name: setitem(v, (slice(None), 1), c)),
    (2, lambda net, v, c, name: v[:, :2].mul_(-c)),
    (2, lambda net, v, c, name: v.narrow(1, 1, 2).zero_()),
    (1, lambda net, v, c, name: net.get_submodule(name)(v)),  # an inplace activation module
]
INPLACE_MODULES = [lambda: nn.ReLU(inplace=True), lambda: nn.Hardtanh(inplace=True),
                   lambda: nn.SiLU(inplace=True), lambda: nn.LeakyReLU(0.2, inplace=True)]

RANDOM_OPS: list[Callable] = [
    lambda net, v, c, name: torch.rand_like(v),
    lambda net, v, c, name: torch.randn_like(v),
    lambda net, v, c, name: F.dropout(v, c / 4, training=True),
    lambda net, v, c, name: torch.bernoulli(torch.full_like(v, 0.5)),
    lambda net, v, c, name: torch.empty_like(v).uniform_(),
    lambda net, v, c, name: net.get_submodule(name)(v),  # an nn.Dropout in training mode
]

# How a live value feeds the next one through a list, a tuple or a keyword argument.
NESTED_USES: list[Callable] = [
    lambda v, aux: torch.stack([v, aux]).mean(dim=0),
    lambda v, aux: torch.cat((aux, v), dim=1)[:, WIDTH // 2 : WIDTH + WIDTH // 2],
    lambda v, aux: torch.add(v, other=aux, alpha=0.5),
]


@dataclass
class Step:
    kind: str
    run: Callable          # (net, v) -> new v
    dead: int = 0          # nodes a correct pass must remove
    may_go: int = 0        # get_attr nodes it may remove besides


class HiddenNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.steps: list[Step] = []
        self.uses_second_input = False
        self.output_style = "plain"

    def forward(self, x, extra):
        v = x * 1.0
        if self.uses_second_input:
            v = v + extra
        for step in self.steps:
            v = step.run(self, v)
        if self.output_style == "tuple":
            return (v,)
        if self.output_style == "nested":
            return {"out": (v, [v.sum(dim=1)])}
        return v


def _module_path(net: HiddenNet, rng: random.Random, module: nn.Module) -> str:
    """A unique dotted path for `module`, one to three levels deep."""
    path = ".".join(random_identifier(rng) for _ in range(rng.randint(1, 3))) + f"_{len(net.steps)}"
    nest_under(net, path, module)
    return path


def _dead_chain(net: HiddenNet, rng: random.Random) -> Step:
    ops = [rng.choice(PURE_OPS)(rng.uniform(0.5, 2.0)) for _ in range(rng.randint(1, 4))]
    linear = _module_path(net, rng, nn.Linear(WIDTH, WIDTH)) if rng.random() < 0.5 else None
    param = None
    if rng.random() < 0.5:
        param = f"{random_identifier(rng)}_{len(net.steps)}"
        net.register_parameter(param, nn.Parameter(torch.randn(WIDTH)))

    def run(net, v):
        u = v
        for op in ops:
            u = op(u)
        if linear:
            u = net.get_submodule(linear)(u)
        if param:
            u = u * getattr(net, param)
        u.sum()  # the chain ends unused
        return v

    return Step("dead_chain", run, dead=len(ops) + bool(linear) + bool(param) + 1, may_go=bool(param))


def _live(net: HiddenNet, rng: random.Random) -> Step:
    if rng.random() < 0.3:
        linear = _module_path(net, rng, nn.Linear(WIDTH, WIDTH))
        return Step("live", lambda net, v: net.get_submodule(linear)(v))
    op = rng.choice(PURE_OPS)(rng.uniform(0.5, 2.0))
    return Step("live", lambda net, v: op(v))


def _inplace(net: HiddenNet, rng: random.Random) -> Step:
    index = rng.randrange(len(INPLACE_OPS))
    _, op = INPLACE_OPS[index]
    name = _module_path(net, rng, rng.choice(INPLACE_MODULES)()) if index == len(INPLACE_OPS) - 1 else None
    c = rng.uniform(0.5, 2.0)

    def run(net, v):
        op(net, v, c, name)
        return v

    return Step("inplace", run)


def _random(net: HiddenNet, rng: random.Random) -> Step:
    index = rng.randrange(len(RANDOM_OPS))
    name = _module_path(net, rng, nn.Dropout(rng.uniform(0.1, 0.5))) if index == len(RANDOM_OPS) - 1 else None
    c = rng.uniform(0.5, 2.0)

    def run(net, v):
        RANDOM_OPS[index](net, v, c, name)
        return v

    return Step("random", run)


def _batchnorm(net: HiddenNet, rng: random.Random) -> Step:
    name = _module_path(net, rng, nn.BatchNorm1d(WIDTH))

    def run(net, v):
        net.get_submodule(name)(v)
        return v

    return Step("batchnorm_training", run)


def _nested_use(net: HiddenNet, rng: random.Random) -> Step:
    aux_op = rng.choice(PURE_OPS)(rng.uniform(0.5, 2.0))
    combine = rng.choice(NESTED_USES)
    return Step("nested_use", lambda net, v: combine(v, aux_op(v)))


STEP_MAKERS = [_live, _live, _dead_chain, _dead_chain, _inplace, _inplace, _random, _batchnorm, _nested_use]


def hidden_case(rng: random.Random) -> Case:
    net = HiddenNet()
    net.uses_second_input = rng.random() < 0.5
    net.output_style = rng.choice(["plain", "tuple", "nested"])
    for _ in range(rng.randint(6, 12)):
        net.steps.append(rng.choice(STEP_MAKERS)(net, rng))
    if not any(step.kind == "dead_chain" for step in net.steps):
        net.steps.insert(rng.randrange(len(net.steps) + 1), _dead_chain(net, rng))
    dead = sum(step.dead for step in net.steps)
    may_go = sum(step.may_go for step in net.steps)
    return Case(lambda: copy.deepcopy(net), tuple(range(dead, dead + may_go + 1)),
                "the pass must keep every side effect and remove every dead node, whatever the spelling.",
                lambda batch, device: (torch.randn(batch, WIDTH, device=device),
                                       torch.randn(batch, WIDTH, device=device)))


for _index in range(1, 6):
    KATA.add(4, f"model_{_index}", lambda ctx: check_case(ctx, hidden_case(random.Random(ctx.seed))))
