"""Kata 04's model zoo, its comparison (`same_effects`) and its hidden-model generator. What matters about a model
here is the graph it traces to: which nodes are dead, which mutate a tensor, which draw random numbers. So the zoo
is a table of small forward functions written out as source (`case`), each with the node counts a correct pass may
remove (several where an unused get_attr may go too) and its hint."""
from __future__ import annotations

import functools
import random
import re
import textwrap
from operator import setitem  # noqa: F401 (the zoo's source calls it)
from typing import Callable

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from graders.run import ATOL, Case, RTOL, Run, cloned, manifest, nest_under, random_path, run_module, seeded

# symbolic_trace cannot trace `y[i] = v` (a Proxy has no __setitem__); a wrapped setitem records an
# operator.setitem node, as Dynamo's graphs hold one. (torch.export's aten graph holds aten.select.int and an
# in-place aten.fill_.Scalar instead, and after run_decompositions() a functional aten.where.)
fx.wrap("setitem")

WIDTH = 6
SQUARE_LINEAR = functools.partial(nn.Linear, WIDTH, WIDTH)


# ----------------------------------------------------------------------------------------------
# The comparison: removing a node with a side effect often leaves the outputs right; what changes is an input
# mutated in place, a parameter or buffer the model updates, or the generator's state.

def run_recording(run: Run, module, owner: nn.Module, inputs: tuple, seed: int, what="the original model") -> tuple:
    """One call of `module` from generator state `seed` on private copies of `inputs`: its output, the copies after
    it, the parameters and buffers of `owner` (the state it may change), the CPU (and any GPU) generator's state."""
    inputs, device = cloned(inputs), run.ctx.device
    with seeded(seed):
        output = run_module(module, inputs, what)
        generators = [torch.get_rng_state()] + ([torch.cuda.get_rng_state(device)] if device.type == "cuda" else [])
    return output, inputs, {k: v.detach().clone() for k, v in owner.state_dict().items()}, generators


def same_effects(run: Run) -> None:
    """Outputs, inputs after the call, parameters and buffers, generator state: all as the original's."""
    for seed, inputs in enumerate(run.input_sets(), 1000):
        want, want_inputs, want_state, want_rng = run_recording(run, run.pristine, run.pristine, inputs, seed)
        # The GraphModule shares its submodules and tensors with the model that was traced: its state is there.
        got, got_inputs, got_state, got_rng = run_recording(run, run.gm, run.model, inputs, seed, run.label)
        try:
            torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
        except AssertionError as exc:
            difference = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
            run.fail(f"{run.label} returns something else than the original: {difference}")
        for position, (g, w, given) in enumerate(zip(got_inputs, want_inputs, inputs)):
            if isinstance(w, torch.Tensor) and not torch.equal(g, w):
                did = lambda t: "leaves it unchanged" if torch.equal(t, given) else "changes it in place"  # noqa: E731
                run.fail(f"after one call, input #{position} differs: the original model {did(w)}, {run.label} "
                         f"{did(g)}{' to other values' if did(g) == did(w) else ''}. A node that mutates a tensor "
                         "the caller can see must stay.")
        for name, w in want_state.items():
            if not torch.equal(got_state[name], w):
                run.fail(f"after one forward call, the model's {name!r} differs from the original's: the original "
                         "updates it, the node that did so was removed.")
        if not all(map(torch.equal, got_rng, want_rng)):
            run.fail("after one forward call, the random-number generator is in a different state than after the "
                     "original: a node that draws random numbers was removed, so every later random draw shifts.")


def case(body: str, dead: int | tuple[int, ...] | range, hint: str, *, signature: str = "x", parts: dict | None = None,
         inputs: Callable = lambda batch: (torch.randn(batch, WIDTH),), **options) -> Case:
    """A case whose model's `forward(self, <signature>)` runs `body` (compiled here: its `setitem` is the fx-wrapped
    one) and holds the submodules and parameters `parts` build at dotted paths; the node counts a correct pass may
    remove; the hint. Batch sizes 2 and 3 by default: a BatchNorm in training mode rejects a batch of one."""
    namespace: dict = {}
    exec(f"def forward(self, {signature}):\n{textwrap.indent(textwrap.dedent(body).strip(), '    ')}",
         globals(), namespace)

    def install_parts(self):  # the model's __init__
        nn.Module.__init__(self)
        for path, part in (parts or {}).items():
            nest_under(self, path, part())

    model = type("Model", (nn.Module,), {**namespace, "__init__": install_parts})
    return Case(model, inputs, (dead,) if isinstance(dead, int) else dead, hint,
                **{"batch_sizes": (2, 3), "compare": same_effects, **options})


