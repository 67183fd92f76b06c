"""Grader for kata 10: a harness that verifies any graph pass.

Here the learner writes the verifier and the grader supplies the passes: a battery whose truth is
known (correct passes, and wrong ones that each hide from all but one check), and the learner's
`verify_pass` must classify every one of them. tests/test_mutants_10_verify_harness.py proves each
wrong pass really is subtle: it slips past every check but the one named for it.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import io
import math
import operator
import random
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from graders.core import CheckFailed, Context, Kata, load_solution
from graders.katas import REPO_ROOT
from graders.models import nest_under, random_identifier
from graders.timing import measure_speedup

KATA = Kata("10_verify_harness", api={
    "verify_pass": "verify_pass(model, pass_fn, example_inputs, *, atol=1e-5, rtol=1e-5, n_samples=10) -> dict "
                   "with bools 'numerical', 'gradient', 'lint', 'params' and a float 'speedup'",
})

CHECK_KEYS = ("numerical", "gradient", "lint", "params")

# L3: the learner's speedup must agree with the grader's own interleaved measurement within this
# factor either way, a no-op must read about 1.0 and dead-code elimination on the benchmark well
# above it (reference about 2.9x-3.0x, the grader's measurement the same, on a 2-core CPU
# single-threaded; README "Measured speedups"). The CUDA figures are unmeasured (no GPU here).
AGREEMENT_FACTOR = 1.4
NO_OP_RANGE = (0.8, 1.25)
DEAD_CODE_MIN_SPEEDUP = {"cpu": 2.0, "cuda": 1.5}
TIME_BUDGET_S = 20.0
BENCHMARK_BATCH, BENCHMARK_WIDTH = 64, 256


# ----------------------------------------------------------------------------------------------
# Models. Every op is a handle some battery pass grabs: the flatten (batch-1 trap), the abs on the
# input (negative-input trap), the Linears (weights to detach, pad or edit in place), the ReLU.

class Mlp(nn.Module):
    def __init__(self, shape=(4, 5), hidden=20, dead_branch=False):
        super().__init__()
        features = shape[0] * shape[1]
        self.fc1, self.fc2 = nn.Linear(features, hidden), nn.Linear(hidden, features)
        self.aux = nn.Linear(features, hidden) if dead_branch else None

    def forward(self, x):
        h = torch.flatten(x, 1)
        a = torch.abs(h)
        if self.aux is not None:
            torch.tanh(self.aux(a))  # a dead branch: its result is never used
        y = torch.relu(self.fc1(a))
        return self.fc2(y) * 0.5 + h


class ConvBN(nn.Module):
    def __init__(self, bias=True):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 6, 3, padding=1, bias=bias), nn.BatchNorm2d(6)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-1, 1)
        self.eval()

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class DeadHead(nn.Module):
    """L3 benchmark: one live Linear, a two-Linear head whose result is never used (weights fit in cache)."""

    def __init__(self, width=BENCHMARK_WIDTH):
        super().__init__()
        self.live = nn.Linear(width, width)
        self.head = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))

    def forward(self, x):
        self.head(x)
        return torch.relu(self.live(x))


# ----------------------------------------------------------------------------------------------
# The passes whose truth is known. Each finds its handle generically, so it works on hidden models.

ACTIVATIONS = {torch.relu: "relu", torch.tanh: "tanh", F.gelu: "gelu"}


def call_nodes(gm: fx.GraphModule, *targets) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in targets]


def live(nodes: list[fx.Node]) -> list[fx.Node]:
    """Nodes whose value is used: breaking a dead one changes nothing, and the truth would be a lie."""
    return [n for n in nodes if n.users]


def linear_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    modules = dict(gm.named_modules())
    return live([n for n in gm.graph.nodes if n.op == "call_module" and isinstance(modules[n.target], nn.Linear)])


def activation_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    return live(call_nodes(gm, *ACTIVATIONS))


def done(gm: fx.GraphModule) -> fx.GraphModule:
    gm.graph.lint()
    gm.recompile()
    return gm


def identity(gm):
    return gm


def swap_add_operands(gm):
    for node in call_nodes(gm, operator.add):
        if all(isinstance(a, fx.Node) for a in node.args):
            node.args = node.args[::-1]  # float addition is commutative: bit-identical
    return done(gm)


def eliminate_dead_code(gm):
    for node in reversed(list(gm.graph.nodes)):
        if node.op not in ("placeholder", "output") and not node.users:
            gm.graph.erase_node(node)
    return done(gm)


def fold_conv_bn(gm):
    """Kata 03's reference fold, then the BatchNorm modules it left unused are dropped from gm."""
    reference = load_solution(REPO_ROOT / "reference" / "03_conv_bn" / "solution.py", "03_conv_bn")
    gm = reference.fuse_conv_bn(gm)
    gm.delete_all_unused_submodules()
    return gm


