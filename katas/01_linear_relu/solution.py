"""Kata 01: fuse every Linear -> ReLU pair into one FusedLinearReLU module call, by hand.

Read README.md beside this file first. Grade your work with:  uv run pytest katas/01_linear_relu
"""
from __future__ import annotations

from collections import Counter

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F


class FusedLinearReLU(nn.Module):
    """relu(linear(x)) as one module call, built from an existing nn.Linear: FusedLinearReLU(linear).

    It computes exactly what nn.ReLU()(linear(x)) computes, for inputs of any rank (..., in_features),
    in the Linear's dtype, with or without a bias, and it stays trainable: the Linear's weight and
    bias are its parameters (the parameter count of the model does not change).
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        # TODO(human): keep what forward needs from `linear`: its weight and its bias (which may be None),
        #   as parameters of this module. Copy or share them? (What must happen to training?)
        raise NotImplementedError("TODO(human): FusedLinearReLU.__init__")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # TODO(human): the affine map and the ReLU, with as few ops and fresh tensors as you can.
        #   Which torch.nn.functional function is an nn.Linear's forward? Does the ReLU need a new tensor?
        #   It must trace with torch.fx: no Python `if` on the input's rank, shape or values.
        raise NotImplementedError("TODO(human): FusedLinearReLU.forward")


def fuse_linear_relu(gm: fx.GraphModule) -> fx.GraphModule:
    """Replace every Linear -> ReLU pair of `gm` by one call_module node of a FusedLinearReLU; return gm.

    Fuse every spelling of ReLU (README: "Your task"), and leave a pair alone when fusing would change
    what the model computes (README: "When the rewrite is not allowed").
    """
    modules = dict(gm.named_modules())  # call_module node.target -> module
    # TODO(human): for each node that computes a ReLU (which ops and targets can that be?):
    #   - its input (node.args[0], or node.kwargs["input"] where it has no positional argument) must be
    #     a call_module node of an nn.Linear, and the pair must be safe to fuse;
    #   - install a FusedLinearReLU built from that Linear (gm.set_submodule or gm.add_submodule);
    #   - insert one call_module node for it (gm.graph.inserting_before(...), gm.graph.call_module(...))
    #     reading the Linear node's inputs;
    #   - point every use of the ReLU node at the new node (inside tuples and lists too), then erase the
    #     ReLU node and the Linear node.
    # TODO(human): the graph changed: check it with gm.graph.lint() and regenerate forward().
    raise NotImplementedError("TODO(human): fuse_linear_relu")
