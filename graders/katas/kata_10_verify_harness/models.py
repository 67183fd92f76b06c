"""Kata 10's battery: passes whose truth is known, the models they run on, the cases (kata.toml's [cases]: `expect`
is the truth verify_pass must report, a key left out is not graded) and the hidden-case generator."""
from __future__ import annotations

import functools
import operator
import random
from typing import Callable

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from torch.fx.experimental.optimization import fuse
from torch.utils._pytree import tree_map

from graders.run import Case, Program, Program2, call_module_nodes, manifest, manual_seed, random_identifier, random_path

MANIFEST = manifest("10_verify_harness")
HIDDEN = MANIFEST["hidden"]  # the passes of the hidden battery, the truth about each, the hint
CHECK_KEYS = ("numerical", "gradient", "lint", "params", "effects")
ACTIVATIONS = (torch.relu, torch.tanh, F.gelu)


# The passes. Each finds its handle generically (the flatten, the abs on the input, the Linears, the
# activations), so it works on the hidden models too; what each does, right or wrong, is kata.toml's `why`.

def calls(gm: fx.GraphModule, *targets) -> list[fx.Node]:
    """The live calls of `targets`: breaking a node whose value is unused changes nothing, and the truth would lie."""
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in targets and n.users]


def linear_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in call_module_nodes(gm, nn.Linear) if n.users]


def done(gm: fx.GraphModule) -> fx.GraphModule:
    gm.graph.lint()
    gm.recompile()
    return gm


def replaced(gm: fx.GraphModule, node: fx.Node, build: Callable[[fx.Graph, fx.Node], object]) -> fx.GraphModule:
    """`node` replaced by what `build(graph, node)` builds in its place (or returns: one of its arguments)."""
    with gm.graph.inserting_before(node):
        node.replace_all_uses_with(build(gm.graph, node))
    gm.graph.erase_node(node)
    return done(gm)


def identity(gm):
    return gm


def swap_add_operands(gm):
    for node in calls(gm, operator.add):
        if all(isinstance(a, fx.Node) for a in node.args):
            node.args = node.args[::-1]  # float addition is commutative: bit-identical
    return done(gm)


def eliminate_dead_code(gm):
    """torch.fx's own dead-code elimination. It keeps random draws (impure) but trusts an unused result: an in-place
    call_method whose result nobody reads (running.add_(...), acc.add_(...)) goes, and the write with it. Right on
    the hidden models and mlp_dead_branch, whose dead code is free of side effects; wrong on mlp_running and
    mlp_accumulates."""
    gm.graph.eliminate_dead_code()
    return done(gm)


RANDOM_DRAWS = (torch.rand_like, torch.randn_like, torch.rand, torch.randn)


def drops_dead_random_draws(gm):
    """Erases the random draws whose result is unused (fx's DCE keeps them): the outputs do not change, the RNG
    stream after the call does, and every later draw the program makes (a dropout mask, an initialisation) with it."""
    for node in [n for n in gm.graph.nodes if n.op == "call_function" and n.target in RANDOM_DRAWS and not n.users]:
        gm.graph.erase_node(node)
    return done(gm)


def fold_conv_bn(gm):
    """torch's own eval-mode conv-BN fold (what kata 03 teaches), then the BatchNorm modules it left unused are
    dropped from gm. torch's, not kata 03's reference: the battery runs in a worker that sees only graders/."""
    gm = fuse(gm, inplace=True, no_trace=True)
    gm.delete_all_unused_submodules()
    return gm


def activation_to_sigmoid(gm, index=0, recompile=True):
    node = calls(gm, *ACTIVATIONS)[index]
    node.target, node.kwargs = torch.sigmoid, {}
    return done(gm) if recompile else gm


forgets_recompile = functools.partial(activation_to_sigmoid, recompile=False)


def caches_first_result(gm):
    """Replays the outputs of its first call for every later input: a constant folded from one input."""
    first = []  # shared by every copy of the module, like a constant folded into its code

    def replay_first(outputs):
        if not first:
            first.append(tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, outputs))
            return outputs
        return first[0]

    output = next(n for n in gm.graph.nodes if n.op == "output")
    with gm.graph.inserting_before(output):
        output.args = (gm.graph.call_function(replay_first, output.args),)
    return done(gm)


def flatten_rewritten_as(rewrite: Callable[[fx.Graph, fx.Node], fx.Node]) -> Callable:
    return lambda gm: replaced(gm, calls(gm, torch.flatten)[0], lambda graph, node: rewrite(graph, node.args[0]))