def activation_to_sigmoid(gm, index=0):
    node = activation_nodes(gm)[index]
    node.target, node.kwargs = torch.sigmoid, {}
    return done(gm)


class ReplayFirst(nn.Module):
    """Returns whatever it returned on its first call: a constant folded from one input."""

    def __init__(self):
        super().__init__()
        self.first = None

    def forward(self, x):
        if self.first is None:
            self.first = x.detach()
            return x
        return self.first


def caches_first_result(gm):
    output = next(n for n in gm.graph.nodes if n.op == "output")
    result = output.args[0]
    first = result[0] if isinstance(result, (tuple, list)) else result
    gm.add_submodule("replay_first", ReplayFirst())
    with gm.graph.inserting_before(output):
        replay = gm.graph.call_module("replay_first", (first,))
    output.args = ((replay, *result[1:]) if isinstance(result, (tuple, list)) else replay,)
    return done(gm)


def squeeze_instead_of_flatten(gm):
    """flatten(x, 1) -> flatten(x.squeeze(), -2): the same, unless the batch is 1 (squeeze drops it too)."""
    node = call_nodes(gm, torch.flatten)[0]
    with gm.graph.inserting_before(node):
        squeezed = gm.graph.call_method("squeeze", (node.args[0],))
    node.args = (squeezed, -2)
    return done(gm)


def drops_input_abs(gm):
    """abs(x) -> x: right only while x >= 0."""
    node = call_nodes(gm, torch.abs, torch.relu)[0]
    node.replace_all_uses_with(node.args[0])
    gm.graph.erase_node(node)
    return done(gm)


def detaches_activation(gm, index=0):
    node = activation_nodes(gm)[index]
    with gm.graph.inserting_after(node):
        detached = gm.graph.call_method("detach", (node,))
    node.replace_all_uses_with(detached, delete_user_cb=lambda user: user is not detached)
    return done(gm)


class StraightThrough(torch.autograd.Function):
    """The activation going forward, the identity going back: the outputs match, the gradients do not."""

    @staticmethod
    def forward(ctx, x, name):
        return {"relu": torch.relu, "tanh": torch.tanh, "gelu": F.gelu}[name](x)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def straight_through(x, name):
    return StraightThrough.apply(x, name)


def straight_through_activation(gm, index=0):
    node = activation_nodes(gm)[index]
    node.args, node.target = (node.args[0], ACTIVATIONS[node.target]), straight_through
    return done(gm)


def detaches_weight(gm, index=0):
    """A Linear as F.linear(x, weight.detach(), bias): same outputs and input gradients, no weight gradient."""
    node = linear_nodes(gm)[index]
    linear = gm.get_submodule(node.target)
    with gm.graph.inserting_before(node):
        weight = gm.graph.call_method("detach", (gm.graph.get_attr(f"{node.target}.weight"),))
        bias = gm.graph.get_attr(f"{node.target}.bias") if linear.bias is not None else None
        functional = gm.graph.call_function(F.linear, (node.args[0], weight, bias))
    node.replace_all_uses_with(functional)
    gm.graph.erase_node(node)
    return done(gm)