# ----------------------------------------------------------------------------------------------
# L1: plain dead chains.

CHAIN_HINT = ("a node is dead when nothing uses its result (no users): erase it (gm.graph.erase_node) and count it; "
              "erasing it can make its inputs dead in turn, so visit every user before the node it uses.")
PATTERN_CASES = {
    "dead_chain": case("""
        y = torch.tanh(x) * 3
        unused = torch.sigmoid(x)
        unused = unused * 2 + 1
        unused = unused.sum(dim=1)
        return y + 1""", 4, CHAIN_HINT),
    # A dead value that forks and joins again: it dies only once both of its users have gone.
    "dead_tree": case("""
        live = x.cos() - x
        shared = x.exp()
        left, right = shared + 1, shared.neg()
        joined = torch.maximum(left, right)
        joined.mean()
        return live""", 5, CHAIN_HINT),
}


# ----------------------------------------------------------------------------------------------
# L2: the zoo. Each model has its dead nodes and the traps a naive pass falls into.

def trace_with_positional_arguments(module: nn.Module) -> fx.GraphModule:
    """symbolic_trace passes a torch.nn.functional call's options as keywords; graphs built by hand or by
    other passes (graph.call_function(F.hardtanh, (y, -1.0, 1.0, True))) pass them by position."""
    gm = fx.symbolic_trace(module)
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is F.hardtanh:
            node.args, node.kwargs = (*node.args, *(node.kwargs[k] for k in ("min_val", "max_val", "inplace"))), {}
    gm.recompile()
    return gm