squeeze_instead_of_flatten = flatten_rewritten_as(
    lambda g, x: g.call_function(torch.flatten, (g.call_method("squeeze", (x,)), -2)))
flatten_as_view = flatten_rewritten_as(lambda g, x: g.call_method("view", (x, g.call_method("size", (x, 0)), -1)))
reshape_to_batch_1 = flatten_rewritten_as(lambda g, x: g.call_method("reshape", (x, 1, -1)))


def _storage_as_rows(g: fx.Graph, x: fx.Node) -> fx.Node:
    """x.as_strided((b, n), (n, 1)), b = x.size(0), n = x.numel() // b: x's storage read as rows, in memory order."""
    rows = g.call_method("size", (x, 0))
    features = g.call_function(operator.floordiv, (g.call_method("numel", (x,)), rows))
    return g.call_method("as_strided", (x, (rows, features), (features, 1)))


# flatten(x, 1) lowered to a reinterpretation of x's storage, as a lowering that assumes contiguous inputs does:
# no copy, no error, the same shape; right on every contiguous tensor, other values on a transposed one.
flatten_as_strided = flatten_rewritten_as(_storage_as_rows)


def drops_input_abs_or_relu(gm):
    return replaced(gm, calls(gm, torch.abs, torch.relu)[0], lambda graph, node: node.args[0])


def detaches_activation(gm, index=0):
    node = calls(gm, *ACTIVATIONS)[index]
    with gm.graph.inserting_after(node):
        detached = gm.graph.call_method("detach", (node,))
    node.replace_all_uses_with(detached, delete_user_cb=lambda user: user is not detached)
    return done(gm)


def straight_through_activation(gm, index=0):
    node = calls(gm, *ACTIVATIONS)[index]
    activation = node.target

    class StraightThrough(torch.autograd.Function):
        """The activation going forward, the identity going back: the outputs match, the gradients do not."""
        forward = staticmethod(lambda ctx, x: activation(x))
        backward = staticmethod(lambda ctx, grad: grad)

    def straight_through(x):  # a plain function: the generated code can call it, not StraightThrough.apply
        return StraightThrough.apply(x)

    node.target = straight_through
    return done(gm)


def detaches_weight(gm, index=0):
    def functional(graph, node):
        weight = graph.call_method("detach", (graph.get_attr(f"{node.target}.weight"),))
        bias = graph.get_attr(f"{node.target}.bias") if gm.get_submodule(node.target).bias is not None else None
        return graph.call_function(F.linear, (node.args[0], weight, bias))
    return replaced(gm, linear_nodes(gm)[index], functional)


def pads_linear(gm, index=0, multiple=8):
    node = linear_nodes(gm)[index]
    linear = gm.get_submodule(node.target)
    out = linear.out_features
    padded = nn.Linear(linear.in_features, out + multiple - out % multiple, bias=linear.bias is not None,
                       dtype=linear.weight.dtype, device=linear.weight.device)  # a float64 or CUDA model's too
    with torch.no_grad():
        for new, old in ((padded.weight, linear.weight), (padded.bias, linear.bias)):
            if old is not None:
                new.zero_()[:out] = old
    gm.set_submodule(node.target, padded)
    with gm.graph.inserting_after(node):
        sliced = gm.graph.call_function(operator.getitem, (node, (Ellipsis, slice(None, out))))
    node.replace_all_uses_with(sliced, delete_user_cb=lambda user: user is not sliced)
    return done(gm)


def permutes_output_gradient(gm):
    """The identity on the (first) output going forward; going back, the incoming gradient reversed along its last
    dimension. A cotangent of ones (the gradient of sum(outputs)) is its own reverse: only a random one sees it."""

    class PermutedBackward(torch.autograd.Function):
        forward = staticmethod(lambda ctx, t: t.view_as(t))
        backward = staticmethod(lambda ctx, grad: grad.flip(-1))

    def permuted_backward(t):  # a plain function: the generated code can call it, not PermutedBackward.apply
        return PermutedBackward.apply(t)

    output = next(n for n in gm.graph.nodes if n.op == "output")
    result = output.args[0]
    first = result[0] if isinstance(result, (tuple, list)) else result
    with gm.graph.inserting_before(output):
        wrapped = gm.graph.call_function(permuted_backward, (first,))
    output.args = ((wrapped, *result[1:]) if isinstance(result, (tuple, list)) else wrapped,)
    return done(gm)


