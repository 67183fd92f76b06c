"""Grader for kata 03: Conv2d + BatchNorm2d folding."""
from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from graders.core import CheckFailed, Context, Kata
from graders.models import PathChain, random_identifier
from graders.numerics import assert_same_outputs, input_sets
from graders.structure import assert_module_count, assert_valid_graph_module, call_module_nodes, traced_copy
from graders.timing import assert_speedup

KATA = Kata("03_conv_bn", api={
    "fuse_conv_bn_weights": "fuse_conv_bn_weights(conv_w, conv_b, bn_rm, bn_rv, bn_eps, bn_w, bn_b) -> (weight, bias)",
    "fuse_conv_bn": "fuse_conv_bn(gm: torch.fx.GraphModule) -> torch.fx.GraphModule",
})

# The L3 benchmark: a small edge CNN, batch 1, where each op's fixed cost is a large share of its
# time, so removing a third of the ops pays (README, "Where folding pays"). Reference medians
# 1.43x-1.62x on CPU single-threaded, a no-op 0.98x-1.07x and once 1.19x: the level also counts bytes
# written, exactly. Folding removes each BatchNorm's output tensor, a third of what the model writes;
# a no-op writes all of it. The CUDA figure is not yet measured on a GPU.
SPEEDUP_THRESHOLDS = {"cpu": 1.25, "cuda": 1.20}
MAX_BYTES_FRACTION = 0.8
BENCHMARK_BLOCKS, BENCHMARK_CHANNELS, BENCHMARK_SIZE = 8, 16, 8


# ----------------------------------------------------------------------------------------------
# Models. Every BatchNorm gets random statistics and a random eps, and variances reach down to
# 0.05, so that dropping eps, the mean, gamma, beta or the conv bias changes outputs visibly.

def bn2d(channels: int, *, affine: bool = True, track_running_stats: bool = True) -> nn.BatchNorm2d:
    eps = random.choice([1e-3, 1e-2, 0.1])
    bn = nn.BatchNorm2d(channels, eps=eps, affine=affine, track_running_stats=track_running_stats)
    with torch.no_grad():
        if track_running_stats:
            bn.running_mean.uniform_(-2, 2)
            bn.running_var.uniform_(0.05, 3)
        if affine:
            bn.weight.uniform_(-2, 2)
            bn.bias.uniform_(-1, 1)
    return bn.eval()


