"""Kata 11's model zoo and hidden-model generator: conv + BatchNorm models exported with torch.export and
decomposed (graders/run/exported.py, `exporter`), some with a dynamic batch.

Every BatchNorm gets random statistics and a random eps, variances down to 0.05, so that a missing term shows.
A static program is graded at the batch it was exported with; a dynamic one at several (its `Dim` allows 1-64).
"""
from __future__ import annotations

import random

import torch
import torch.nn as nn
import torch.nn.functional as F

from graders.run import Case, PathChain, Program, bn2d, conv2d, exporter, random_identifiers, random_path

STATIC_BATCH = 2
DYNAMIC_BATCHES = (1, 3, 5)


def dynamic_batch():
    return ({0: torch.export.Dim("batch", min=1, max=64)},)


# How a block wires its conv and its BN around the input x: (conv, bn, x) -> the block's output.
WIRINGS = {
    "plain": lambda conv, bn, x: bn(conv(x)),
    "relu": lambda conv, bn, x: F.relu(bn(conv(x))),
    "residual": lambda conv, bn, x: F.relu(x + bn(conv(x))),
    "conv_output_used_twice": lambda conv, bn, x: bn(y := conv(x)) * torch.sigmoid(y),
    "conv_called_twice": lambda conv, bn, x: bn(conv(x)) + torch.sigmoid(conv(x * 2)),
    "bn_after_relu": lambda conv, bn, x: bn(torch.relu(conv(x))),
}


def conv_bn(conv: nn.Module, bn: nn.Module, wiring: str = "relu", names: tuple | list = ("conv", "bn")) -> Program:
    """A conv and a BN installed under `names`, wired as WIRINGS[wiring] says."""
    return Program(lambda m, x: WIRINGS[wiring](*(getattr(m, n) for n in names), x), **dict(zip(names, (conv, bn))))


def images(channels: int, height: int, *, dtype: torch.dtype = torch.float32, channels_last: bool = False):
    def make(batch: int) -> tuple:
        x = torch.randn(batch, channels, height, height, dtype=dtype)
        return (x.contiguous(memory_format=torch.channels_last) if channels_last else x,)
    return make


def case(build, in_shape: tuple, bn_left: int | tuple | None, hint: str, *, dynamic: bool = False,
         dtype: torch.dtype = torch.float32, channels_last: bool = False, mode: str | None = "eval", **options) -> Case:
    """A case whose expected outcome is the number of BatchNorm nodes a correct pass leaves (a tuple: any of
    them; None: any), exported static at STATIC_BATCH or with a dynamic batch."""
    inputs = images(*in_shape, dtype=dtype, channels_last=channels_last)
    expect = None if bn_left is None else (bn_left,) if isinstance(bn_left, int) else tuple(bn_left)
    options.setdefault("batch_sizes", DYNAMIC_BATCHES if dynamic else (STATIC_BATCH,))
    example_batch = options["batch_sizes"][0] if not dynamic else STATIC_BATCH
    options.setdefault("trace", exporter(lambda: inputs(example_batch), dynamic_batch() if dynamic else None))
    return Case(build, inputs, expect, hint, mode=mode, **options)


def blocks(*channels: int, wiring: str = "relu", bias: bool = True) -> nn.Sequential:
    return nn.Sequential(*(conv_bn(conv2d(cin, cout, bias=bias), bn2d(cout), wiring)
                           for cin, cout in zip(channels, channels[1:])))


def channels_last(model: nn.Module) -> nn.Module:
    return model.to(memory_format=torch.channels_last)


FOLD_ALL = "every convolution -> BatchNorm pair in this program is safe to fold."
SINGLE_PAIR = case(lambda: blocks(3, 8), (3, 10), 0,
                   "fold the BN's running statistics, gamma and beta into new weight and bias parameters of the "
                   "convolution, point the users of the BN's getitem at the convolution, and return a new program.",
                   extra={"round_trip": True})