def drops_a_zero_term(gm):
    """`y + 0.0 * z` -> `y` (then dead-code elimination): exact for finite z. z's parameters stay in gm, now unused:
    their gradient is None after the pass, exactly zero before it, and None means zero."""
    for mul in calls(gm, operator.mul):
        if 0.0 in mul.args and len(mul.users) == 1 and next(iter(mul.users)).target is operator.add:
            add = next(iter(mul.users))
            add.replace_all_uses_with(next(a for a in add.args if a is not mul))
            gm.graph.erase_node(add)
    gm.graph.eliminate_dead_code()
    return done(gm)


def gelu_to_tanh_approximation(gm):
    """The exact GELU swapped for its tanh approximation: within 4.7e-4, right at a caller's looser tolerance."""
    for node in calls(gm, F.gelu):
        node.kwargs = {**node.kwargs, "approximate": "tanh"}
    return done(gm)


def linear_in_float32(gm, index=0):
    """fc1 of a float64 model computed in float32 and cast back: errors near 1e-7, under 1e-5 and over 1e-9."""
    def functional(graph, node):
        weight, bias = (graph.call_method("float", (graph.get_attr(f"{node.target}.{name}"),))
                        for name in ("weight", "bias"))
        lowered = graph.call_function(F.linear, (graph.call_method("float", (node.args[0],)), weight, bias))
        return graph.call_method("double", (lowered,))
    return replaced(gm, linear_nodes(gm)[index], functional)


def rounds_input_through_float32(gm):
    """The input of a float64 model rounded to float32 and cast back before anything reads it: exact on values float32
    holds (an example drawn in float32, then cast to float64), about 1e-8 off on values drawn in float64."""
    x = next(n for n in gm.graph.nodes if n.op == "placeholder")
    with gm.graph.inserting_after(x):
        low = gm.graph.call_method("float", (x,))
    with gm.graph.inserting_after(low):
        back = gm.graph.call_method("double", (low,))
    x.replace_all_uses_with(back, delete_user_cb=lambda user: user is not low)
    return done(gm)


def breaks_node_order(gm, index=0):
    node = calls(gm, *ACTIVATIONS)[index]
    node.args[0].prepend(node)
    gm.recompile()
    return gm


def mutates_shared_weights(gm, index=0):
    """symbolic_trace shares the Linear with the traced model: compared against it, both change together."""
    with torch.no_grad():
        gm.get_submodule(linear_nodes(gm)[index].target).weight.mul_(2)
    return gm


def mlp(dead_branch=False, second_output=False, zero_term=False, activation=torch.relu, running=False,
        accumulates=False, dead_random=False, clamps_input=False) -> nn.Module:
    """Every op is a handle some pass grabs: the flatten (batch-size and layout traps), the abs on the
    input (negative-input trap), the Linears (weights to detach, pad or edit in place), the activations;
    with `zero_term`, a term `0.0 * probe(a)` added to the output (exactly zero, and so are probe's gradients).
    Effects no output shows: with `running`, a buffer `running` updated in place (an average of the features);
    with `accumulates`, a second input `acc` the features are added to in place; with `dead_random`, a
    torch.rand_like whose result is unused (it still advances the RNG); with `clamps_input`, the input clipped in
    place to [-1, 1] before anything reads it (x.clamp_(-1, 1): the caller's tensor changes, and a second call on it
    computes what the first did, since clipping twice is clipping once)."""
    def forward(m, x, acc=None):
        if clamps_input:
            x = x.clamp_(-1.0, 1.0)
        h = torch.flatten(x, 1)
        a = torch.abs(h)
        if running:  # every operand a traced value: a write to the buffer alone would run once, at trace time
            m.running.add_(a.detach().mean(0) - m.running, alpha=0.1)
        if accumulates:
            acc.add_(a.detach())
        if dead_random:
            torch.rand_like(a)  # a draw never used, like a dropout mask computed and then skipped
        if dead_branch:
            torch.tanh(m.aux(a))  # a dead branch: its result is never used
        out = m.fc2(activation(m.fc1(a))) * 0.5 + h
        if zero_term:
            out = out + 0.0 * m.probe(a)
        return (out, torch.tanh(m.head2(a))) if second_output else out

    parts = {"fc1": nn.Linear(20, 20), "fc2": nn.Linear(20, 20)}
    parts |= {"aux": nn.Linear(20, 20)} if dead_branch else {}
    parts |= {"probe": nn.Linear(20, 20)} if zero_term else {}
    parts |= {"head2": nn.Linear(20, 3)} if second_output else {}
    parts |= {"running": torch.zeros(20)} if running else {}  # a plain tensor: Program makes it a buffer
    return (Program2 if accumulates else Program)(forward, **parts)