def pads_linear(gm, index=0, multiple=8):
    """Pads a Linear's output features to a multiple of 8 with zero rows, slicing the padding off after:
    the same outputs, the same parameter names, more parameters."""
    node = linear_nodes(gm)[index]
    linear = gm.get_submodule(node.target)
    out = linear.out_features
    padded = nn.Linear(linear.in_features, out + multiple - out % multiple, bias=linear.bias is not None)
    with torch.no_grad():
        padded.weight.zero_()
        padded.weight[:out] = linear.weight
        if linear.bias is not None:
            padded.bias.zero_()
            padded.bias[:out] = linear.bias
    gm.set_submodule(node.target, padded)
    with gm.graph.inserting_after(node):
        sliced = gm.graph.call_function(operator.getitem, (node, (Ellipsis, slice(None, out))))
    node.replace_all_uses_with(sliced, delete_user_cb=lambda user: user is not sliced)
    return done(gm)


def forgets_recompile(gm, index=0):
    """Edits the graph (ReLU -> sigmoid) but not the code: the module still runs its old forward."""
    node = activation_nodes(gm)[index]
    node.target, node.kwargs = torch.sigmoid, {}
    return gm


def breaks_node_order(gm, index=0):
    """Moves an activation in front of the node it reads: Graph.lint() rejects it, running it fails."""
    node = activation_nodes(gm)[index]
    node.args[0].prepend(node)
    gm.recompile()
    return gm


def mutates_shared_weights(gm, index=0):
    """Doubles a Linear's weight in place: symbolic_trace shares that module with the traced model, so a
    harness that compares against the traced model itself sees both change together."""
    with torch.no_grad():
        gm.get_submodule(linear_nodes(gm)[index].target).weight.mul_(2)
    return gm


@dataclass
class Case:
    """A model, a pass, and the truth about it. `truth` leaves out what the grader does not grade."""
    build: Callable[[], nn.Module]
    input_shapes: list[tuple[int, ...]]
    pass_fn: Callable
    truth: dict[str, bool]
    why: str  # what the pass does wrong (or that it is correct), for the learner's message
    hint: str = ""
    dtype: torch.dtype = torch.float32


ALL_TRUE = dict.fromkeys(CHECK_KEYS, True)
WRONG_OUTPUTS = {"numerical": False, "lint": True, "params": True}


def mlp_case(pass_fn, truth, why, hint="", **options) -> Case:
    return Case(lambda: Mlp(**options), [(4, 4, 5)], pass_fn, truth, why, hint)


EXACT_CASES: dict[str, Case] = {
    "caches_first_result": mlp_case(
        caches_first_result, WRONG_OUTPUTS,
        "the transformed model replays its first output for every later input",
        "compare on n_samples fresh random inputs: one sample cannot tell a constant from a function."),
    "wrong_only_at_batch_size_1": mlp_case(
        squeeze_instead_of_flatten, WRONG_OUTPUTS,
        "flatten(x, 1) became flatten(x.squeeze(), -2): at batch size 1 the output loses its batch dimension",
        "draw samples at several batch sizes, 1 among them, and compare shapes too (torch.allclose broadcasts "
        "(20,) against (1, 20); torch.testing.assert_close does not)."),
    "wrong_only_on_negative_inputs": mlp_case(
        drops_input_abs, WRONG_OUTPUTS, "abs(x) was dropped, which is right only for x >= 0",
        "draw values with torch.randn, not torch.rand: inputs can be negative."),
    "detaches_activation": mlp_case(
        detaches_activation, {**ALL_TRUE, "gradient": False},
        "a .detach() after the ReLU: the same outputs, but no gradient flows through fc1",
        "compare gradients with respect to the inputs and the parameters (torch.autograd.grad)."),
    "straight_through_relu": mlp_case(
        straight_through_activation, {**ALL_TRUE, "gradient": False},
        "the ReLU became a custom autograd function whose forward is ReLU and whose backward is the identity",
        "compare gradients on random inputs, with a random cotangent."),
    "detaches_weight": mlp_case(
        detaches_weight, {**ALL_TRUE, "gradient": False},
        "fc1 became F.linear(x, fc1.weight.detach(), fc1.bias): outputs and input gradients match, "
        "but fc1.weight gets no gradient",
        "compare the gradients of the parameters the pass left unchanged, not only of the inputs "
        "(a None gradient is a zero one)."),
    "breaks_node_order": mlp_case(
        breaks_node_order, {"lint": False, "numerical": False, "params": True},
        "the ReLU node was moved in front of the node it reads",
        "run gm.graph.lint(); and a transformed model that raises has failed, verify_pass must not raise."),
    "forgets_recompile": mlp_case(
        forgets_recompile, {**ALL_TRUE, "lint": False},
        "the graph was edited (ReLU -> sigmoid) but gm.recompile() was not called: the module still runs "
        "its old forward, which happens to be right",
        "a valid GraphModule also runs the code of its graph: gm.code == gm.graph.python_code('self').src."),
    "pads_linear_adds_parameters": mlp_case(
        pads_linear, {**ALL_TRUE, "params": False},
        "fc1 was padded from 20 to 24 output features with zero rows (sliced off after): the same outputs "
        "and parameter names, 84 more parameters",
        "count parameter elements (p.numel()), not parameter names or tensors."),
    "mutates_shared_weights": mlp_case(
        mutates_shared_weights, WRONG_OUTPUTS,
        "the pass doubled fc1.weight in place, in the module symbolic_trace shares with the traced model",
        "deep-copy the model before tracing it for the pass, and compare against the copy."),
    "conv_bn_fold_without_conv_bias": Case(
        lambda: ConvBN(bias=False), [(2, 3, 6, 6)], fold_conv_bn, ALL_TRUE,
        "the reference Conv+BN fold is correct; the conv gains a bias and the BN's parameters go",
        "`params` asks that the pass adds no parameters: fewer is fine, and new names with fewer elements too."),
    "dead_code_elimination": mlp_case(
        eliminate_dead_code, ALL_TRUE, "dead-code elimination on a model with a dead branch is correct",
        dead_branch=True),
}