TWO_PAIRS = case(lambda: blocks(3, 6, 8), (3, 9), 0,  # convs with a bias: one without is conv_without_bias's (L2)
                 "both pairs fold, each into new parameters of its own: look for pairs in the whole graph, not just "
                 "until the first fold, and give each new parameter a name of its own. Where single_pair fails too, "
                 "its failure is this one's: fix it first.")

EXACT_CASES: dict[str, Case] = {
    "conv_without_bias": case(lambda: conv_bn(conv2d(3, 6, bias=False), bn2d(6)), (3, 10), 0,
                              "a convolution without bias (args[2] is None) still gets one: b' = (0 - mean) * scale + beta."),
    "bn_affine_false": case(lambda: conv_bn(conv2d(3, 4), bn2d(4, affine=False)), (3, 8), 0,
                            "with affine=False the BN's weight and bias arguments are None: gamma = 1, beta = 0."),
    "bn_output_is_model_output": case(lambda: conv_bn(conv2d(4, 6), bn2d(6), "plain"), (4, 8), 0,
                                      "the BN's getitem is what the program returns: its output spec names it, "
                                      "so the spec must name the node that replaces it."),
    "grouped_dilated_strided": case(lambda: conv_bn(conv2d(8, 12, 3, groups=4, dilation=2, stride=2), bn2d(12)),
                                    (8, 15), 0, "the scale is per output channel, dimension 0 of the weight, "
                                                "whatever the groups; keep every other argument of the convolution."),
    "depthwise": case(lambda: conv_bn(conv2d(6, 6, groups=6), bn2d(6)), (6, 10), 0,
                      "a depthwise weight is (C, 1, kh, kw): still one scale per output channel."),
    "channels_last": case(lambda: channels_last(blocks(4, 8, 8)), (4, 9), 0,
                          "the weights are channels_last: a folded weight that keeps its layout keeps the "
                          "convolution's output layout, which meta['val'] records (its strides).", channels_last=False),
    "dynamic_batch": case(lambda: nn.Sequential(conv_bn(conv2d(3, 6), bn2d(6)),
                                                conv_bn(conv2d(6, 6, bias=False), bn2d(6), "residual")), (3, 8), 0,
                          "the batch is a size symbol: leave range_constraints and every meta['val'] symbolic.",
                          dynamic=True, extra={"round_trip": True}),
    "bn_after_add_of_two_convs": case(
        lambda: Program(lambda m, x: m.bn(m.conv1(x) + m.conv2(x)), conv1=conv2d(3, 4), conv2=conv2d(3, 4, 1),
                        bn=bn2d(4)), (3, 8), 1,
        "the BN reads an add, not a convolution: only a BN whose input is one convolution's output folds."),
    "conv_called_twice": case(lambda: conv_bn(conv2d(4, 4), bn2d(4), "conv_called_twice"), (4, 8), (0, 1),
                              "the convolution's weight placeholder feeds two convolutions: folding into it changes "
                              "both. Fold into new parameters of this convolution, or leave the pair."),
    "float64": case(lambda: blocks(4, 5, 5).double(), (4, 7), 0,
                    "the folded parameters, and their meta['val'], keep the program's dtype.", dtype=torch.float64),
    "conv_transpose": case(
        lambda: nn.Sequential(conv_bn(conv2d(4, 6, transposed=True, stride=2, groups=2, padding=1), bn2d(6)),
                              conv_bn(conv2d(6, 5), bn2d(5))), (4, 7), (0, 1),
        "a transposed convolution (args[6] is True) keeps its output channels in dimension 1 of its weight, "
        "per group: the convolution formula scales the wrong dimension. Fold only args[6] False, or scale "
        "dimension 1 per group."),
    "conv_output_used_twice": case(lambda: conv_bn(conv2d(4, 4), bn2d(4), "conv_output_used_twice"), (4, 8), 1,
                                   "the convolution's output has a second user that must keep seeing the "
                                   "un-normalised values."),
    "bn_in_training_mode": case(lambda: blocks(3, 4), (3, 8), 1,
                                "in training mode a BN normalises with the batch's statistics and updates its "
                                "running ones (_native_batch_norm_legit_functional, with buffer mutations as "
                                "outputs): leave it.", mode="train"),
    "bn_without_running_stats": case(lambda: conv_bn(conv2d(3, 4), bn2d(4, track_running_stats=False)), (3, 8), 1,
                                     "with track_running_stats=False a BN uses batch statistics even in eval mode."),
    "bn_after_relu": case(lambda: conv_bn(conv2d(3, 5), bn2d(5), "bn_after_relu"), (3, 8), 1,
                          "only a BN whose input is the convolution's output can fold."),
}

