"""Grader for kata 01: Linear + ReLU fusion by manual graph surgery."""
from __future__ import annotations

import copy
import functools
import random
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from graders.core import CheckFailed, Context, Kata
from graders.models import PathChain, random_identifier
from graders.numerics import assert_same_outputs, input_sets
from graders.structure import assert_module_count, assert_valid_graph_module, before_after, call_module_nodes
from graders.timing import assert_speedup

KATA = Kata("01_linear_relu", api={
    "FusedLinearReLU": "class FusedLinearReLU(nn.Module), built as FusedLinearReLU(linear: nn.Linear)",
    "fuse_linear_relu": "fuse_linear_relu(gm: torch.fx.GraphModule) -> torch.fx.GraphModule",
})

# The L3 benchmark: a small inference MLP at batch 1, where each op's fixed cost (module call,
# dispatch, allocation) is most of its time, so removing one module call and one allocation per
# layer pays; where the GEMM dominates (wide layers, big batches) fusing buys nothing on a CPU
# (README, "Where fusing pays"). Reference medians 1.25x-1.64x here (2-core CPU under load, one
# thread), a no-op 0.89x-1.10x and once more in CI: too close to time apart, so the level also counts
# bytes written, exactly. The reference writes half of what the original does (one tensor per layer
# instead of two); a no-op, or a fused forward whose ReLU is out of place, writes all of it.
# The CUDA threshold is a guess: not measured on a GPU yet.
SPEEDUP_THRESHOLDS = {"cpu": 1.10, "cuda": 1.10}
MAX_BYTES_FRACTION = 0.75
BENCHMARK_LAYERS, BENCHMARK_HIDDEN, BENCHMARK_BATCH = 8, 64, 1


# ----------------------------------------------------------------------------------------------
# Models. Every Linear gets a bias drawn from [-1, 1] (the default init makes it tiny), so a
# dropped bias shows; random inputs make about half of every pre-activation negative, so a
# dropped ReLU shows.

def linear(fin: int, fout: int, *, bias: bool = True) -> nn.Linear:
    layer = nn.Linear(fin, fout, bias=bias)
    if bias:
        with torch.no_grad():
            layer.bias.uniform_(-1, 1)
    return layer


# How a block spells its activation: a module (installed on the block) or a function of the tensor.
ACTIVATION_MODULES = {
    "relu_module": nn.ReLU,
    "relu_module_inplace": functools.partial(nn.ReLU, inplace=True),
    "relu6_module": nn.ReLU6,
    "leaky_relu_module": functools.partial(nn.LeakyReLU, 0.1),
}
ACTIVATION_FUNCTIONS = {
    "torch_relu": torch.relu,
    "torch_relu_inplace": torch.relu_,
    "functional_relu": F.relu,
    "functional_relu_inplace": functools.partial(F.relu, inplace=True),
    "method_relu": lambda y: y.relu(),
    "method_relu_inplace": lambda y: y.relu_(),
    "functional_relu6": F.relu6,
    "functional_leaky_relu": functools.partial(F.leaky_relu, negative_slope=0.1),
}
RELU_SPELLINGS = ["relu_module", "relu_module_inplace", "torch_relu", "torch_relu_inplace",
                  "functional_relu", "functional_relu_inplace", "method_relu", "method_relu_inplace"]
OTHER_ACTIVATIONS = ["relu6_module", "leaky_relu_module", "functional_relu6", "functional_leaky_relu"]