INPLACE = "an in-place op changes a tensor that others read; its own result being unused does not make it dead."
RANDOM = "a node that draws random numbers advances the generator; removing it shifts every later draw."
EXACT_CASES: dict[str, Case] = {
    # uses and signature
    "unused_input": case("""
        x.abs().max()
        return x * 2""", 2, "a placeholder is an argument of forward: it stays even when unused.",
        signature="x, mask", inputs=lambda batch: (torch.randn(batch, WIDTH), torch.rand(batch, WIDTH) > 0.5)),
    "uses_inside_list": case("""
        a, b = x.sin(), x.cos()
        x.exp()
        return torch.cat([a, b], dim=1)""", 1, "torch.cat([a, b]) uses a and b: node.users sees uses inside "
        "lists, tuples and dicts, a scan of node.args for Nodes does not."),
    "uses_inside_kwargs": case("""
        a = x.sin()
        x.exp()
        return torch.add(x, other=a, alpha=2)""", 1, "torch.add(x, other=a) uses a through its kwargs."),
    "nested_output": case("""
        a, b, c = x.sin(), x.cos(), x.exp()
        x.tan()
        return {"main": a, "extras": (b, [c])}""", 1,
        "the output node's argument is a nested structure; everything inside it is live."),
    # mutation
    "inplace_method": case("""
        y = x * 2
        y.add_(1)
        y.mul_(3)
        y.sum()
        return y""", 1, "y.add_(1) is a call_method node: " + INPLACE),
    "inplace_on_input": case("""
        running.mul_(0.9).add_(x.mean(dim=0), alpha=0.1)  # the caller's running average
        x.sum()
        return x * 2""", 1, "running.mul_(...).add_(...) updates the caller's tensor: " + INPLACE,
        signature="x, running", inputs=lambda batch: (torch.randn(batch, WIDTH), torch.randn(WIDTH))),
    "mutation_through_view": case("""
        y = x * 1.5
        head = y[:, :2]
        head.zero_()
        y.narrow(1, 3, 2).mul_(-1)
        return y""", 0, "y[:, :2] and y.narrow(...) are views of y: mutating a view mutates y, even though the "
        "view itself is never read again."),
    "inplace_keyword": case("""
        y = x - 0.5
        F.relu(y, inplace=True)
        return y""", 0, "F.relu(y, inplace=True) mutates y: " + INPLACE),
    "inplace_positional": case("""
        y = x * 4
        F.hardtanh(y, -1.0, 1.0, True)
        return y""", 0, "this graph calls F.hardtanh(y, -1.0, 1.0, True): the fourth positional argument is "
        "inplace. Bind the call to the function's signature (inspect.signature(fn).bind(*args, **kwargs)).",
        trace=trace_with_positional_arguments),
    "inplace_torch_function": case("""
        y = x + 0.25
        torch.relu_(y)
        torch.sigmoid_(y)
        return y""", 0, "torch.relu_ and torch.sigmoid_ are call_function nodes whose name ends in '_': " + INPLACE),
    "inplace_module": case("""
        y = x * 2
        self.act(y)
        return y""", 0, "nn.LeakyReLU(inplace=True) mutates its input: look at the module of a call_module "
        "node, too.", parts={"act": lambda: nn.LeakyReLU(0.1, inplace=True)}),
    "out_keyword": case("""
        buffer = torch.zeros_like(x)
        torch.mul(x, 3, out=buffer)
        x.exp()
        return buffer + 1""", 1, "torch.mul(x, 3, out=buffer) writes into buffer and its own result is unused; "
        "the write is the point."),
    "setitem": case("""
        y = x * 2
        setitem(y, (slice(None), 0), -7.0)
        return y""", 0, "operator.setitem (y[:, 0] = v) returns nothing and mutates y."),
    # Nothing uses the BN's output, but in training mode every call updates its running statistics.
    "batchnorm_training": case("""
        self.bn(x)
        return x * 2""", 0, "a BatchNorm in training mode updates running_mean, running_var and "
        "num_batches_tracked on every call.", parts={"bn": lambda: nn.BatchNorm1d(WIDTH)}),
    # A frozen Parameter, not a buffer: symbolic_trace records reads of parameters as get_attr nodes but
    # runs buffer code eagerly at trace time (torch.export records both).
    "state_mutation": case("""
        self.calls.add_(1)
        return x * 2""", 0, "self.calls.add_(1) updates the model's state: " + INPLACE,
        parts={"calls": lambda: nn.Parameter(torch.zeros(()), requires_grad=False)}),
    # randomness
    "random_function": case("""
        torch.randn_like(x)
        return x + 0.1 * torch.rand_like(x)""", 0, RANDOM),
    "dropout_function": case("""
        F.dropout(x, 0.5, training=True)
        return x * 2""", 0, "F.dropout(training=True) draws a random mask: " + RANDOM),
    "dropout_module": case("""
        self.drop(x)
        return x * 2""", 0, "an nn.Dropout in training mode draws a random mask: " + RANDOM,
        parts={"drop": lambda: nn.Dropout(0.3)}),  # a new module is in training mode
    # A random method: x.bernoulli() is a call_method node, which Node.is_impure calls pure.
    "normal_and_poisson": case("""
        torch.normal(x, 1.0)
        torch.poisson(x.abs())
        return x * 2""", 0, "torch.normal and torch.poisson draw random numbers though their names do not start with "
        "'rand': list the random functions (or read torch.Tag.nondeterministic_seeded on their aten ops), do not "
        "guess from names. " + RANDOM),
    "other_batchnorm_and_dropout_modules": case("""
        s = x.reshape(x.shape[0], 3, 2, 1)
        self.bn(s)
        self.drop2d(s)
        self.alpha(x)
        self.feature(s)
        return x * 2""", 0, "a BatchNorm2d tracking statistics updates them in training mode as a BatchNorm1d does, and "
        "nn.Dropout2d, nn.AlphaDropout and nn.FeatureAlphaDropout draw random numbers in training mode as nn.Dropout "
        "does: every module of those families, not one class of each.",
        parts={"bn": lambda: nn.BatchNorm2d(3), "drop2d": lambda: nn.Dropout2d(0.3),
               "alpha": lambda: nn.AlphaDropout(0.3), "feature": lambda: nn.FeatureAlphaDropout(0.3)}),
    "dropout_function_not_training": case("""
        F.dropout(x, 0.5, training=False)
        F.alpha_dropout(x, 0.2)
        return x * 2""", 2, "F.dropout(x, p, training=False) returns its input and draws nothing, and F.alpha_dropout's "
        "training defaults to False: both are dead code. Read the call's `training` argument, defaults included "
        "(inspect.signature(...).bind(...).apply_defaults())."),
    "random_method": case("""
        p = torch.sigmoid(x)
        p.bernoulli()
        p.multinomial(2)
        return x + torch.rand_like(x)""", 0, "p.bernoulli() and p.multinomial(2) are call_method nodes that draw "
        "random numbers, like torch.bernoulli(p): " + RANDOM),
    # what must go
    "unused_parameter": case("""
        self.weight * 2
        return x + 1""", (1, 2), "self.weight * 2 is dead; reading the parameter (get_attr) has no side effect, "
        "so it may go too.", parts={"weight": lambda: nn.Parameter(torch.randn(WIDTH))}),
    # Modules that change nothing and draw nothing in the state they are in: dead code like any other.
    "dropout_module_eval": case("""
        self.drop(x)
        return x * 2""", 1, "an nn.Dropout in eval mode returns its input and draws no random numbers: only "
        "training-mode dropout is random, so a dead one in eval mode must go. Look at the module's `training`.",
        parts={"drop": lambda: nn.Dropout(0.3).eval()}),
    "batchnorm_without_running_stats": case("""
        self.batch_stats(x)
        self.frozen(x)
        return x * 2""", 2, "a BatchNorm built with track_running_stats=False has no running statistics to update "
        "(it normalises with the batch's own), and one in eval mode only reads them: both are pure, so dead "
        "calls of them must go. Only a training-mode BatchNorm that tracks running statistics changes state.",
        parts={"batch_stats": lambda: nn.BatchNorm1d(WIDTH, track_running_stats=False),
               "frozen": lambda: nn.BatchNorm1d(WIDTH).eval()}),
    # Leaf modules are opaque: each of these changes state or draws random numbers in training mode, and none is
    # a BatchNorm or a dropout module.
    "opaque_modules_training": case("""
        s = x.unsqueeze(1)
        self.norm(s)
        self.rnn(s)
        return x * 2""", 0, "a leaf module is opaque: remove its call only when the module is known to change "
        "nothing and draw nothing in the state it is in. An InstanceNorm1d tracking running statistics updates them "
        "in training mode; a GRU with dropout between its layers draws random numbers.",
        parts={"norm": lambda: nn.InstanceNorm1d(1, track_running_stats=True),
               "rnn": lambda: nn.GRU(WIDTH, 4, num_layers=2, dropout=0.5, batch_first=True)}),
    "dead_submodule": case("""
        torch.relu(self.aux_head(x))
        return self.live(x)""", 2, "a call of an nn.Linear has no side effect: a dead one must go.",
        parts={"live": SQUARE_LINEAR, "aux_head": lambda: nn.Linear(WIDTH, 3)}),
}