# The L3 benchmark: a small edge CNN, batch 1, where each op's fixed cost is a large share of its time.
BENCHMARK_BLOCKS, BENCHMARK_CHANNELS, BENCHMARK_SIZE = 8, 16, 8
BENCHMARK = case(lambda: blocks(*[BENCHMARK_CHANNELS] * (BENCHMARK_BLOCKS + 1), bias=False),
                 (BENCHMARK_CHANNELS, BENCHMARK_SIZE), 0, "", batch_sizes=(1,))


# ----------------------------------------------------------------------------------------------------------
# Hidden models (L4): random depth, widths, conv options, names and nesting, half with a dynamic batch, with
# pairs that must not fold and pairs where either answer is right mixed in.

FOLDABLE_KINDS = ["relu", "relu", "residual", "residual"]
UNFOLDABLE_KINDS = ["conv_output_used_twice", "bn_after_relu", "bn_in_training_mode"]
EITHER_KINDS = ["conv_transpose", "conv_called_twice"]


def hidden_case(rng: random.Random) -> Case:
    channels = in_channels = rng.choice([3, 4, 6, 8])
    size, dynamic, layout = rng.choice([10, 12, 14]), rng.random() < 0.5, rng.random() < 0.25
    chain, must_leave, may_leave, training, strided = [], 0, 0, [], False
    # Every model mixes a pair that folds with a BN left in training mode (a pass that leaves any program with a
    # training BN alone fails every seed, not one in four), in any order among up to two more pairs of any kind
    kinds = [rng.choice(FOLDABLE_KINDS), "bn_in_training_mode"]
    kinds += [rng.choice(FOLDABLE_KINDS + UNFOLDABLE_KINDS + EITHER_KINDS) for _ in range(rng.randint(0, 2))]
    rng.shuffle(kinds)
    for kind in kinds:
        transposed = kind == "conv_transpose"
        cout = channels if kind in ("residual", "conv_called_twice") else rng.choice([4, 6, 8, 12])
        groups = rng.choice([g for g in (1, 2, channels) if channels % g == 0 and cout % g == 0])
        kernel = rng.choice([1, 3]) if transposed else rng.choice([1, 3, 5])
        dilation = rng.choice([1, 1, 2]) if kernel > 1 and not transposed else 1
        stride = 2 if kind in ("relu", "bn_after_relu") and not strided and rng.random() < 0.3 else 1
        strided |= stride == 2
        conv = conv2d(channels, cout, kernel, bias=rng.random() < 0.5, stride=stride, dilation=dilation,
                      groups=groups, transposed=transposed)
        names, path = random_identifiers(rng, 2), random_path(rng, 3, len(chain))
        bn = bn2d(cout, affine=rng.random() < 0.7)
        wiring = {"conv_transpose": "relu", "bn_in_training_mode": "relu"}.get(kind, kind)
        chain.append((path, conv_bn(conv, bn, wiring, names)))
        must_leave += kind in UNFOLDABLE_KINDS
        may_leave += kind in EITHER_KINDS
        if kind == "bn_in_training_mode":
            training.append(f"{path}.{names[1]}")
        channels = cout

    def build() -> nn.Module:
        model = PathChain(chain).eval()
        for path in training:
            model.get_submodule(path).train()
        return channels_last(model) if layout else model

    return case(build, (in_channels, size), tuple(range(must_leave, must_leave + may_leave + 1)),
                "the pass must work for any names, nesting, conv options, layouts and batch symbols.",
                dynamic=dynamic, channels_last=layout, mode=None)