def conv_bn(bias=True) -> nn.Module:
    """Conv, BatchNorm with random statistics, ReLU; in eval mode, where the fold is exact."""
    conv, bn = nn.Conv2d(3, 6, 3, padding=1, bias=bias), nn.BatchNorm2d(6)
    with torch.no_grad():
        for stat, low, high in ((bn.running_mean, -1, 1), (bn.running_var, 0.5, 2), (bn.weight, 0.5, 1.5),
                                (bn.bias, -1, 1)):
            stat.uniform_(low, high)
    return Program(lambda m, x: torch.relu(m.bn(m.conv(x))), conv=conv, bn=bn).eval()


def dead_head(width=256) -> nn.Module:
    """L3 benchmark: one live Linear, a two-Linear head whose result is never used (weights fit in cache)."""
    def forward(m, x):
        m.head(x)
        return torch.relu(m.live(x))
    return Program(forward, live=nn.Linear(width, width),
                   head=nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width)))


MODELS = {  # the names kata.toml's [cases] use: a builder and the shape of each input, batch left out
    "mlp": (mlp, (4, 5)), "mlp_dead_branch": (functools.partial(mlp, dead_branch=True), (4, 5)),
    "mlp_two_outputs": (functools.partial(mlp, second_output=True), (4, 5)),
    "mlp_zero_term": (functools.partial(mlp, zero_term=True), (4, 5)),
    "mlp_gelu": (functools.partial(mlp, activation=F.gelu), (4, 5)),
    "mlp_running": (functools.partial(mlp, running=True), (4, 5)),
    "mlp_accumulates": (functools.partial(mlp, accumulates=True), (4, 5), (20,)),  # and acc, (batch, 20)
    "mlp_dead_random": (functools.partial(mlp, dead_random=True), (4, 5)),
    "mlp_effects": (functools.partial(mlp, running=True, dead_random=True), (4, 5)),
    "mlp_clamps_input": (functools.partial(mlp, clamps_input=True), (4, 5)),
    "conv_bn": (conv_bn, (3, 6, 6)), "conv_bn_no_bias": (functools.partial(conv_bn, bias=False), (3, 6, 6))}
EXAMPLES = {"randn": torch.randn, "rand": torch.rand,  # rand: an image batch in [0, 1)
            "transposed": lambda shape: torch.randn(shape[0], *shape[:0:-1]).transpose(1, -1)}  # non-contiguous


def in_dtype(builder: Callable[[], nn.Module], dtype: torch.dtype) -> Callable[[], nn.Module]:
    return lambda: builder().to(dtype)


def case(spec: dict) -> Case:
    """A case from its declaration in kata.toml's [cases]; its `pass` names one of the passes above."""
    (builder, shape, *more), draw = MODELS[spec.get("model", "mlp")], EXAMPLES[spec.get("example", "randn")]
    dtype = getattr(torch, spec.get("dtype", "float32"))
    pass_fn = globals()[spec["pass"]]
    pass_fn = functools.partial(pass_fn, index=spec["index"]) if "index" in spec else pass_fn

    def inputs(batch: int) -> tuple:  # the first input drawn as `example` says, any further one with randn
        return (draw((batch, *shape)).to(dtype), *(torch.randn(batch, *extra, dtype=dtype) for extra in more))

    return Case(in_dtype(builder, dtype), inputs, spec["truth"],
                spec.get("hint", ""), batch_sizes=(spec.get("batch", 4),), extra={**spec, "pass": pass_fn})


CASES = {name: case(spec) for name, spec in MANIFEST["cases"].items()}
BENCHMARK = Case(dead_head, lambda batch: (torch.randn(batch, 256),), mode="eval", batch_sizes=(64,))


# Hidden cases (L4): a random model (depth, widths, activations, names, nesting, one or two inputs and
# outputs, a dead branch or not, an effect or not), a random example batch size, and random passes from
# kata.toml's [hidden].

