"""Kata 13: attention written out by hand, found in Inductor's post-grad ATen graph with
torch._inductor.pattern_matcher and replaced by one scaled_dot_product_attention.

Read README.md beside this file first. Grade your work with:  uv run pytest katas/13_sdpa_pattern
"""
from __future__ import annotations

import functools

import torch
import torch.fx as fx
from torch._inductor.pattern_matcher import Match, PatternMatcherPass, fwd_only, register_replacement

aten = torch.ops.aten


# A search pattern is a plain function of its inputs, written in torch: register_replacement traces it with
# fwd_only (make_fx with Inductor's decompositions) into the ATen ops the graph holds. Its replacement takes
# the same inputs and computes the same thing in one op: aten.scaled_dot_product_attention(query, key, value,
# attn_mask=..., scale=...).
#
# TODO(human): write the search patterns and their replacements: softmax(q @ k^T / inv_scale) @ v and
#   softmax(q @ k^T * scale) @ v, each also with an additive mask before the softmax. Pass scale= always.


def attention_extra_check(match: Match) -> bool:
    """May this match become one scaled_dot_product_attention? `match.kwargs` maps each input of the pattern to
    what it matched: a node (its fake tensor in node.meta["val"]) or a plain number."""
    # TODO(human): refuse a scale that is not a plain number, and inputs (query, key, value, mask) of
    #   different dtypes.
    raise NotImplementedError("TODO(human): attention_extra_check")


@functools.cache
def build_pass() -> PatternMatcherPass:
    """A PatternMatcherPass holding every search pattern and its replacement, built once."""
    patterns = PatternMatcherPass()
    # TODO(human): register each pattern with register_replacement(search, replacement, example_inputs,
    #   fwd_only, patterns, extra_check=attention_extra_check). Example inputs only need the right rank,
    #   dtype and layout: (2, 4, 8, 16) tensors for query, key and value, a 0-d tensor for the scale, a
    #   (2, 1, 8, 8) mask; and for models that permute query, key and value from (batch, seq, heads, dim),
    #   examples permuted the same way (README.md, "Layout shows").
    raise NotImplementedError("TODO(human): build_pass")


def fuse_attention(gm: fx.GraphModule) -> int:
    """Replace every attention subgraph of `gm` by one scaled_dot_product_attention; return how many.

    `gm` is an ATen graph as Inductor's post-grad passes see it (make_fx with Inductor's decompositions,
    symbolic sizes, meta['val'] on every node). Edit it in place.
    """
    # TODO(human): apply the pass to gm.graph (it returns the number of matches replaced), then check the
    #   graph with gm.graph.lint() and regenerate forward() with gm.recompile().
    raise NotImplementedError("TODO(human): fuse_attention")
