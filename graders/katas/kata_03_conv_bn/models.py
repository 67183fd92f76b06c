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

from graders.run import Case, PathChain, Program, bn2d, conv2d, random_identifiers, random_path


# How a block wires its conv and its BN around the input x: (conv, bn, x) -> the block's output.
WIRINGS = {
    "plain": lambda conv, bn, x: bn(conv(x)),
    "relu": lambda conv, bn, x: F.relu(bn(conv(x))),
    "conv_output_used_twice": lambda conv, bn, x: bn(y := conv(x)) + y,  # the add must see the un-normalised y
    "conv_module_shared": lambda conv, bn, x: bn(conv(x)) + torch.sigmoid(conv(x * 2)),
    "bn_after_relu": lambda conv, bn, x: bn(torch.relu(conv(x))),
    # The hidden blocks' own (HIDDEN_WIRINGS).
    "residual": lambda conv, bn, x: x + bn(conv(x)),
    "output_times_sigmoid": lambda conv, bn, x: bn(y := conv(x)) * torch.sigmoid(y),
    # The conv's weight read directly too (a get_attr node: a tied or regularised weight): folding into it
    # in place of the original would change what that reader sees.
    "weight_read_directly": lambda conv, bn, x: bn(conv(x)) * conv.weight.mean(),
    "torch_relu": lambda conv, bn, x: torch.relu(bn(conv(x))),
}


def conv_bn(conv: nn.Module, bn: nn.Module, wiring: str = "plain", names: tuple | list = ("conv", "bn")) -> Program:
    """A conv and a BN installed under `names`, wired as WIRINGS[wiring] says."""
    return Program(lambda m, x: WIRINGS[wiring](*(getattr(m, n) for n in names), x), **dict(zip(names, (conv, bn))))


def residual(channels: int) -> Program:
    return Program(lambda m, x: torch.relu(m.bn2(m.conv2(torch.relu(m.bn1(m.conv1(x))))) + x),
                   conv1=conv2d(channels, channels, bias=False), bn1=bn2d(channels),
                   conv2=conv2d(channels, channels, bias=False), bn2=bn2d(channels))


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
SINGLE_PAIR = case(lambda: conv_bn(conv2d(3, 8), bn2d(8)), (3, 10), 0,
                   "replace the BN node's uses by the conv node, erase the BN node, and load the fused weights "
                   "into the conv (fuse_conv_bn_weights: the fold_weights checks test its formula on its own).")
EXACT_CASES: dict[str, Case] = {
    "several_blocks_relu": case(lambda: nn.Sequential(*(conv_bn(conv2d(c, 8), bn2d(8), "relu") for c in (3, 8, 8))),
                                (3, 12), 0, FOLD_ALL),
    "conv_without_bias": case(lambda: conv_bn(conv2d(3, 6, bias=False), bn2d(6)), (3, 10), 0,
                              "a conv without bias still gets one: b' = (0 - mean) * scale + beta."),
    "depthwise": case(lambda: conv_bn(conv2d(6, 6, groups=6), bn2d(6)), (6, 10), 0,
                      "keep the conv's groups: copy the conv module rather than building a new one by hand."),
    "grouped": case(lambda: conv_bn(conv2d(8, 12, groups=4), bn2d(12)), (8, 10), 0,
                    "the scale is per *output* channel, dimension 0 of the weight, whatever the groups."),
    "stride_dilation_padding": case(
        lambda: nn.Sequential(
            conv_bn(conv2d(4, 6, 3, stride=2, padding=2, dilation=2, padding_mode="reflect"), bn2d(6)),
            conv_bn(conv2d(6, 5, (3, 5), stride=(2, 1), padding=(1, 2), padding_mode="circular"), bn2d(5))),
        (4, 17, 15), 0, "keep stride, padding, dilation and padding_mode: copy the conv module."),
    "residual": case(lambda: residual(6), (6, 9), 0, FOLD_ALL),
    "nested_dotted_names": case(
        lambda: Program(lambda m, x: m.features.stage_1.unit1(m.features.stage_1.unit0(x)),
                        **{"features.stage_1": nn.ModuleDict({"unit0": conv_bn(conv2d(3, 6), bn2d(6), "relu"),
                                                              "unit1": conv_bn(conv2d(6, 6, bias=False), bn2d(6))})}),
        (3, 8), 0, "node.target is a dotted path ('features.stage_1.unit0.conv'); gm.get_submodule and "
                   "gm.set_submodule accept it."),
    "bn_affine_false": case(lambda: conv_bn(conv2d(3, 4), bn2d(4, affine=False)), (3, 8), 0,
                            "with affine=False, bn.weight and bn.bias are None: gamma = 1, beta = 0."),
    "float64_model": case(lambda: residual(4).double(), (4, 7), 0,
                          "the fused parameters must keep the model's dtype.", dtype=torch.float64),
    "bn_in_training_mode": case(lambda: in_training_mode(conv_bn(conv2d(3, 4), bn2d(4)), "bn"), (3, 8), 1,
                                "in training mode a BN normalises with the batch's statistics: leave it.", mode=None),
    "conv_in_training_mode": case(
        lambda: in_training_mode(conv_bn(conv2d(3, 4), bn2d(4)), "conv"), (3, 8), 1,
        "a conv in training mode is being trained (a BN frozen in eval mode while the conv fine-tunes): the outputs "
        "of a fold would match, but the folded module's new parameters cut the conv's weight and the BN's gamma "
        "and beta off from their gradients. Fold for inference only, with both modules in eval mode (as PyTorch's "
        "fuse_conv_bn_eval and Inductor's fold do), and never by putting the caller's conv into eval mode.",
        mode=None, extra={"model_unchanged": True}),
    "conv_weight_read_directly": case(lambda: conv_bn(conv2d(3, 4), bn2d(4), "weight_read_directly"), (3, 8), None,
                                      "the model also reads conv.weight itself (a get_attr node): a folded weight "
                                      "at that path changes what it reads. Leave the pair, or install the folded "
                                      "conv under a new name and keep the original for that reader.",
                                      extra={"model_unchanged": True}),
    "bn_shared_by_two_convs": case(
        lambda: Program(lambda m, x: m.bn(m.conv1(x)) + torch.sigmoid(m.bn(m.conv2(x))), conv1=conv2d(3, 4),
                        conv2=conv2d(3, 4, 5), bn=bn2d(4)), (3, 8), 0,
        "one BN module after two convs that read the same x: folding reads the BN and the convs' input and changes "
        "neither, so each conv takes the BN in; what must not be shared is the conv (its weights are rewritten) or "
        "its output, not the BN nor the conv's input."),
    "bn_without_running_stats": case(lambda: conv_bn(conv2d(3, 4), bn2d(4, track_running_stats=False)), (3, 8), 1,
                                     "with track_running_stats=False a BN uses batch statistics even in eval mode."),
    "conv_output_used_twice": case(lambda: conv_bn(conv2d(4, 4), bn2d(4), "conv_output_used_twice"), (4, 8), 1,
                                   "the conv's output has a second user that must keep seeing the un-normalised values."),
    "conv_module_shared": case(lambda: conv_bn(conv2d(4, 4), bn2d(4), "conv_module_shared"), (4, 8), None,
                               "the conv module is called at two sites: changing its weights changes both."),
    "bn_after_relu": case(lambda: conv_bn(conv2d(3, 5), bn2d(5), "bn_after_relu"), (3, 8), 1,
                          "only a BN whose input is the conv's output can fold."),
    "conv_transpose": case(
        lambda: nn.Sequential(conv_bn(conv2d(4, 6, transposed=True, stride=2, groups=2), bn2d(6), "relu"),
                              conv_bn(conv2d(6, 5), bn2d(5))), (4, 7), None,
        "a ConvTranspose2d keeps its output channels in dimension 1 of its weight (in, out / groups, kh, kw): "
        "the Conv2d formula scales the wrong dimension. Fold only a Conv2d, or scale dimension 1 per group."),
}
# Hints that already say which pairs fold; a case with another hint (layout, dtype, names) that leaves a foldable BN
# gets FOLD_ALL instead (__init__.folded).
PAIRING_HINTS = {FOLD_ALL, SINGLE_PAIR.hint, EXACT_CASES["bn_shared_by_two_convs"].hint}