# ----------------------------------------------------------------------------------------------
# L3: the classic leftover, an auxiliary head whose loss was removed, still computed in forward (the
# measured speedups: kata.toml's [speed]).

BENCHMARK_BATCH, BENCHMARK_WIDTH = 64, 512
wide = lambda: nn.Linear(BENCHMARK_WIDTH, BENCHMARK_WIDTH)  # noqa: E731
BENCHMARK = case("""
    features = torch.tanh(self.body(x))
    aux_logits = self.aux(features)
    aux_logits.softmax(dim=-1)
    return features""", 6, "",
    parts={"body": wide, "aux": lambda: nn.Sequential(wide(), nn.GELU(), wide(), nn.GELU(), wide())},
    inputs=lambda batch: (torch.randn(batch, BENCHMARK_WIDTH),), mode="eval", batch_sizes=(BENCHMARK_BATCH,))


# ----------------------------------------------------------------------------------------------
# L4: models generated from the seed, written as source like the zoo: a random sequence of steps, each
# live, dead or a side effect, whatever the spelling. The generator counts the dead nodes it writes.

VOCABULARY = manifest("04_dce")["hidden"]  # the source templates of every step: kata.toml's [hidden]
# Module calls that a dead chain may hold: none changes state or draws random numbers in the mode it is in.
PURE_MODULES = [SQUARE_LINEAR, SQUARE_LINEAR, lambda: nn.Dropout(0.3).eval(),
                lambda: nn.BatchNorm1d(WIDTH, track_running_stats=False), lambda: nn.BatchNorm1d(WIDTH).eval()]
# Leaf modules with an effect in training mode that are neither a BatchNorm nor a dropout module (README: a leaf
# module is opaque): running statistics updated, or random numbers drawn.
OPAQUE_MODULES = [lambda: nn.InstanceNorm1d(1, track_running_stats=True),
                  lambda: nn.GRU(WIDTH, 4, num_layers=2, dropout=0.5, batch_first=True),
                  lambda: nn.LSTM(WIDTH, 3, num_layers=3, dropout=0.3, batch_first=True)]
# The in-place statements spelled as a method no visible model calls (those call add_, mul_, relu_, sigmoid_ and
# zero_): every generated model holds one, so a pass that knows in-place methods from a list of the visible ones
# fails every seed.
VISIBLE_INPLACE_METHODS = {"add_", "mul_", "relu_", "sigmoid_", "zero_"}
UNSEEN_INPLACE = [op for op in VOCABULARY["inplace"]
                  if (method := re.match(r"\{v\}\.(\w+_)\(", op)) and method[1] not in VISIBLE_INPLACE_METHODS]
