"""Kata 02: fuse matmul + bias + ReLU declaratively, with torch.fx.subgraph_rewriter.

Read README.md beside this file first. Grade your work with:  uv run pytest katas/02_matmul_bias_relu
"""
from __future__ import annotations

import itertools
import operator

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.fx import subgraph_rewriter


def pattern(x, w, b):
    """The site to find, in its canonical spelling: relu(x @ w + b)."""
    # TODO(human): write the site exactly as a model would: the matmul, the bias add, the ReLU.
    raise NotImplementedError("TODO(human): pattern")


def replacement(x, w, b):
    """The fused form of pattern(x, w, b): the same values, without allocating the sum or the ReLU output.

    It must be exact for batched inputs too: x may be (batch, tokens, features), w may be a stack of
    matrices. replace_pattern traces this function, so use torch calls only (no Python `if` on tensors).
    """
    # TODO(human): compute the product once, then add the bias and apply the ReLU *in its buffer*.
    #   Why is that allowed? (README: "The rule: exact for every match it is applied to".) Which matmul op takes any rank?
    raise NotImplementedError("TODO(human): replacement")


# TODO(human): the matcher compares call targets by identity and arguments position by position, so
#   `pattern` alone finds one spelling. List the spellings of each step (README, "Your task"), e.g.
#   MATMULS = [operator.matmul, ...]; x @ w traces to operator.matmul. Which keyword does F.relu trace with?
#   Then build one pattern per combination (itertools.product helps; a small factory function
#   `def spelled(matmul, bias_add, relu)` returning a `def spelling(x, w, b)` keeps them traceable).


def fuse_matmul_bias_relu(gm: fx.GraphModule) -> int:
    """Rewrite every matmul + bias + ReLU site of gm in place; return how many sites were rewritten.

    Leave a site alone when rewriting would change what the model computes (README: "When the rewrite
    is not allowed"). The caller's gm is what is graded: edit it, do not build a new one.
    """
    # TODO(human): for each spelling, subgraph_rewriter.replace_pattern(gm, spelling, replacement);
    #   it edits gm in place, recompiles it, and returns one Match per site it rewrote. Is your replacement
    #   exact for every match? If not, replace_pattern_with_filters takes filters that pick the matches
    #   where it is (README: "The rule: exact for every match it is applied to").
    # TODO(human): return the total number of sites rewritten.
    raise NotImplementedError("TODO(human): fuse_matmul_bias_relu")
