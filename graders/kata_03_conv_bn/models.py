"""Kata 03's model zoo and hidden-model generator.

Every BatchNorm gets random statistics and a random eps, and variances reach down to 0.05, so that
dropping eps, the mean, gamma, beta or the conv bias changes outputs visibly. Inference models are put
in eval mode as a whole (as `model.eval()` does); a case that needs a module in training mode says so.
"""
from __future__ import annotations

import random

import torch
import torch.nn as nn
import torch.nn.functional as F

from graders.harness import Case
from graders.models import PathChain, random_identifier


def bn2d(channels: int, *, affine: bool = True, track_running_stats: bool = True) -> nn.BatchNorm2d:
    bn = nn.BatchNorm2d(channels, eps=random.choice([1e-3, 1e-2, 0.1]), affine=affine,
                        track_running_stats=track_running_stats)
    with torch.no_grad():
        if track_running_stats:
            bn.running_mean.uniform_(-2, 2)
            bn.running_var.uniform_(0.05, 3)
        if affine:
            bn.weight.uniform_(-2, 2)
            bn.bias.uniform_(-1, 1)
    return bn


def conv2d(cin: int, cout: int, kernel=3, *, bias: bool = True, transposed: bool = False, **options) -> nn.Module:
    options.setdefault("padding", (kernel if isinstance(kernel, int) else kernel[0]) // 2)
    conv = (nn.ConvTranspose2d if transposed else nn.Conv2d)(cin, cout, kernel, bias=bias, **options)
    if bias:
        with torch.no_grad():
            conv.bias.uniform_(-1, 1)
    return conv


class ConvBN(nn.Module):
    def __init__(self, conv: nn.Module, bn: nn.BatchNorm2d, relu: bool = False):
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


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Module()
        self.features.stage_1 = nn.ModuleDict({"unit0": ConvBN(conv2d(3, 6), bn2d(6), relu=True),
                                               "unit1": ConvBN(conv2d(6, 6, bias=False), bn2d(6))})

    def forward(self, x):
        for unit in self.features.stage_1.values():
            x = unit(x)
        return x


def seq(*blocks: nn.Module) -> nn.Sequential:
    return nn.Sequential(*blocks)


def in_training_mode(model: nn.Module, *paths: str) -> nn.Module:
    """`model` in eval mode as a whole but for the modules at `paths`, in training mode."""
    model.eval()
    for path in paths:
        model.get_submodule(path).train()
    return model


def images(channels: int, height: int, width: int | None = None, dtype: torch.dtype = torch.float32):
    return lambda batch: (torch.randn(batch, channels, height, width or height, dtype=dtype),)


def case(build, in_shape: tuple, bn_left: int | None, hint: str, **options) -> Case:
    """A case whose expected outcome is the BatchNorm2d call sites a correct pass leaves (None: any).

    Inference models go to eval mode as a whole; a builder that sets modes itself passes mode=None."""
    options.setdefault("mode", "eval")
    return Case(build, images(*in_shape, dtype=options.pop("dtype", torch.float32)),
                None if bn_left is None else (bn_left,), hint, **options)


FOLD_ALL = "every Conv2d -> BatchNorm2d pair in this model is safe to fold."
SINGLE_PAIR = case(lambda: ConvBN(conv2d(3, 8), bn2d(8)), (3, 10), 0,
                   "replace the BN node's uses by the conv node, erase the BN node, and load the fused weights "
                   "into the conv.")
EXACT_CASES: dict[str, Case] = {
    "several_blocks_relu": case(lambda: seq(*(ConvBN(conv2d(c, 8), bn2d(8), relu=True) for c in (3, 8, 8))),
                                (3, 12), 0, FOLD_ALL),
    "conv_without_bias": case(lambda: ConvBN(conv2d(3, 6, bias=False), bn2d(6)), (3, 10), 0,
                              "a conv without bias still gets one: b' = (0 - mean) * scale + beta."),
    "depthwise": case(lambda: ConvBN(conv2d(6, 6, groups=6), bn2d(6)), (6, 10), 0,
                      "keep the conv's groups: copy the conv module rather than building a new one by hand."),
    "grouped": case(lambda: ConvBN(conv2d(8, 12, groups=4), bn2d(12)), (8, 10), 0,
                    "the scale is per *output* channel, dimension 0 of the weight, whatever the groups."),
    "stride_dilation_padding": case(
        lambda: seq(ConvBN(conv2d(4, 6, 3, stride=2, padding=2, dilation=2, padding_mode="reflect"), bn2d(6)),
                    ConvBN(conv2d(6, 5, (3, 5), stride=(2, 1), padding=(1, 2), padding_mode="circular"), bn2d(5))),
        (4, 17, 15), 0, "keep stride, padding, dilation and padding_mode: copy the conv module."),
    "residual": case(lambda: Residual(6), (6, 9), 0, FOLD_ALL),
    "nested_dotted_names": case(Nested, (3, 8), 0, "node.target is a dotted path ('features.stage_1.unit0.conv'); "
                                                   "gm.get_submodule and gm.set_submodule accept it."),
    "bn_affine_false": case(lambda: ConvBN(conv2d(3, 4), bn2d(4, affine=False)), (3, 8), 0,
                            "with affine=False, bn.weight and bn.bias are None: gamma = 1, beta = 0."),
    "float64_model": case(lambda: Residual(4).double(), (4, 7), 0,
                          "the fused parameters must keep the model's dtype.", dtype=torch.float64),
    "bn_in_training_mode": case(lambda: in_training_mode(ConvBN(conv2d(3, 4), bn2d(4)), "bn"), (3, 8), 1,
                                "in training mode a BN normalises with the batch's statistics: leave it.", mode=None),
    "conv_in_training_mode": case(
        lambda: in_training_mode(ConvBN(conv2d(3, 4), bn2d(4)), "conv"), (3, 8), None,
        "a Conv2d computes the same in either mode, so folding it into an eval BN is exact; PyTorch's "
        "fuse_conv_bn_eval refuses it (\"Fusion only for eval!\"). Either answer is accepted.", mode=None),
    "bn_without_running_stats": case(lambda: ConvBN(conv2d(3, 4), bn2d(4, track_running_stats=False)), (3, 8), 1,
                                     "with track_running_stats=False a BN uses batch statistics even in eval mode."),
    "conv_output_used_twice": case(ConvUsedTwice, (4, 8), 1,
                                   "the conv's output has a second user that must keep seeing the un-normalised values."),
    "conv_module_shared": case(SharedConv, (4, 8), None,
                               "the conv module is called at two sites: changing its weights changes both."),
    "bn_after_relu": case(BNAfterReLU, (3, 8), 1, "only a BN whose input is the conv's output can fold."),
    "conv_transpose": case(
        lambda: seq(ConvBN(conv2d(4, 6, transposed=True, stride=2, groups=2), bn2d(6), relu=True),
                    ConvBN(conv2d(6, 5), bn2d(5))), (4, 7), None,
        "a ConvTranspose2d keeps its output channels in dimension 1 of its weight (in, out / groups, kh, kw): "
        "the Conv2d formula scales the wrong dimension. Fold only a Conv2d, or scale dimension 1 per group."),
}

# The L3 benchmark: a small edge CNN, batch 1, where each op's fixed cost is a large share of its time,
# so removing a third of the ops pays (README, "Where folding pays").
BENCHMARK_BLOCKS, BENCHMARK_CHANNELS, BENCHMARK_SIZE = 8, 16, 8
BENCHMARK = case(lambda: seq(*(ConvBN(conv2d(BENCHMARK_CHANNELS, BENCHMARK_CHANNELS, bias=False),
                                      bn2d(BENCHMARK_CHANNELS), relu=True) for _ in range(BENCHMARK_BLOCKS))),
                 (BENCHMARK_CHANNELS, BENCHMARK_SIZE), 0, "", batch_sizes=(1,))


# ----------------------------------------------------------------------------------------------
# Hidden models (L4): random depth, widths, conv options, names and nesting, with pairs that must not
# fold and pairs where either answer is right mixed in. The generator knows which BatchNorm counts a
# correct pass may leave.

class HiddenBlock(nn.Module):
    def __init__(self, kind: str, conv: nn.Module, bn: nn.BatchNorm2d, names: tuple[str, str]):
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
EITHER_KINDS = ["conv_in_training_mode", "conv_transpose"]  # folding is exact if done right, and optional


def hidden_case(rng: random.Random) -> Case:
    channels = in_channels = rng.choice([3, 4, 6, 8])
    size = rng.choice([12, 14, 16])
    blocks, must_leave, may_leave, training, strided = [], 0, 0, [], False
    for _ in range(rng.randint(3, 6)):
        kind = rng.choice(FOLDABLE_KINDS + UNFOLDABLE_KINDS + EITHER_KINDS)
        transposed = kind == "conv_transpose"
        cout = channels if kind == "residual" else rng.choice([4, 6, 8, 12])
        groups = rng.choice([g for g in (1, 2, channels) if channels % g == 0 and cout % g == 0])
        kernel = rng.choice([1, 3, 5])
        dilation = rng.choice([1, 1, 2]) if kernel > 1 else 1
        stride = 2 if kind not in ("residual", "conv_transpose") and not strided and rng.random() < 0.3 else 1
        strided |= stride == 2
        padding = dilation * (kernel // 2)
        padding_mode = rng.choice(["zeros", "zeros", "reflect", "circular"]) if padding <= 2 and not transposed \
            else "zeros"
        conv = conv2d(channels, cout, kernel, bias=rng.random() < 0.5, stride=stride, padding=padding,
                      dilation=dilation, groups=groups, padding_mode=padding_mode, transposed=transposed)
        names = (random_identifier(rng), random_identifier(rng))
        while names[1] == names[0]:
            names = (names[0], random_identifier(rng))
        path = ".".join(random_identifier(rng) for _ in range(rng.randint(1, 3))) + f"_{len(blocks)}"
        blocks.append((path, HiddenBlock(kind, conv, bn2d(cout, affine=rng.random() < 0.7), names)))
        must_leave += kind in UNFOLDABLE_KINDS
        may_leave += kind in EITHER_KINDS
        if kind.endswith("_in_training_mode"):
            training.append(f"{path}.{names[0] if kind.startswith('conv') else names[1]}")
        channels = cout
    return Case(lambda: in_training_mode(PathChain(blocks), *training), images(in_channels, size),
                tuple(range(must_leave, must_leave + may_leave + 1)),
                "the pass must work for any names, nesting depth and conv options.")