# ----------------------------------------------------------------------------------------------
# Hidden cases (L4): a random model (depth, widths, activations, names, nesting, one or two inputs,
# a dead branch or not), a random example batch size, and random passes from the battery.

class HiddenNet(nn.Module):
    def __init__(self, rng: random.Random, shape: tuple[int, int], side_features: int | None = None):
        super().__init__()
        self.input_op = rng.choice([torch.abs, torch.relu])
        self.layers: list[tuple[str, Callable, bool]] = []
        width = shape[0] * shape[1]
        for index in range(rng.randint(2, 4)):
            out = rng.choice([8, 12, 16, 20])
            path = ".".join(random_identifier(rng) for _ in range(rng.randint(1, 2))) + f"_{index}"
            nest_under(self, path, nn.Linear(width, out))
            self.layers.append((path, rng.choice(list(ACTIVATIONS)), out == width))
            width = out
        self.dead = random_identifier(rng) + "_dead" if rng.random() < 0.5 else None
        if self.dead:
            setattr(self, self.dead, nn.Linear(width, 4))
        self.side = random_identifier(rng) + "_side"
        if side_features:
            setattr(self, self.side, nn.Linear(side_features, width))

    def forward(self, x):
        h = self.input_op(torch.flatten(x, 1))
        for path, activation, residual in self.layers:
            y = activation(self.get_submodule(path)(h))
            h = y + h if residual else y
        if self.dead:
            getattr(self, self.dead)(h)  # never used
        return h * 0.5 + 1.0


class HiddenNetWithSide(HiddenNet):
    """Two inputs, two outputs: a harness must draw every input and compare every output."""

    def forward(self, x, side):
        return super().forward(x), torch.tanh(getattr(self, self.side)(side))


CORRECT_PASSES = {"identity": identity, "swap_add_operands": swap_add_operands,
                  "eliminate_dead_code": eliminate_dead_code}
WRONG_PASSES = {
    "activation_to_sigmoid": (activation_to_sigmoid, WRONG_OUTPUTS),
    "caches_first_result": (caches_first_result, WRONG_OUTPUTS),
    "squeeze_instead_of_flatten": (squeeze_instead_of_flatten, WRONG_OUTPUTS),
    "drops_input_abs_or_relu": (drops_input_abs, WRONG_OUTPUTS),
    "detaches_activation": (detaches_activation, {**ALL_TRUE, "gradient": False}),
    "straight_through_activation": (straight_through_activation, {**ALL_TRUE, "gradient": False}),
    "detaches_weight": (detaches_weight, {**ALL_TRUE, "gradient": False}),
    "pads_linear": (pads_linear, {**ALL_TRUE, "params": False}),
    "forgets_recompile": (forgets_recompile, {**ALL_TRUE, "lint": False}),
    "breaks_node_order": (breaks_node_order, {"lint": False, "numerical": False, "params": True}),
    "mutates_shared_weights": (mutates_shared_weights, WRONG_OUTPUTS),
}
INDEXED = {activation_to_sigmoid: "act", detaches_activation: "act", straight_through_activation: "act",
           forgets_recompile: "act", breaks_node_order: "act", detaches_weight: "linear", pads_linear: "linear",
           mutates_shared_weights: "linear"}


