"""Kata 08: find chains of elementwise ops, then fuse each chain into one node.

Read README.md beside this file first. Grade your work with:  uv run pytest katas/08_elementwise_chains
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F


def find_elementwise_chains(gm: fx.GraphModule) -> list[list[fx.Node]]:
    """The maximal chains of two or more elementwise nodes of `gm` (README: "What a chain is").

    Chains are disjoint; the nodes of each chain are in graph order, and the chains are in graph order
    of their first nodes. Only out-of-place uses of the ten elementwise ops listed in the README count,
    in every spelling: operator (x + y), torch function (torch.add), Tensor method (x.add(y)) and
    nn module (nn.ReLU, nn.Sigmoid, nn.Tanh).
    """
    modules = dict(gm.named_modules())  # call_module node.target -> module
    # TODO(human): decide for every node whether it is an elementwise op (mind inplace=True and out=).
    # TODO(human): link each elementwise node to the first of its inputs (node.all_input_nodes) that is
    #   elementwise and has no user but this node. The output node counts as a user.
    # TODO(human): follow the links from every node that nothing links to, in graph order; keep the
    #   chains of two or more nodes.
    raise NotImplementedError("TODO(human): find_elementwise_chains")


def fuse_elementwise_chains(gm: fx.GraphModule) -> int:
    """Replace every chain of find_elementwise_chains(gm) by one node that computes it; return how many.

    The fused node must compute exactly what the chain did, and faster: an unfused n-op chain passes over
    memory n times, the fused node once, by running the whole chain on one cache-sized tile of the tensor
    at a time (README: "Why this pass exists").
    """
    # TODO(human): for each chain, collect the nodes it reads from outside itself: the fused node's args.
    # TODO(human): build a module that runs the chain's ops tile by tile (a fixed number of slices of the
    #   flattened inputs, each through every step, each result copied into its part of one output),
    #   reusing a tile's buffer in place where that is exact for any input (shape, dtype, grad mode:
    #   README "When a result does not fit the buffer", "Autograd"); never write into its inputs. Decide
    #   tiles and in place or not HERE, from the graph: the module's forward must be traceable by torch.fx
    #   (no branch on tensors, callables that are torch functions, Tensor methods or registered
    #   submodules). Install it with gm.add_submodule(...).
    # TODO(human): insert the fused node where the chain's LAST node is (gm.graph.inserting_before),
    #   point the last node's users at it, then erase the chain's nodes, last first.
    # TODO(human): the graph changed: check it with gm.graph.lint() and regenerate forward().
    raise NotImplementedError("TODO(human): fuse_elementwise_chains")