# The L3 benchmark: a small edge CNN, batch 1, where each op's fixed cost is a large share of its time,
# so removing a third of the ops pays (README, "Where folding pays").
BENCHMARK_BLOCKS, BENCHMARK_CHANNELS, BENCHMARK_SIZE = 8, 16, 8
BENCHMARK = case(lambda: nn.Sequential(*(conv_bn(conv2d(BENCHMARK_CHANNELS, BENCHMARK_CHANNELS, bias=False),
                                                bn2d(BENCHMARK_CHANNELS), "relu") for _ in range(BENCHMARK_BLOCKS))),
                 (BENCHMARK_CHANNELS, BENCHMARK_SIZE), 0, "", batch_sizes=(1,))


# ----------------------------------------------------------------------------------------------
# Hidden models (L4): random depth, widths, conv options, names and nesting, with pairs that must not
# fold and pairs where either answer is right mixed in. The generator knows which BatchNorm counts a
# correct pass may leave.

HIDDEN_WIRINGS = {"residual": "residual", "conv_output_used_twice": "output_times_sigmoid",
                  "bn_after_relu": "bn_after_relu"}  # every other kind: "torch_relu"
FOLDABLE_KINDS = ["plain", "plain", "residual", "residual"]
UNFOLDABLE_KINDS = ["conv_output_used_twice", "bn_after_relu", "bn_in_training_mode", "conv_in_training_mode"]
EITHER_KINDS = ["conv_transpose"]  # folding is exact if done right, and optional


def hidden_case(rng: random.Random) -> Case:
    channels = in_channels = rng.choice([3, 4, 6, 8])
    size = rng.choice([12, 14, 16])
    blocks, must_leave, may_leave, training, strided = [], 0, 0, [], False
    # Every model has a pair to fold (its BN named at random, as every module here: a pass that knows a BN by a
    # name the visible models use fails every seed), in any order among two to five pairs of any kind
    kinds = [rng.choice(FOLDABLE_KINDS)] + [rng.choice(FOLDABLE_KINDS + UNFOLDABLE_KINDS + EITHER_KINDS)
                                           for _ in range(rng.randint(2, 5))]
    rng.shuffle(kinds)
    for kind in kinds:
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
        names, path = random_identifiers(rng, 2), random_path(rng, 3, len(blocks))
        bn = bn2d(cout, affine=rng.random() < 0.7)
        blocks.append((path, conv_bn(conv, bn, HIDDEN_WIRINGS.get(kind, "torch_relu"), names)))
        must_leave += kind in UNFOLDABLE_KINDS
        may_leave += kind in EITHER_KINDS
        if kind.endswith("_in_training_mode"):
            training.append(f"{path}.{names[0] if kind.startswith('conv') else names[1]}")
        channels = cout
    return Case(lambda: in_training_mode(PathChain(blocks), *training), images(in_channels, size),
                tuple(range(must_leave, must_leave + may_leave + 1)),
                "the pass must work for any names, nesting depth and conv options.")