def hidden_cases(rng: random.Random) -> list[tuple[str, Case]]:
    """One correct and one wrong pass, each at a random site, on one random model."""
    shape = (rng.randint(2, 4), rng.randint(2, 5))  # both > 1: squeeze() must drop only the batch
    side_features = rng.choice([None, None, 3, 6])
    batch = rng.randint(2, 5)
    model_seed = rng.randrange(2**31)

    def build() -> nn.Module:
        torch.manual_seed(model_seed)
        net = HiddenNetWithSide if side_features else HiddenNet
        return net(random.Random(model_seed), shape, side_features)

    traced = fx.symbolic_trace(build())
    sites = {"act": len(activation_nodes(traced)), "linear": len(linear_nodes(traced))}
    shapes = [(batch, *shape)] + ([(batch, side_features)] if side_features else [])
    correct = rng.choice(list(CORRECT_PASSES))
    wrong = rng.choice(list(WRONG_PASSES))
    cases = []
    for name, pass_fn, truth in ((correct, CORRECT_PASSES[correct], ALL_TRUE), (wrong, *WRONG_PASSES[wrong])):
        if pass_fn in INDEXED:
            index = rng.randrange(sites[INDEXED[pass_fn]])
            pass_fn = functools.partial(pass_fn, index=index)
            name = f"{name}[{index}]"
        cases.append((name, Case(build, shapes, pass_fn, truth, f"that is the truth about the hidden pass {name}",
                                 "the harness must work for any model: every input, every output, any names.")))
    return cases


# ----------------------------------------------------------------------------------------------
# Checks

def example_inputs(case: Case, device: torch.device) -> tuple:
    return tuple(torch.randn(*shape, dtype=case.dtype, device=device) for shape in case.input_shapes)


def run_verifier(ctx: Context, model: nn.Module, pass_fn: Callable, inputs: tuple) -> tuple[dict, float]:
    start = time.perf_counter()
    # A GraphModule whose code raises prints the generated code to stderr before re-raising: noise here.
    with contextlib.redirect_stderr(io.StringIO()):
        report = ctx.call("verify_pass", model, pass_fn, inputs, returns=dict)
    elapsed = time.perf_counter() - start
    missing = [key for key in (*CHECK_KEYS, "speedup") if key not in report]
    if missing:
        raise CheckFailed(f"verify_pass returned a dict without the key(s) {', '.join(missing)}; it must have "
                          f"{', '.join(CHECK_KEYS)} (bools) and speedup (a float).")
    for key in CHECK_KEYS:
        if not isinstance(report[key], bool):
            raise CheckFailed(f"verify_pass returned {key}={report[key]!r} ({type(report[key]).__name__}); "
                              "each check must be a Python bool (wrap a tensor result in bool(...)).")
    if not isinstance(report["speedup"], (float, int)):
        raise CheckFailed(f"verify_pass returned speedup={report['speedup']!r}; it must be a float.")
    return report, elapsed


def check_case(ctx: Context, name: str, case: Case) -> dict:
    model = case.build().to(ctx.device)
    pristine = copy.deepcopy(model)
    report, elapsed = run_verifier(ctx, model, case.pass_fn, example_inputs(case, ctx.device))
    for key, truth in case.truth.items():
        if report[key] != truth:
            raise CheckFailed(
                f"verify_pass said {key}={report[key]} for the pass `{name}`, but {key} is {truth}: {case.why}."
                + (f" Hint: {case.hint}" if case.hint else ""))
    changed = [n for n, t in pristine.state_dict().items() if not torch.equal(t, model.state_dict()[n])]
    if changed:
        raise CheckFailed(f"after verify_pass ran the pass `{name}`, the model it was given has changed "
                          f"({', '.join(changed)}): run the pass on a deep copy, never on the caller's model.")
    return {"verify_pass_s": round(elapsed, 2)}


