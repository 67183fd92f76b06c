"""Kata 02, reference solution: fuse matmul + bias + ReLU declaratively, with torch.fx.subgraph_rewriter."""
from __future__ import annotations

import itertools
import operator

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.fx import subgraph_rewriter


def pattern(x, w, b):
    """The canonical spelling of the site: relu(x @ w + b)."""
    return F.relu(x @ w + b)


def replacement(x, w, b):
    """The fused form: the bias add and the ReLU work in the product's own buffer.

    The product is a fresh tensor, and the matcher only accepts a match whose inner nodes (the product
    and the sum) have no user outside the match, so nobody else can see the buffer being overwritten.
    torch.matmul, not torch.addmm: addmm multiplies 2-D matrices only, and x may be batched.
    """
    return torch.matmul(x, w).add_(b).relu_()


# The matcher compares call targets by identity and arguments position by position, literals and
# keyword arguments included. Each spelling of each step is therefore a pattern of its own.
MATMULS = [operator.matmul, torch.matmul, torch.mm]  # x @ w traces to operator.matmul
BIAS_ADDS = [
    lambda p, b: p + b,
    lambda p, b: b + p,  # no commutativity: the commuted add is another pattern
    lambda p, b: torch.add(p, b),
    lambda p, b: torch.add(b, p),
]
RELUS = [
    F.relu,  # traced as relu(y, inplace=False): the keyword is part of the pattern
    lambda y: F.relu(y, inplace=True),
    torch.relu,
    lambda y: y.relu(),  # a call_method node, not a call_function
]


def spelled_pattern(matmul, bias_add, relu):
    def spelling(x, w, b):
        return relu(bias_add(matmul(x, w), b))

    return spelling


PATTERNS = [spelled_pattern(*steps) for steps in itertools.product(MATMULS, BIAS_ADDS, RELUS)]
# replace_pattern traces a pattern or replacement given as a function on every call: 48 patterns, two traces
# each, on every model. Traced once here, they are matched as the graphs they are.
TRACED_PATTERNS, TRACED_REPLACEMENT = [fx.symbolic_trace(p) for p in PATTERNS], fx.symbolic_trace(replacement)


def fuse_matmul_bias_relu(gm: fx.GraphModule) -> int:
    """Rewrite every matmul + bias + ReLU site of gm in place; return how many sites were rewritten."""
    rewritten = 0
    for spelling in TRACED_PATTERNS:
        # replace_pattern edits gm.graph in place and recompiles gm; it returns one Match per site.
        rewritten += len(subgraph_rewriter.replace_pattern(gm, spelling, TRACED_REPLACEMENT))
    return rewritten