class Block(nn.Module):
    """A Linear and an activation, wired as `kind` says:

    pair: act(fc(x))   residual: x + act(fc(x))   dropout_between: act(dropout(fc(x)))
    linear_output_used_twice: act(fc(x)) + fc(x), one call   no_activation: tanh(fc(x))
    """

    def __init__(self, kind: str, spelling: str, fc: nn.Linear, names: tuple[str, str] = ("fc", "act")):
        super().__init__()
        self.kind, self.spelling, self.names = kind, spelling, names
        setattr(self, names[0], fc)
        if spelling in ACTIVATION_MODULES:
            setattr(self, names[1], ACTIVATION_MODULES[spelling]())
        if kind == "dropout_between":
            self.dropout = nn.Dropout(0.3)

    def activate(self, y):
        if self.spelling in ACTIVATION_MODULES:
            return getattr(self, self.names[1])(y)
        return ACTIVATION_FUNCTIONS[self.spelling](y)

    def forward(self, x):
        fc = getattr(self, self.names[0])
        if self.kind == "residual":
            return x + self.activate(fc(x))
        if self.kind == "dropout_between":
            return self.activate(self.dropout(fc(x)))
        if self.kind == "linear_output_used_twice":
            y = fc(x)
            return torch.sigmoid(y) * self.activate(y)
        if self.kind == "no_activation":
            return torch.tanh(fc(x))
        return self.activate(fc(x))

    @property
    def fusable(self) -> bool:
        return self.kind in ("pair", "residual") and self.spelling in RELU_SPELLINGS


class SharedLinear(nn.Module):
    """One Linear called at two sites, only the first followed by a ReLU."""

    def __init__(self):
        super().__init__()
        self.fc = linear(8, 8)

    def forward(self, x):
        return torch.relu(self.fc(x)) + torch.sigmoid(self.fc(x * 2))


