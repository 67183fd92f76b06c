"""Kata 03, reference solution: fold eval-mode BatchNorm2d into the Conv2d that feeds it."""
from __future__ import annotations

import copy
from collections import Counter

import torch
import torch.fx as fx
import torch.nn as nn


def fuse_conv_bn_weights(conv_w, conv_b, bn_rm, bn_rv, bn_eps, bn_w, bn_b):
    """Weight and bias of one convolution that computes bn(conv(x)) with the BN's running statistics."""
    if conv_b is None:
        conv_b = torch.zeros_like(bn_rm)
    if bn_w is None:
        bn_w = torch.ones_like(bn_rm)
    if bn_b is None:
        bn_b = torch.zeros_like(bn_rm)
    scale = bn_w * torch.rsqrt(bn_rv + bn_eps)  # one factor per output channel
    fused_w = conv_w * scale.reshape(-1, *([1] * (conv_w.dim() - 1)))
    fused_b = (conv_b - bn_rm) * scale + bn_b
    return fused_w.to(conv_w.dtype), fused_b.to(conv_w.dtype)


def _foldable(conv_node: fx.Node, bn_node: fx.Node, modules: dict, calls: Counter, attr_reads: set) -> bool:
    conv, bn = modules.get(conv_node.target), modules[bn_node.target]
    return (
        conv_node.op == "call_module"
        and type(conv) is nn.Conv2d
        and len(conv_node.users) == 1                 # another user would see the BN folded in
        and calls[conv_node.target] == 1              # a shared conv is also used elsewhere
        and conv_node.target not in attr_reads        # nor may its weight be read directly
        and not bn.training                           # training mode normalises with batch statistics
        and not conv.training                         # being trained (a frozen-BN fine-tune): folding would
                                                      # cut the conv's and the BN's parameters off their gradients
        and bn.track_running_stats                    # without running stats, eval mode does too
    )


def fuse_conv_bn(gm: fx.GraphModule) -> fx.GraphModule:
    """Fold every Conv2d -> BatchNorm2d pair where the result is exactly the same."""
    modules = dict(gm.named_modules())
    calls = Counter(n.target for n in gm.graph.nodes if n.op == "call_module")
    attr_reads = {n.target.rpartition(".")[0] for n in gm.graph.nodes if n.op == "get_attr"}
    for bn_node in list(gm.graph.nodes):
        if bn_node.op != "call_module" or type(modules[bn_node.target]) is not nn.BatchNorm2d:
            continue
        conv_node = bn_node.args[0]
        if len(bn_node.args) != 1 or bn_node.kwargs or not isinstance(conv_node, fx.Node):
            continue
        if not _foldable(conv_node, bn_node, modules, calls, attr_reads):
            continue
        conv, bn = modules[conv_node.target], modules[bn_node.target]
        # A new module, so the model that was traced keeps its own convolution untouched.
        fused = copy.deepcopy(conv)
        weight, bias = fuse_conv_bn_weights(conv.weight, conv.bias, bn.running_mean, bn.running_var,
                                            bn.eps, bn.weight, bn.bias)
        fused.weight = nn.Parameter(weight.detach(), requires_grad=conv.weight.requires_grad)
        fused.bias = nn.Parameter(bias.detach(), requires_grad=conv.weight.requires_grad)
        gm.set_submodule(conv_node.target, fused)
        bn_node.replace_all_uses_with(conv_node)
        gm.graph.erase_node(bn_node)
    gm.graph.lint()
    gm.recompile()
    return gm