def hidden_model(seed: int, shape: tuple[int, int], side_features: int | None, effect: str | None = None) -> nn.Module:
    """Flatten, abs or relu, 2 to 4 Linears at random nested paths each with a random activation (a residual where
    widths agree), a dead Linear or not; with `side_features` a second input and output (draw and compare all).
    `effect` (kata.toml's [hidden] effects), what a call does that no output shows, computed from the input x alone
    (so that no battery pass but the one that drops it changes it): "running", a buffer under a random name updated
    in place (its add_'s result unused: torch.fx's eliminate_dead_code deletes it); "dead_random", an unused
    torch.rand_like; "clamps_input", x clipped in place before anything reads it (x = x.clamp_(-1, 1): read, kept)."""
    rng = random.Random(seed)
    manual_seed(seed)
    input_op, width, layers, parts = rng.choice([torch.abs, torch.relu]), shape[0] * shape[1], [], {}
    for index in range(rng.randint(2, 4)):
        out = rng.choice([8, 12, 16, 20])
        path = random_path(rng, 2, index)
        parts[path] = nn.Linear(width, out)
        layers.append((path, rng.choice(ACTIVATIONS), out == width))
        width = out
    dead = random_identifier(rng) + "_dead" if rng.random() < 0.5 else None
    parts |= {dead: nn.Linear(width, 4)} if dead else {}
    side = random_identifier(rng) + "_side"
    parts |= {side: nn.Linear(side_features, width)} if side_features else {}
    running = random_identifier(rng) + "_running"
    parts |= {running: torch.zeros(shape)} if effect == "running" else {}  # a plain tensor: a buffer

    def forward(m, x, side_input=None):
        if effect == "clamps_input":
            x = x.clamp_(-1.0, 1.0)
        elif effect == "running":  # every operand a traced value, as in mlp(running=True)
            getattr(m, running).add_(x.detach().mean(0) - getattr(m, running), alpha=0.1)
        elif effect == "dead_random":
            torch.rand_like(x)  # never used
        h = input_op(torch.flatten(x, 1))
        for path, activation, residual in layers:
            y = activation(m.get_submodule(path)(h))
            h = y + h if residual else y
        if dead:
            getattr(m, dead)(h)  # never used
        out = h * 0.5 + 1.0
        return (out, torch.tanh(getattr(m, side)(side_input))) if side_features else out

    return (Program2 if side_features else Program)(forward, **parts)


def hidden_cases(rng: random.Random) -> dict[str, Case]:
    """One correct and one wrong pass, each at a random site, on one random model, float32 or (one in three)
    float64: fresh inputs must be drawn in the example's dtype. The model has an effect or not (kata.toml's [hidden]
    effects); where a pass of the battery drops it ([hidden.drops_effect]), that pass is never the correct one, and
    it is the wrong one half the time: right outputs, gradients, graph and parameters, `effects` False."""
    shape = (rng.randint(2, 4), rng.randint(2, 5))  # both > 1: squeeze() must drop only the batch
    # Every hidden model takes a second input and gives a second output (the visible ones mostly take one): a harness
    # that draws or compares only the first fails every seed, not half the models
    side_features, batch = rng.choice([3, 6]), rng.randint(2, 5)
    effect = rng.choice(HIDDEN["effects"])
    effect = None if effect == "none" else effect
    dropper = HIDDEN["drops_effect"].get(effect)
    build = functools.partial(hidden_model, rng.randrange(2**31), shape, side_features, effect)
    traced = fx.symbolic_trace(build())
    sites = {"activation": len(calls(traced, *ACTIVATIONS)), "linear": len(linear_nodes(traced))}
    correct = rng.choice([name for name in HIDDEN["correct"] if name != dropper])
    # Where gradient is not graded, a wrong pass that only gradient shows would be graded as a correct one.
    wrongs = [name for name, spec in HIDDEN["wrong"].items()
              if effect != "clamps_input" or not all(v for k, v in spec["truth"].items() if k != "gradient")]
    wrong = dropper if dropper and rng.random() < 0.5 else rng.choice(wrongs)
    wrong_spec = HIDDEN["wrong"].get(wrong) or {"truth": {**dict.fromkeys(CHECK_KEYS, True), "effects": False}}
    dtype = rng.choice([torch.float32, torch.float32, torch.float64])
    build = in_dtype(build, dtype)

    def inputs(batch: int) -> tuple:
        return tuple(torch.randn(batch, *features, dtype=dtype)
                     for features in (shape, (side_features,) if side_features else None) if features)

    cases = {}
    for name, spec in ((correct, {"truth": dict.fromkeys(CHECK_KEYS, True)}), (wrong, wrong_spec)):
        pass_fn, truth = globals()[name], spec["truth"]
        if effect == "clamps_input":  # a model that writes its input cannot be handed a leaf that requires grad
            truth = {key: value for key, value in truth.items() if key != "gradient"}
        if "site" in spec:
            index = rng.randrange(sites[spec["site"]])
            pass_fn, name = functools.partial(pass_fn, index=index), f"{name}[{index}]"
        on = f" on a model with the effect {effect}" if effect else ""
        hint = HIDDEN["effects_hint"] if spec is wrong_spec and wrong == dropper else HIDDEN["hint"]
        cases[name] = Case(build, inputs, truth, hint, batch_sizes=(batch,),
                           extra={"pass": pass_fn, "why": f"that is the truth about the hidden pass {name}{on}"})
    return cases