@KATA.check(level=1)
def identity_pass(ctx: Context):
    return check_case(ctx, "identity", mlp_case(identity, ALL_TRUE, "returning the graph unchanged is correct"))


@KATA.check(level=1)
def conv_bn_fold(ctx: Context):
    return check_case(ctx, "fold_conv_bn", Case(
        ConvBN, [(2, 3, 6, 6)], fold_conv_bn, ALL_TRUE, "the reference Conv+BN fold (kata 03) is correct",
        "the fold changes the conv's weight, so compare gradients only for parameters the pass left as they "
        "were; and it removes parameters, which `params` allows."))


@KATA.check(level=1)
def obviously_wrong_pass(ctx: Context):
    return check_case(ctx, "relu_to_sigmoid", mlp_case(
        activation_to_sigmoid, WRONG_OUTPUTS, "the ReLU became a sigmoid",
        "run the original (a deep copy taken before the pass) and the transformed model on the same inputs."))


for _name, _case in EXACT_CASES.items():
    KATA.add(2, _name, lambda ctx, name=_name, case=_case: check_case(ctx, name, case))


def check_speedup(ctx: Context, model: nn.Module, pass_fn: Callable, accept: Callable[[float], bool],
                  expectation: str) -> dict:
    model = model.eval().to(ctx.device)
    inputs = (torch.randn(BENCHMARK_BATCH, BENCHMARK_WIDTH, device=ctx.device),)
    baseline, candidate = fx.symbolic_trace(copy.deepcopy(model)), pass_fn(fx.symbolic_trace(copy.deepcopy(model)))
    report, elapsed = run_verifier(ctx, model, pass_fn, inputs)
    theirs = float(report["speedup"])
    ours = measure_speedup(baseline, candidate, inputs, threads=ctx.threads)
    figures = {"learner_speedup": round(theirs, 3), "grader_speedup": round(ours.median, 3),
               "agreement_factor": AGREEMENT_FACTOR, "verify_pass_s": round(elapsed, 2)}
    if elapsed > TIME_BUDGET_S:
        raise CheckFailed(f"verify_pass took {elapsed:.1f} s; the budget is {TIME_BUDGET_S:.0f} s. Hint: time "
                          "chunks of a fixed duration, not a fixed number of calls, and a few rounds.", figures)
    if not (math.isfinite(theirs) and accept(theirs)):
        raise CheckFailed(f"verify_pass measured speedup={theirs:.3f}; {expectation} (the grader measured "
                          f"{ours}). Hint: speedup is time(original) / time(transformed).", figures)
    if not 1 / AGREEMENT_FACTOR <= theirs / ours.median <= AGREEMENT_FACTOR:
        raise CheckFailed(f"verify_pass measured speedup={theirs:.3f}, the grader's interleaved measurement "
                          f"{ours}: they must agree within a factor {AGREEMENT_FACTOR}. Hint: warm both models up, "
                          "alternate them round by round, take the median ratio, time with one thread.", figures)
    return figures


@KATA.check(level=3)
def no_op_speedup(ctx: Context):
    low, high = NO_OP_RANGE
    return check_speedup(ctx, DeadHead(), identity, lambda s: low <= s <= high,
                         f"a pass that changes nothing must measure between {low} and {high}")


@KATA.check(level=3)
def dead_code_speedup(ctx: Context):
    need = DEAD_CODE_MIN_SPEEDUP[ctx.device.type]
    return check_speedup(ctx, DeadHead(), eliminate_dead_code, lambda s: s >= need,
                         f"removing two of the three Linears must measure at least {need}x")


def check_hidden(ctx: Context) -> dict:
    figures = {}
    for name, case in hidden_cases(random.Random(ctx.seed)):
        figures[name] = check_case(ctx, name, case)["verify_pass_s"]
    return figures


for _index in range(1, 6):
    KATA.add(4, f"model_{_index}", check_hidden)