class SharedReLU(nn.Module):
    """One nn.ReLU module after two Linears and once more on its own."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.act = linear(8, 8), linear(8, 8), nn.ReLU()

    def forward(self, x):
        return self.act(self.fc2(self.act(self.fc1(x)))) + self.act(x - 0.5)


class ReLUOutputUsedTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = linear(8, 8)

    def forward(self, x):
        z = F.relu(self.fc(x))
        return z * torch.sigmoid(z) + z


@dataclass
class Case:
    build: Callable[[], nn.Module]
    in_shape: tuple[int, ...]   # one sample's shape; the batch dimension is added in front
    fused: int | None           # FusedLinearReLU calls a correct pass leaves; None: more than one answer is right
    hint: str
    dtype: torch.dtype = torch.float32
    train: bool = False         # the mode the model runs in; eval (inference) unless a case says otherwise


def mlp(spellings: list[str], width: int = 12) -> nn.Module:
    """Linear + activation per spelling, then a last Linear with nothing after it."""
    layers = OrderedDict()
    for i, spelling in enumerate(spellings, 1):
        layers[f"fc{i}"] = linear(width, width)
        layers[f"act{i}"] = ACTIVATION_MODULES[spelling]()
    layers[f"fc{len(spellings) + 1}"] = linear(width, 5)
    return nn.Sequential(layers)


def one_block(spelling: str, kind: str = "pair", *, bias: bool = True, fin: int = 10, fout: int = 7) -> Callable:
    return lambda: Block(kind, spelling, linear(fin, fout, bias=bias))


def _nested() -> nn.Module:
    return PathChain([(f"encoder.blocks.{i}", Block("pair", spelling, linear(9, 9)))
                  for i, spelling in enumerate(["relu_module", "functional_relu", "method_relu_inplace"])])


SPELLING_HINT = "this ReLU spelling follows a Linear too; look at the node's op and target in print_tabular()."
EXACT_CASES: dict[str, Case] = {
    "several_layers": Case(lambda: mlp(["relu_module"] * 3), (12,), 3,
                           "fuse every Linear -> ReLU pair; the last Linear has no ReLU after it."),
    **{spelling: Case(one_block(spelling), (10,), 1, SPELLING_HINT) for spelling in RELU_SPELLINGS[1:]},
    "linear_without_bias": Case(one_block("functional_relu", bias=False), (10,), 1,
                                "a Linear built with bias=False has linear.bias None."),
    "sequence_input": Case(one_block("method_relu", fin=6, fout=6), (5, 6), 1,
                           "nn.Linear accepts inputs of any rank (..., in_features); so must the fused module."),
    "nested_dotted_names": Case(_nested, (9,), 3,
                                "node.target is a dotted path ('encoder.blocks.0.fc'); gm.get_submodule and "
                                "gm.set_submodule accept it, setattr does not."),
    "float64_model": Case(lambda: mlp(["relu_module", "relu_module_inplace"]).double(), (12,), 2,
                          "the fused module must compute in the Linear's dtype.", torch.float64),
    "relu_output_used_twice": Case(ReLUOutputUsedTwice, (8,), 1,
                                   "every user of the ReLU node must read the fused node instead "
                                   "(relu_node.replace_all_uses_with)."),
    "relu_module_shared": Case(SharedReLU, (8,), 2,
                               "the ReLU module is also called on its own: leave that call and the module alone."),
    "relu6_not_fused": Case(lambda: mlp(["relu6_module"]), (12,), 0,
                            "relu6 clips at 6 as well: it is not a ReLU."),
    "functional_relu6_not_fused": Case(one_block("functional_relu6"), (10,), 0,
                                       "F.relu6 clips at 6 as well: it is not a ReLU."),
    "leaky_relu_not_fused": Case(lambda: mlp(["leaky_relu_module"]), (12,), 0,
                                 "LeakyReLU keeps a slope below zero: it is not a ReLU."),
    "dropout_between": Case(one_block("relu_module", "dropout_between"), (10,), 0,
                            "only a ReLU whose input is the Linear's output may fuse; in training mode the "
                            "Dropout between them zeroes a random part of its input.", train=True),
    "linear_output_used_twice": Case(one_block("torch_relu", "linear_output_used_twice", fout=10), (10,), 0,
                                     "the Linear's output has a second user that needs the values before the ReLU."),
    "linear_module_shared": Case(SharedLinear, (8,), None,
                                 "the Linear module is called at two sites: whatever you install under its name "
                                 "runs at both."),
}


def seeded(module: Callable) -> Callable:
    """Runs `module` from the same random state every time, so a Dropout in training mode draws the
    same mask in the original and in the rewritten model."""
    def run(*inputs):
        torch.manual_seed(1234)
        return module(*inputs)
    return run


def inputs_for(case: Case, device: torch.device) -> Callable[[int], tuple]:
    return lambda batch: (torch.randn(batch, *case.in_shape, dtype=case.dtype, device=device),)


# ----------------------------------------------------------------------------------------------
# Hidden models (L4): random depth, widths, input rank, ReLU spellings, names and nesting, with
# pairs that must not fuse mixed in. The generator knows how many a correct pass fuses.

FUSABLE_KINDS = ["pair", "pair", "residual"]
UNFUSABLE_KINDS = ["dropout_between", "linear_output_used_twice", "no_activation"]


def hidden_case(rng: random.Random) -> Case:
    width = in_width = rng.choice([6, 8, 12, 16])
    blocks, fused, length = [], 0, rng.randint(4, 7)
    while len(blocks) < length or fused < 2:  # at least two pairs to fuse: a no-op must not pass
        kind = rng.choice(FUSABLE_KINDS + UNFUSABLE_KINDS)
        # Most pairs use a ReLU spelling; some use a look-alike that must stay.
        spelling = rng.choice(OTHER_ACTIVATIONS) if rng.random() < 0.2 else rng.choice(RELU_SPELLINGS)
        fout = width if kind in ("residual", "linear_output_used_twice") else rng.choice([6, 8, 12, 16, 24])
        names = (random_identifier(rng), random_identifier(rng))
        while names[1] == names[0]:
            names = (names[0], random_identifier(rng))
        block = Block(kind, spelling, linear(width, fout, bias=rng.random() < 0.7), names)
        fused += block.fusable
        path = ".".join(random_identifier(rng) for _ in range(rng.randint(1, 3))) + f"_{len(blocks)}"
        blocks.append((path, block))
        width = fout
    in_shape = (in_width,) if rng.random() < 0.6 else (rng.randint(2, 5), in_width)
    return Case(lambda: PathChain(blocks), in_shape, fused,
                "the pass must work for any names, nesting depth and ReLU spelling.", train=rng.random() < 0.3)


# ----------------------------------------------------------------------------------------------
# Checks

def fused_type(ctx: Context) -> type:
    cls = getattr(ctx.solution, "FusedLinearReLU", None)
    if not isinstance(cls, type):
        raise CheckFailed(f"{ctx.solution_path} has no class FusedLinearReLU: the kata asks for "
                          f"{KATA.api['FusedLinearReLU']}.")
    return cls


def relu_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    """The nodes that compute a ReLU, in any spelling."""
    modules = dict(gm.named_modules())
    return [n for n in gm.graph.nodes
            if (n.op == "call_function" and n.target in (torch.relu, torch.relu_, F.relu))
            or (n.op == "call_method" and n.target in ("relu", "relu_"))
            or (n.op == "call_module" and type(modules.get(n.target)) is nn.ReLU)]


def linear_nodes(gm: fx.GraphModule, fused: type) -> list[fx.Node]:
    """Calls of plain Linears (a FusedLinearReLU that subclasses nn.Linear does not count)."""
    modules = dict(gm.named_modules())
    return [n for n in gm.graph.nodes if n.op == "call_module"
            and isinstance(modules.get(n.target), nn.Linear) and not isinstance(modules.get(n.target), fused)]


def parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def run_fuse(ctx: Context, model: nn.Module) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Trace the model and run the learner's pass; returns (traced before the pass, result)."""
    before = fx.symbolic_trace(copy.deepcopy(model))
    gm = ctx.call("fuse_linear_relu", fx.symbolic_trace(model), returns=fx.GraphModule)
    assert_valid_graph_module(gm, "fuse_linear_relu")
    return before, gm