INPLACE_MODULES = [lambda: nn.ReLU(inplace=True), lambda: nn.Hardtanh(inplace=True),
                   lambda: nn.SiLU(inplace=True), lambda: nn.LeakyReLU(0.2, inplace=True)]


class HiddenModel:
    """A generated forward as source lines, the modules and parameters it reads, and its dead nodes."""

    def __init__(self, rng: random.Random):
        self.rng, self.parts, self.dead, self.may_go = rng, {}, 0, 0  # may_go: unused get_attr nodes
        self.lines = ["v = x * 1.0"] + (["v = v + extra"] if rng.random() < 0.5 else [])  # else `extra` is unused

    def constant(self) -> float:
        return round(self.rng.uniform(0.5, 2.0), 3)

    def pure(self, v: str) -> str:
        return self.rng.choice(VOCABULARY["pure"]).format(v=v, c=self.constant())

    def install(self, build: Callable) -> str:
        """A unique dotted path, one to three levels deep, for what `build` makes: no pass can key on names."""
        path = random_path(self.rng, 3, len(self.parts))
        self.parts[path] = build
        return path

    def live(self):
        linear = self.rng.random() < 0.3
        self.lines.append(f"v = self.{self.install(SQUARE_LINEAR)}(v)" if linear else f"v = {self.pure('v')}")

    def dead_chain(self):
        ops = self.rng.randint(1, 4)
        self.lines += [f"u = {self.pure('u' if i else 'v')}" for i in range(ops)]
        linear, param = self.rng.random() < 0.5, self.rng.random() < 0.5  # linear: any module without effects
        self.lines += [f"u = self.{self.install(self.rng.choice(PURE_MODULES))}(u)"] if linear else []
        self.lines += [f"u = u * self.{self.install(lambda: nn.Parameter(torch.randn(WIDTH)))}"] if param else []
        self.lines.append("u.sum()")  # the chain ends unused
        self.dead += ops + linear + param + 1
        self.may_go += param

    def side_effect(self, kind: str, ops: list[str] | None = None):
        """An op of `kind` (in place, or drawing random numbers; one of `ops` where given), or a module of that
        kind, whose result is unused."""
        module = (self.rng.choice(INPLACE_MODULES) if kind == "inplace"
                  else functools.partial(nn.Dropout, self.rng.uniform(0.1, 0.5)))
        op = self.rng.choice(ops or VOCABULARY[kind])
        self.lines.append(op.format(v="v", m=self.install(module) if "{m}" in op else None, c=self.constant()))

    def batchnorm(self):  # a new module is in training mode: every call updates its statistics
        self.lines.append(f"self.{self.install(lambda: nn.BatchNorm1d(WIDTH))}(v)")

    def opaque_module(self):  # a new module is in training mode: its dead call changes state or draws
        self.lines.append(f"self.{self.install(self.rng.choice(OPAQUE_MODULES))}(v.unsqueeze(1))")

    def nested_use(self):
        self.lines.append("v = " + self.rng.choice(VOCABULARY["nested_uses"]).format(a=self.pure("v")))


STEPS = [HiddenModel.live, HiddenModel.live, HiddenModel.dead_chain, HiddenModel.dead_chain,
         *[functools.partial(HiddenModel.side_effect, kind="inplace")] * 2,
         functools.partial(HiddenModel.side_effect, kind="random"), HiddenModel.batchnorm, HiddenModel.opaque_module, HiddenModel.nested_use]


def hidden_case(rng: random.Random) -> Case:
    source, output = HiddenModel(rng), rng.choice(VOCABULARY["outputs"])
    steps = [rng.choice(STEPS) for _ in range(rng.randint(6, 12))]
    if HiddenModel.dead_chain not in steps:
        steps.insert(rng.randrange(len(steps) + 1), HiddenModel.dead_chain)
    steps.insert(rng.randrange(len(steps) + 1), functools.partial(HiddenModel.side_effect, kind="inplace",
                                                                   ops=UNSEEN_INPLACE))
    for step in steps:
        step(source)
    return case("\n".join(source.lines + [f"return {output}"]), range(source.dead, source.dead + source.may_go + 1),
                "the pass must keep every side effect and remove every dead node, whatever the spelling.",
                signature="x, extra", inputs=lambda batch: (torch.randn(batch, WIDTH), torch.randn(batch, WIDTH)),
                parts=source.parts)
