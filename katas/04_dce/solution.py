"""Kata 04: dead-code elimination that keeps every side effect.

Read README.md beside this file first. Grade your work with:  uv run pytest katas/04_dce
"""
from __future__ import annotations

import inspect
import operator

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F


def has_side_effects(node: fx.Node, modules: dict) -> bool:
    """True for a node that must stay even when nothing uses its result.

    `modules` is dict(gm.named_modules()): it maps a call_module node's target to its module.
    """
    # TODO(human): which node kinds are the graph's contract with its caller, never to be removed?
    # TODO(human): mutation. A node may change a tensor that someone else reads:
    #   - in-place methods and functions (PyTorch's naming convention tells you which);
    #   - calls with inplace=True or an out= tensor (how else can those arguments be passed?);
    #   - operator.setitem;
    #   - modules that mutate their input or their own state (look at the module, not the node, and at
    #     the state it is in: does it update anything in this mode, with this configuration?).
    # TODO(human): randomness. A node that draws random numbers advances the generator, even when its
    #   result is unused: torch.rand*, dropout (as a function and as a module in training mode), random
    #   methods (a call_method node), ...
    raise NotImplementedError("TODO(human): has_side_effects")


def eliminate_dead_code(gm: fx.GraphModule) -> int:
    """Erase every node of gm whose result nobody uses and that has no side effect; return how many.

    One call removes whole dead chains: a second call on the result removes nothing. The placeholders
    (forward's signature) stay. gm is edited in place and recompiled.
    """
    modules = dict(gm.named_modules())
    # TODO(human): visit the nodes in an order where erasing a dead node can make its inputs dead
    #   before you reach them. Which uses does node.users see?
    # TODO(human): erase each dead node without side effects, and count what you erase.
    # TODO(human): the graph changed: check it and regenerate forward().
    raise NotImplementedError("TODO(human): eliminate_dead_code")
