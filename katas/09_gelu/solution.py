"""Kata 09: recognise a hand-written tanh-GELU and replace it with one F.gelu(x, approximate="tanh").

Read README.md beside this file first. Grade your work with:  uv run pytest katas/09_gelu
"""
from __future__ import annotations

import math
import operator

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
CUBIC = 0.044715

# What the spellings trace to. `a * b` is call_function operator.mul, torch.mul(a, b) is call_function
# torch.mul, a.mul(b) is call_method "mul"; x ** 3 is operator.pow; x.tanh() is call_method "tanh";
# an nn.Tanh is a call_module node whose target names the module.
MUL = {operator.mul, torch.mul, "mul"}
ADD = {operator.add, torch.add, "add"}
POW = {operator.pow, torch.pow, "pow"}
TANH = {torch.tanh, "tanh"}


def replace_tanh_gelu(gm: fx.GraphModule) -> int:
    """Replace every subgraph of `gm` computing 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))
    by one node F.gelu(x, approximate="tanh"); return how many were replaced.

    Accept every spelling the README lists (operands in either order at every level, x**3 in any
    form, any tanh, the constant to about 1e-5 relative). Leave a subgraph alone when replacing it
    would change what the model computes (README: "When the rewrite is not allowed"). Edit gm in place.
    """
    modules = dict(gm.named_modules())  # call_module node.target -> module
    # TODO(human): for each node that could be the root of the pattern (the last multiplication),
    #   work up through its operands: the constant 0.5, some node x, and 1 + tanh(...); then through
    #   the tanh's argument down to x**3. Try both operand orders of every mul and add, and compare
    #   constants with math.isclose(..., rel_tol=1e-5). Every position of x must be the same node.
    # TODO(human): a match is only safe to replace when no node strictly inside it is used outside it.
    # TODO(human): insert F.gelu(x, approximate="tanh") before the root, point the root's users at it,
    #   and erase the old subgraph (users before the nodes they use).
    # TODO(human): the graph changed: check it with gm.graph.lint() and regenerate forward().
    raise NotImplementedError("TODO(human): replace_tanh_gelu")