def conv2d(cin: int, cout: int, kernel=3, *, bias: bool = True, **options) -> nn.Conv2d:
    options.setdefault("padding", (kernel if isinstance(kernel, int) else kernel[0]) // 2)
    conv = nn.Conv2d(cin, cout, kernel, bias=bias, **options)
    if bias:
        with torch.no_grad():
            conv.bias.uniform_(-1, 1)
    return conv


class ConvBN(nn.Module):
    def __init__(self, conv: nn.Conv2d, bn: nn.BatchNorm2d, relu: bool = False):
        super().__init__()
        self.conv, self.bn, self.relu = conv, bn, relu

    def forward(self, x):
        y = self.bn(self.conv(x))
        return F.relu(y) if self.relu else y


class Residual(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv1, self.bn1 = conv2d(channels, channels, bias=False), bn2d(channels)
        self.conv2, self.bn2 = conv2d(channels, channels, bias=False), bn2d(channels)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


class ConvUsedTwice(nn.Module):
    """The conv output feeds the BN and an addition: folding would change the addition's input."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = conv2d(4, 4), bn2d(4)

    def forward(self, x):
        y = self.conv(x)
        return self.bn(y) + y


class SharedConv(nn.Module):
    """One conv module called at two sites, only one followed by a BN."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = conv2d(4, 4), bn2d(4)

    def forward(self, x):
        return self.bn(self.conv(x)) + torch.sigmoid(self.conv(x * 2))


class BNAfterReLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = conv2d(3, 5), bn2d(5)

    def forward(self, x):
        return self.bn(torch.relu(self.conv(x)))


@dataclass
class Case:
    build: Callable[[], nn.Module]
    in_shape: tuple[int, int, int]
    bn_left: int | None  # BatchNorm2d call sites a correct pass leaves; None: either is correct
    hint: str
    dtype: torch.dtype = torch.float32


def _seq(*blocks: nn.Module) -> nn.Sequential:
    return nn.Sequential(*blocks)


def _nested() -> nn.Module:
    root = nn.Module()
    root.features = nn.Module()
    root.features.stage_1 = nn.ModuleDict({"unit0": ConvBN(conv2d(3, 6), bn2d(6), relu=True),
                                           "unit1": ConvBN(conv2d(6, 6, bias=False), bn2d(6))})

    class Nested(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = root.features

        def forward(self, x):
            for unit in self.features.stage_1.values():
                x = unit(x)
            return x

    return Nested()


def _train_mode_bn() -> nn.Module:
    model = ConvBN(conv2d(3, 4), bn2d(4))
    model.bn.train()
    return model


FOLD_ALL = "every Conv2d -> BatchNorm2d pair in this model is safe to fold."
EXACT_CASES: dict[str, Case] = {
    "several_blocks_relu": Case(lambda: _seq(*(ConvBN(conv2d(c, 8), bn2d(8), relu=True) for c in (3, 8, 8))),
                                (3, 12, 12), 0, FOLD_ALL),
    "conv_without_bias": Case(lambda: ConvBN(conv2d(3, 6, bias=False), bn2d(6)), (3, 10, 10), 0,
                              "a conv without bias still gets one: b' = (0 - mean) * scale + beta."),
    "depthwise": Case(lambda: ConvBN(conv2d(6, 6, groups=6), bn2d(6)), (6, 10, 10), 0,
                      "keep the conv's groups: copy the conv module rather than building a new one by hand."),
    "grouped": Case(lambda: ConvBN(conv2d(8, 12, groups=4), bn2d(12)), (8, 10, 10), 0,
                    "the scale is per *output* channel, dimension 0 of the weight, whatever the groups."),
    "stride_dilation_padding": Case(
        lambda: _seq(ConvBN(conv2d(4, 6, 3, stride=2, padding=2, dilation=2, padding_mode="reflect"), bn2d(6)),
                     ConvBN(conv2d(6, 5, (3, 5), stride=(2, 1), padding=(1, 2), padding_mode="circular"), bn2d(5))),
        (4, 17, 15), 0, "keep stride, padding, dilation and padding_mode: copy the conv module."),
    "residual": Case(lambda: Residual(6), (6, 9, 9), 0, FOLD_ALL),
    "nested_dotted_names": Case(_nested, (3, 8, 8), 0,
                                "node.target is a dotted path ('features.stage_1.unit0.conv'); "
                                "gm.get_submodule and gm.set_submodule accept it."),
    "bn_affine_false": Case(lambda: ConvBN(conv2d(3, 4), bn2d(4, affine=False)), (3, 8, 8), 0,
                            "with affine=False, bn.weight and bn.bias are None: gamma = 1, beta = 0."),
    "float64_model": Case(lambda: Residual(4).double(), (4, 7, 7), 0,
                          "the fused parameters must keep the model's dtype.", torch.float64),
    "bn_in_training_mode": Case(_train_mode_bn, (3, 8, 8), 1,
                                "in training mode a BN normalises with the batch's statistics: leave it."),
    "bn_without_running_stats": Case(lambda: ConvBN(conv2d(3, 4), bn2d(4, track_running_stats=False)),
                                     (3, 8, 8), 1,
                                     "with track_running_stats=False a BN uses batch statistics even in eval mode."),
    "conv_output_used_twice": Case(ConvUsedTwice, (4, 8, 8), 1,
                                   "the conv's output has a second user that must keep seeing the un-normalised values."),
    "conv_module_shared": Case(SharedConv, (4, 8, 8), None,
                               "the conv module is called at two sites: changing its weights changes both."),
    "bn_after_relu": Case(BNAfterReLU, (3, 8, 8), 1,
                          "only a BN whose input is the conv's output can fold."),
}


def inputs_for(case: Case, device: torch.device) -> Callable[[int], tuple]:
    return lambda batch: (torch.randn(batch, *case.in_shape, dtype=case.dtype, device=device),)


# ----------------------------------------------------------------------------------------------
# Hidden models (L4): random depth, widths, conv options, names and nesting, with some pairs that
# must not fold mixed in. The generator knows how many BatchNorms a correct pass leaves.

class HiddenBlock(nn.Module):
    def __init__(self, kind: str, conv: nn.Conv2d, bn: nn.BatchNorm2d, names: tuple[str, str]):
        super().__init__()
        self.kind, self.names = kind, names
        setattr(self, names[0], conv)
        setattr(self, names[1], bn)

    def forward(self, x):
        conv, bn = getattr(self, self.names[0]), getattr(self, self.names[1])
        if self.kind == "residual":
            return x + bn(conv(x))
        if self.kind == "conv_output_used_twice":
            y = conv(x)
            return bn(y) * torch.sigmoid(y)
        if self.kind == "bn_after_relu":
            return bn(torch.relu(conv(x)))
        return torch.relu(bn(conv(x)))


FOLDABLE_KINDS = ["plain", "plain", "residual", "residual"]
UNFOLDABLE_KINDS = ["conv_output_used_twice", "bn_after_relu", "bn_in_training_mode"]


def hidden_case(rng: random.Random) -> Case:
    channels = in_channels = rng.choice([3, 4, 6, 8])
    size = rng.choice([12, 14, 16])
    blocks, bn_left, strided = [], 0, False
    for _ in range(rng.randint(3, 6)):
        kind = rng.choice(FOLDABLE_KINDS + UNFOLDABLE_KINDS)
        cout = channels if kind == "residual" else rng.choice([4, 6, 8, 12])
        groups = rng.choice([g for g in (1, 2, channels) if channels % g == 0 and cout % g == 0])
        kernel = rng.choice([1, 3, 5])
        dilation = rng.choice([1, 1, 2]) if kernel > 1 else 1
        stride = 2 if kind != "residual" and not strided and rng.random() < 0.3 else 1
        strided |= stride == 2
        padding = dilation * (kernel // 2)
        padding_mode = rng.choice(["zeros", "zeros", "reflect", "circular"]) if padding <= 2 else "zeros"
        conv = conv2d(channels, cout, kernel, bias=rng.random() < 0.5, stride=stride, padding=padding,
                      dilation=dilation, groups=groups, padding_mode=padding_mode)
        bn = bn2d(cout, affine=rng.random() < 0.7)
        if kind == "bn_in_training_mode":
            bn.train()
        bn_left += kind in UNFOLDABLE_KINDS
        names = (random_identifier(rng), random_identifier(rng))
        while names[1] == names[0]:
            names = (names[0], random_identifier(rng))
        depth = rng.randint(1, 3)
        path = ".".join(random_identifier(rng) for _ in range(depth)) + f"_{len(blocks)}"
        blocks.append((path, HiddenBlock(kind, conv, bn, names)))
        channels = cout
    return Case(lambda: PathChain(blocks), (in_channels, size, size), bn_left, "the pass must work for any names, nesting depth and conv options.")


# ----------------------------------------------------------------------------------------------
# Checks

def bn_call_count(gm: fx.GraphModule) -> int:
    return len(call_module_nodes(gm, nn.BatchNorm2d))


def run_fuse(ctx: Context, model: nn.Module) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Trace the model and run the learner's pass; returns (traced before the pass, result)."""
    before = traced_copy(model)
    gm = ctx.call("fuse_conv_bn", fx.symbolic_trace(model), returns=fx.GraphModule)
    assert_valid_graph_module(gm, "fuse_conv_bn")
    return before, gm


def check_case(ctx: Context, case: Case) -> dict:
    model = case.build().to(ctx.device)
    pristine = copy.deepcopy(model)
    before, gm = run_fuse(ctx, model)
    bn_before = bn_call_count(before)
    if case.bn_left is not None:
        assert_module_count(gm, nn.BatchNorm2d, case.bn_left, function="fuse_conv_bn", before=before, hint=case.hint)
    assert_module_count(gm, nn.Conv2d, len(call_module_nodes(before, nn.Conv2d)), function="fuse_conv_bn",
                        before=before, hint="folding keeps every convolution; it only removes BatchNorms.")
    assert_same_outputs(pristine, gm, input_sets(inputs_for(case, ctx.device)), what="the folded module",
                        hint=case.hint, graphs=(before, gm))
    return {"batchnorms_before": bn_before, "batchnorms_after": bn_call_count(gm)}


WEIGHT_VARIANTS = {
    "eps": "the eps term left out (sqrt(running_var) instead of sqrt(running_var + eps))",
    "mean": "the running mean left out",
    "conv_b": "the conv bias left out",
    "bn_b": "beta (bn.bias) left out",
    "bn_w": "gamma (bn.weight) left out",
}


def expected_fold(conv_w, conv_b, rm, rv, eps, bn_w, bn_b, leave_out: str | None = None):
    """The folding formula in float64, optionally with one term left out (to name a learner's slip)."""
    d = lambda t, neutral: (torch.full_like(rm, neutral) if t is None else t).double()  # noqa: E731
    conv_b, bn_w, bn_b = d(conv_b, 0.0), d(bn_w, 1.0), d(bn_b, 0.0)
    rm, rv, eps = rm.double(), rv.double(), 0.0 if leave_out == "eps" else eps
    rm = torch.zeros_like(rm) if leave_out == "mean" else rm
    conv_b = torch.zeros_like(conv_b) if leave_out == "conv_b" else conv_b
    bn_b = torch.zeros_like(bn_b) if leave_out == "bn_b" else bn_b
    bn_w = torch.ones_like(bn_w) if leave_out == "bn_w" else bn_w
    scale = bn_w / torch.sqrt(rv + eps)
    return conv_w.double() * scale.reshape(-1, 1, 1, 1), (conv_b - rm) * scale + bn_b


def check_fold_weights(ctx: Context, *, with_optional: bool) -> None:
    cout = 6
    conv_w = torch.randn(cout, 3, 3, 3)
    rm, rv, eps = torch.empty(cout).uniform_(-2, 2), torch.empty(cout).uniform_(0.05, 3), random.choice([1e-2, 0.1])
    conv_b, bn_w, bn_b = (torch.randn(cout), torch.randn(cout), torch.randn(cout)) if with_optional else (None, None, None)
    args = (conv_w, conv_b, rm, rv, eps, bn_w, bn_b)
    got = ctx.call("fuse_conv_bn_weights", *args, returns=tuple)
    if len(got) != 2 or not all(isinstance(t, torch.Tensor) for t in got):
        raise CheckFailed(f"fuse_conv_bn_weights must return a (weight, bias) pair of tensors, got {len(got)} items.")
    want = expected_fold(*args)
    call = "with conv bias, gamma and beta given" if with_optional else "with conv_b=None, bn_w=None, bn_b=None"
    for label, g, w in zip(("weight", "bias"), got, want):
        if g.shape != w.shape or g.dtype != conv_w.dtype:
            raise CheckFailed(f"fuse_conv_bn_weights ({call}) returned a {label} of shape {tuple(g.shape)} and dtype "
                              f"{g.dtype}; expected shape {tuple(w.shape)} and dtype {conv_w.dtype}.")
        if not torch.allclose(g.double(), w, rtol=1e-5, atol=1e-6):
            slips = [why for term, why in WEIGHT_VARIANTS.items()
                     if torch.allclose(g.double(), expected_fold(*args, leave_out=term)[label == "bias"], rtol=1e-5, atol=1e-6)]
            diagnosis = f" It matches the formula with {slips[0]}." if slips else ""
            raise CheckFailed(
                f"fuse_conv_bn_weights ({call}) returned a wrong fused {label}: largest error "
                f"{(g.double() - w).abs().max().item():.3g}.{diagnosis} Hint: scale = gamma / sqrt(var + eps); "
                "W' = W * scale per output channel; b' = (b - mean) * scale + beta."
            )


@KATA.check(level=1)
def fold_weights(ctx: Context):
    check_fold_weights(ctx, with_optional=True)


@KATA.check(level=1)
def fold_weights_optional_none(ctx: Context):
    check_fold_weights(ctx, with_optional=False)


@KATA.check(level=1)
def single_pair(ctx: Context):
    return check_case(ctx, Case(lambda: ConvBN(conv2d(3, 8), bn2d(8)), (3, 10, 10), 0,
                                "replace the BN node's uses by the conv node, erase the BN node, "
                                "and load the fused weights into the conv."))


for _name, _case in EXACT_CASES.items():
    KATA.add(2, _name, lambda ctx, case=_case: check_case(ctx, case))


@KATA.check(level=2)
def original_model_unchanged(ctx: Context):
    """symbolic_trace shares leaf modules with the traced model: editing them in place corrupts it."""
    model = _seq(ConvBN(conv2d(3, 6), bn2d(6), relu=True), ConvBN(conv2d(6, 6), bn2d(6))).to(ctx.device)
    pristine = copy.deepcopy(model)
    run_fuse(ctx, model)
    assert_same_outputs(pristine, model, input_sets(lambda b: (torch.randn(b, 3, 8, 8, device=ctx.device),)),
                        what="the model that was traced, after the pass ran,",
                        hint="symbolic_trace shares the conv modules with the original model; fold into a copy "
                             "(copy.deepcopy(conv)) and install it with gm.set_submodule.")


@KATA.check(level=3)
def small_cnn_speedup(ctx: Context):
    c = BENCHMARK_CHANNELS
    model = _seq(*(ConvBN(conv2d(c, c, bias=False), bn2d(c), relu=True) for _ in range(BENCHMARK_BLOCKS)))
    model = model.eval().to(ctx.device)
    baseline = traced_copy(model)
    _, candidate = run_fuse(ctx, model)
    return assert_speedup(ctx, baseline, candidate,
                          lambda: (torch.randn(1, c, BENCHMARK_SIZE, BENCHMARK_SIZE, device=ctx.device),),
                          SPEEDUP_THRESHOLDS, what="the folded small CNN", max_bytes_fraction=MAX_BYTES_FRACTION,
                          hint="every BatchNorm in this CNN follows a conv it can fold into: fold all eight.")


for _index in range(1, 6):
    KATA.add(4, f"model_{_index}",
             lambda ctx: check_case(ctx, hidden_case(random.Random(ctx.seed))))