def assert_count(gm, before, nodes: list[fx.Node], expected: int, what: str, hint: str) -> None:
    if len(nodes) != expected:
        names = ", ".join(n.name for n in nodes) or "none"
        raise CheckFailed(f"after fuse_linear_relu, the graph runs {len(nodes)} {what} ({names}); expected "
                          f"{expected}. Hint: {hint}" + before_after(before, gm))


def check_case(ctx: Context, case: Case) -> dict:
    model = case.build().train(case.train).to(ctx.device)
    pristine = copy.deepcopy(model)
    before, gm = run_fuse(ctx, model)
    fused = fused_type(ctx)
    linears_before, relus_before = len(linear_nodes(before, fused)), len(relu_nodes(before))
    if case.fused is not None:
        assert_module_count(gm, fused, case.fused, function="fuse_linear_relu", before=before, hint=case.hint)
        assert_count(gm, before, linear_nodes(gm, fused), linears_before - case.fused, "nn.Linear call(s)",
                     "each fused Linear node must leave the graph (gm.graph.erase_node), every other one stay.")
        assert_count(gm, before, relu_nodes(gm), relus_before - case.fused, "ReLU node(s)",
                     "each fused ReLU node must leave the graph (gm.graph.erase_node) once its users read the "
                     "fused node; every other one stays.")
    if parameter_count(gm) != parameter_count(before):
        raise CheckFailed(
            f"after fuse_linear_relu, the GraphModule holds {parameter_count(gm)} parameters; the original "
            f"holds {parameter_count(before)}. Hint: FusedLinearReLU should hold the Linear's own weight and bias "
            "as parameters, and a Linear that was fused should leave the GraphModule.")
    assert_same_outputs(seeded(pristine), seeded(gm), input_sets(inputs_for(case, ctx.device)),
                        what="the fused module", hint=case.hint)
    return {"fused": len(call_module_nodes(gm, fused)), "linears_before": linears_before}


