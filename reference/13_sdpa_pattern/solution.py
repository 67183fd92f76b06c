"""Kata 13, reference solution: attention written out by hand, found in Inductor's post-grad ATen graph with
torch._inductor.pattern_matcher and replaced by one scaled_dot_product_attention."""
from __future__ import annotations

import functools

import torch
import torch.fx as fx
from torch._inductor.pattern_matcher import Match, PatternMatcherPass, fwd_only, register_replacement

aten = torch.ops.aten


# The search patterns: attention as models write it. fwd_only traces each with Inductor's decompositions, so
# softmax becomes amax, sub, exp, sum and div, and each matmul an expand, a view and a bmm, as in the graph.
def attention_div(query, key, value, inv_scale):
    return torch.softmax(query @ key.transpose(-2, -1) / inv_scale, dim=-1) @ value


def attention_mul(query, key, value, scale):
    return torch.softmax(query @ key.transpose(-2, -1) * scale, dim=-1) @ value


def attention_div_mask(query, key, value, inv_scale, mask):
    return torch.softmax(query @ key.transpose(-2, -1) / inv_scale + mask, dim=-1) @ value


def attention_mul_mask(query, key, value, scale, mask):
    return torch.softmax(query @ key.transpose(-2, -1) * scale + mask, dim=-1) @ value


# The replacements: one fused op. `scale=` always: SDPA's default is 1/sqrt(head dim), which a model need not use.
def sdpa_div(query, key, value, inv_scale):
    return aten.scaled_dot_product_attention(query, key, value, scale=1.0 / inv_scale)


def sdpa_mul(query, key, value, scale):
    return aten.scaled_dot_product_attention(query, key, value, scale=scale)


def sdpa_div_mask(query, key, value, inv_scale, mask):
    return aten.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=1.0 / inv_scale)


def sdpa_mul_mask(query, key, value, scale, mask):
    return aten.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)


def attention_extra_check(match: Match) -> bool:
    """May this match become one SDPA? The scale a plain number (SDPA takes a float, not a tensor), the mask a
    tensor (an input of the pattern matches a number too: `scores + 1.0`), and query, key, value (and the mask)
    of one dtype: SDPA refuses mixed dtypes."""
    scale = match.kwargs.get("scale", match.kwargs.get("inv_scale"))
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        return False
    if "mask" in match.kwargs and not isinstance(match.kwargs["mask"], fx.Node):
        return False  # a number added to the scores matched the mask: SDPA's attn_mask is a tensor
    dtypes = {match.kwargs[name].meta["val"].dtype for name in ("query", "key", "value", "mask") if name in match.kwargs}
    return len(dtypes) == 1


def _examples(with_mask: bool, heads_last: bool) -> list:
    """Example inputs the patterns are traced on: their values never matter, only their shapes and layout. Heads
    last: query, key and value as a model that holds them as (batch, seq, heads, dim) permutes them to (batch, heads,
    seq, dim). Such a tensor cannot be viewed as (batch * heads, seq, dim), so each matmul's reshape copies it first
    (aten.clone before the view), in the graph and so in the pattern traced on these examples."""
    q, k, v = (torch.empty(2, 8, 4, 16).permute(0, 2, 1, 3) if heads_last else torch.empty(2, 4, 8, 16)
               for _ in range(3))
    return [q, k, v, torch.tensor(0.5), *([torch.empty(2, 1, 8, 8)] if with_mask else [])]


@functools.cache
def build_pass() -> PatternMatcherPass:
    """A PatternMatcherPass holding the four search patterns and their replacements, each traced in both layouts:
    traced once, as Inductor registers its own patterns once (fuse_attention.py, _sfdp_init), then applied to every
    graph."""
    patterns = PatternMatcherPass()
    for search, replace, with_mask in [(attention_div, sdpa_div, False), (attention_mul, sdpa_mul, False),
                                       (attention_div_mask, sdpa_div_mask, True),
                                       (attention_mul_mask, sdpa_mul_mask, True)]:
        for heads_last in (False, True):
            register_replacement(search, replace, _examples(with_mask, heads_last), fwd_only, patterns,
                                 extra_check=attention_extra_check)
    return patterns


def fuse_attention(gm: fx.GraphModule) -> int:
    """Replace every attention subgraph of `gm` by one scaled_dot_product_attention; return how many."""
    replaced = build_pass().apply(gm.graph)
    gm.graph.lint()
    gm.recompile()
    return replaced
