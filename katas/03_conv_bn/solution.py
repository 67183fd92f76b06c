"""Kata 03: fold eval-mode BatchNorm2d into the Conv2d that feeds it.

Read README.md beside this file first. Grade your work with:  uv run pytest katas/03_conv_bn
"""
from __future__ import annotations

import copy
from collections import Counter

import torch
import torch.fx as fx
import torch.nn as nn


def fuse_conv_bn_weights(conv_w, conv_b, bn_rm, bn_rv, bn_eps, bn_w, bn_b):
    """Return (weight, bias) of one convolution that computes bn(conv(x)) with the BN's running stats.

    conv_w: [out_channels, in_channels / groups, kH, kW]   conv_b: [out_channels] or None
    bn_rm, bn_rv: running mean and variance [out_channels]   bn_eps: float
    bn_w, bn_b: gamma and beta [out_channels], or None when the BN has affine=False
    The results keep conv_w's dtype.
    """
    # TODO(human): stand in for a missing conv bias, gamma or beta (what value leaves the result unchanged?).
    # TODO(human): scale = gamma / sqrt(running_var + eps), one factor per output channel.
    # TODO(human): W' = W * scale, broadcast along the output-channel dimension of conv_w.
    # TODO(human): b' = (b - running_mean) * scale + beta.
    raise NotImplementedError("TODO(human): fuse_conv_bn_weights")


def fuse_conv_bn(gm: fx.GraphModule) -> fx.GraphModule:
    """Fold every Conv2d -> BatchNorm2d pair of `gm` where the result is exactly the same; return gm.

    Leave a pair alone when folding would change what the model computes (README: "When the rewrite is
    not allowed"). Do not change the modules of the model that was traced: build new ones.
    """
    modules = dict(gm.named_modules())  # call_module node.target -> module
    # TODO(human): for each call_module node whose module is an nn.BatchNorm2d:
    #   - its input must be a call_module node of an nn.Conv2d, and the pair must be safe to fold;
    #   - fuse the weights into a *copy* of the conv and install it with gm.set_submodule(...);
    #   - point the BN node's users at the conv node, then erase the BN node.
    # TODO(human): the graph changed: check it with gm.graph.lint() and regenerate forward().
    raise NotImplementedError("TODO(human): fuse_conv_bn")