@KATA.check(level=1)
def fused_module(ctx: Context):
    fc = linear(10, 6)
    expected = copy.deepcopy(fc)
    module = ctx.call("FusedLinearReLU", fc, returns=nn.Module)
    if parameter_count(module) != parameter_count(expected):
        raise CheckFailed(f"FusedLinearReLU(linear) holds {parameter_count(module)} parameters; the Linear holds "
                          f"{parameter_count(expected)}. Hint: keep the Linear's weight and bias as its parameters.")
    inputs = input_sets(lambda batch: (torch.randn(batch, 10),))
    with torch.no_grad():
        x = inputs[0][0]
        got = module(x)
        slips = {"the ReLU is missing": expected(x), "the bias is missing": torch.relu(x @ expected.weight.T)}
    for slip, wrong in slips.items():
        if isinstance(got, torch.Tensor) and got.shape == wrong.shape and torch.allclose(got, wrong, atol=1e-5):
            raise CheckFailed(f"FusedLinearReLU(linear)(x) computes something else than relu(linear(x)): {slip}.")
    assert_same_outputs(lambda x: torch.relu(expected(x)), module, inputs, what="FusedLinearReLU(linear)",
                        hint="forward computes relu(x @ weight.T + bias), e.g. F.linear(x, weight, bias).relu_().")


@KATA.check(level=1)
def single_pair(ctx: Context):
    return check_case(ctx, Case(one_block("relu_module"), (10,), 1,
                                "insert a call_module node for a FusedLinearReLU, point the ReLU node's users "
                                "at it, and erase the ReLU and Linear nodes."))


for _name, _case in EXACT_CASES.items():
    KATA.add(2, _name, lambda ctx, case=_case: check_case(ctx, case))


@KATA.check(level=2)
def trains_like_the_original(ctx: Context):
    """Linear and ReLU behave alike in training and eval mode, so a training model fuses too, and its
    gradients must still reach every parameter."""
    model = mlp(["relu_module", "relu_module_inplace"]).train().to(ctx.device)
    pristine = copy.deepcopy(model)
    before, gm = run_fuse(ctx, model)
    assert_module_count(gm, fused_type(ctx), 2, function="fuse_linear_relu", before=before,
                        hint="Linear and ReLU compute the same in training mode: fuse them there too.")
    want_x = torch.randn(4, 12, device=ctx.device).requires_grad_()
    got_x = want_x.detach().clone().requires_grad_()
    try:
        pristine(want_x).square().sum().backward()
        gm(got_x).square().sum().backward()
    except RuntimeError as exc:
        raise CheckFailed(f"backward through the fused training-mode model raised: {exc}. Hint: the fused module "
                          "must stay differentiable; do not detach or use torch.no_grad in forward.") from None
    missing = [name for name, p in gm.named_parameters() if p.grad is None]
    if missing or got_x.grad is None:
        raise CheckFailed(f"after backward through the fused training-mode model, no gradient reached "
                          f"{', '.join(missing + (['the input'] if got_x.grad is None else []))}. Hint: use the "
                          "Linear's own parameters in forward, without .detach() or torch.no_grad().")
    if not torch.allclose(got_x.grad, want_x.grad, rtol=1e-4, atol=1e-5):
        raise CheckFailed("the input gradient of the fused training-mode model differs from the original's "
                          f"(largest error {(got_x.grad - want_x.grad).abs().max().item():.3g}).")


@KATA.check(level=3)
def small_mlp_speedup(ctx: Context):
    h = BENCHMARK_HIDDEN
    model = nn.Sequential(*(m for _ in range(BENCHMARK_LAYERS) for m in (linear(h, h), nn.ReLU())))
    model = model.eval().to(ctx.device)
    baseline = fx.symbolic_trace(copy.deepcopy(model))
    _, candidate = run_fuse(ctx, model)
    return assert_speedup(ctx, baseline, candidate, lambda: (torch.randn(BENCHMARK_BATCH, h, device=ctx.device),),
                          SPEEDUP_THRESHOLDS, what="the fused MLP", max_bytes_fraction=MAX_BYTES_FRACTION,
                          hint="every Linear in this MLP is followed by a ReLU: fuse all eight, and make the "
                               "fused forward one F.linear and one in-place relu_, nothing more.")


for _index in range(1, 6):
    KATA.add(4, f"model_{_index}", lambda ctx: check_case(ctx, hidden_case(random.Random(ctx.seed))))
