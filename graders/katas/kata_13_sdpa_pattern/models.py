"""Kata 13's model zoo and hidden-model generator: attention written out by hand (every spelling traces to the
same ATen graph), and look-alikes a fused attention would change."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from graders.run import Case, aten_tracer

CPU_ONLY = ("the graded graph is Inductor's CPU post-grad graph: on the CPU, scaled_dot_product_attention traces "
            "to aten._scaled_dot_product_flash_attention_for_cpu")


@dataclass(frozen=True)
class Spelling:
    """One attention block, softmax(q @ k^T * scale [+ mask]) @ v, and the variants that are not one."""
    scale_op: str = "div"           # "div": scores / inv_scale; "mul": scores * scale
    scale: float | None = None      # None: the usual 1/sqrt(head dim)
    mask: bool = False              # an additive float mask before the softmax
    matmul: str = "operator"        # q @ k | torch.matmul(q, k) | q.matmul(k)
    transpose: str = "negative"     # k.transpose(-2, -1) | k.transpose(2, 3) | k.mT
    softmax: str = "torch"          # torch.softmax | F.softmax | x.softmax | nn.Softmax
    softmax_dim: int = -1           # -2: a softmax over the queries, not over the keys
    returns_weights: bool = False   # the attention weights are an output too: they must stay
    scale_param: bool = False       # the scale is a tensor parameter: SDPA takes a float
    number_added: float | None = None  # a number added to the scores before the softmax (no mask: a number)


class Attention(nn.Module):
    """One block. Heads last: q, k, v and the output are (batch, seq, heads, dim), as in BERT and Hugging Face's ports,
    which permute them to (batch, heads, seq, dim) for the matmuls and the output back."""

    def __init__(self, spelling: Spelling = Spelling(), heads_last: bool = False):
        super().__init__()
        self.spelling = spelling
        self.heads_last = heads_last
        if spelling.scale_param:
            self.scale = nn.Parameter(torch.tensor(0.3))
        if spelling.softmax == "module":
            self.softmax = nn.Softmax(dim=spelling.softmax_dim)

    def _matmul(self, a, b):
        return {"operator": lambda: a @ b, "torch": lambda: torch.matmul(a, b),
                "method": lambda: a.matmul(b)}[self.spelling.matmul]()

    def forward(self, q, k, v, mask=None):
        s = self.spelling
        if self.heads_last:
            q, k, v = (t.permute(0, 2, 1, 3) for t in (q, k, v))
        kt = {"negative": lambda: k.transpose(-2, -1), "positive": lambda: k.transpose(2, 3),
              "mT": lambda: k.mT}[s.transpose]()
        scores = self._matmul(q, kt)
        if s.scale_param:
            scores = scores * self.scale
        elif s.scale_op == "div":
            scores = scores / (math.sqrt(q.size(-1)) if s.scale is None else 1.0 / s.scale)
        else:
            scores = scores * (1.0 / math.sqrt(q.size(-1)) if s.scale is None else s.scale)
        if s.mask:
            scores = scores + mask
        if s.number_added is not None:
            scores = scores + s.number_added
        weights = {"torch": lambda: torch.softmax(scores, dim=s.softmax_dim),
                   "functional": lambda: F.softmax(scores, dim=s.softmax_dim),
                   "method": lambda: scores.softmax(s.softmax_dim),
                   "module": lambda: self.softmax(scores)}[s.softmax]()
        out = self._matmul(weights, v)
        if self.heads_last:
            out = out.permute(0, 2, 1, 3).contiguous()  # BERT's context layer, before its heads are merged
        return (out, weights) if s.returns_weights else out


class AttentionStack(nn.Module):
    """Blocks one after another: each block's output is the next block's query; weights a block returns are
    outputs of the stack."""

    def __init__(self, spellings: list[Spelling], heads_last: bool = False):
        super().__init__()
        self.blocks = nn.ModuleList(Attention(s, heads_last) for s in spellings)

    def forward(self, q, k, v, mask=None):
        kept = []
        for block in self.blocks:
            q = block(q, k, v, mask)
            if isinstance(q, tuple):
                q, weights = q
                kept.append(weights)
        return (q, *kept) if kept else q


def is_genuine(s: Spelling) -> bool:
    return s.softmax_dim == -1 and not s.returns_weights and not s.scale_param and s.number_added is None


def case(spellings: list[Spelling], hint: str, *, heads: int = 4, seq: int = 8, dim: int = 16,
         dynamic_seq: bool = False, batch: int | None = None, dtype=torch.float32, value_dtype=None,
         expect: int | None = None, heads_last: bool = False) -> Case:
    """Inputs q, k, v of shape (batch, heads, seq, dim), or (batch, seq, heads, dim) `heads_last`, and, where a block
    masks, a mask (batch, 1, seq, seq).
    The batch is symbolic (or static `batch`), the sequence length symbolic with `dynamic_seq`; the graded
    graph is traced once on fakes, then run at batch sizes 1 and 3 (and, with `dynamic_seq`, other lengths),
    or, static, at its own batch. A symbolic trace costs about five times a static one (sympy reasons about
    every view and expand): only the cases whose point is a size symbol (or that stand for the graph a
    learner meets first) are symbolic."""
    masked = any(s.mask for s in spellings)
    value_dtype = value_dtype or dtype

    def inputs(b: int) -> tuple:
        length = seq + 2 * (b - 2) if dynamic_seq else seq
        shape = (b, length, heads, dim) if heads_last else (b, heads, length, dim)
        q, k = (torch.randn(*shape, dtype=dtype) for _ in range(2))
        v = torch.randn(*shape, dtype=value_dtype)
        mask = (torch.randn(b, 1, length, length, dtype=value_dtype),) if masked else ()
        return (q, k, v, *mask)

    sym = (0,) if batch is None else ()
    sym_seq = sym + (((1,) if heads_last else (2,)) if dynamic_seq else ())
    dynamic = (sym_seq, sym_seq, sym_seq) + ((sym + ((2, 3) if dynamic_seq else ()),) if masked else ())
    expected = sum(map(is_genuine, spellings)) if expect is None else expect
    return Case(lambda: AttentionStack(spellings, heads_last), inputs, expected, hint,
                trace=aten_tracer(lambda: inputs(batch or 2), dynamic), batch_sizes=(batch,) if batch else (1, 3),
                cpu_only=CPU_ONLY, extra={"dynamic": dynamic})


# Static (every size a number) where a case's point is a spelling, a scale or a refusal; symbolic where it is the
# graph a learner meets first (divided_by_sqrt_d) or a size symbol (dynamic_sequence_length, every_spelling: each
# of the four patterns on a symbolic batch and sequence length) and in half the hidden models.
STATIC = 2

L1_CASES = {
    "divided_by_sqrt_d": case([Spelling()], "register softmax(q @ k.transpose(-2, -1) / inv_scale, dim=-1) @ v as "
                              "the search pattern, traced on example inputs with fwd_only."),
    "two_heads_of_width_64": case([Spelling()], "the pattern does not depend on the sizes it was traced with: "
                                  "register_replacement ignores the sizes in views and expands.", heads=2, dim=64,
                                  batch=STATIC),
}
SCALE = "the replacement must pass scale=: SDPA's default is 1/sqrt(head dim), and this model scales by another number."
EXACT_CASES: dict[str, Case] = {
    "multiplied_by_inverse": case([Spelling(scale_op="mul")], "scores * (1/sqrt(d)) traces to aten.mul, not aten.div: "
                                  "another search pattern.", batch=STATIC),
    "non_default_scale_div": case([Spelling(scale=0.1)], SCALE, batch=STATIC),
    "non_default_scale_mul": case([Spelling(scale_op="mul", scale=0.05)], SCALE, batch=STATIC),
    "additive_mask": case([Spelling(mask=True)], "softmax(scores + mask) is attention with attn_mask=mask: one more "
                          "pattern, with the mask as an input.", batch=STATIC),
    "dynamic_sequence_length": case([Spelling(mask=True)], "the block adds a mask, and the sequence length is a "
                                    "size symbol here: the masked pattern, traced with static sizes, still matches.",
                                    dynamic_seq=True),
    "two_blocks": case([Spelling(), Spelling(scale_op="mul")], "the first block divides, the second multiplies: "
                       "one pattern each, and each block is one match: apply the pass once, it finds them all.",
                       batch=STATIC),
    "heads_last_layout": case([Spelling(mask=True), Spelling(scale_op="mul")], "q, k and v come as (batch, seq, "
                              "heads, dim), as in BERT, and each block (the first masks and divides, the second "
                              "multiplies) permutes them: a permuted tensor cannot be viewed as (batch * heads, seq, "
                              "dim), so each matmul's reshape copies it first (aten.clone before the view), and a "
                              "pattern traced on contiguous examples does not match. Trace the patterns on examples "
                              "permuted the same way too.", heads_last=True, batch=STATIC),
    "every_spelling": case([Spelling(matmul="torch", transpose="mT", softmax="module"),
                            Spelling(matmul="method", transpose="positive", softmax="functional", scale_op="mul"),
                            Spelling(softmax="method", mask=True)],
                           "torch.matmul, .mT, nn.Softmax or F.softmax all trace to the same ATen ops: the "
                           "blocks divide, multiply, and divide and add a mask.", dynamic_seq=True),
    # Must not be replaced.
    "softmax_over_queries": case([Spelling(softmax_dim=-2)], "a softmax over dim -2 is not attention over the keys: "
                                 "register_replacement rechecks a match by tracing the pattern again on its inputs.",
                                 batch=STATIC),
    "weights_also_returned": case([Spelling(returns_weights=True)], "the attention weights are an output: a fused "
                                  "SDPA never materialises them, so the match must be refused: the softmax's output "
                                  "has a user outside the pattern, which a pattern stating each node's user count "
                                  "refuses (register_replacement's traced one does; _users=MULTIPLE accepts any).",
                                  batch=STATIC),
    "scale_in_a_tensor_parameter": case([Spelling(scale_param=True)], "here the scale is a tensor (a graph node), and "
                                        "SDPA's scale= takes a float: refuse the match in extra_check.",
                                        batch=STATIC),
    "query_and_value_dtypes_differ": case([Spelling(mask=True)], "a float64 mask promotes the scores, so value is "
                                          "float64 while query and key are float32: SDPA refuses mixed dtypes; check "
                                          "the dtypes of query, key and value (meta['val']) in extra_check.",
                                          value_dtype=torch.float64, expect=0, batch=STATIC),
    "number_added_to_the_scores": case([Spelling(number_added=1.0)], "scores + 1.0 matches the masked pattern with "
                                       "the number in the mask's place; SDPA's attn_mask is a tensor: in extra_check, "
                                       "refuse a mask that is no graph node (Inductor's _sfdp_params_check does).",
                                       batch=STATIC),
    "genuine_next_to_a_lookalike": case([Spelling(softmax_dim=-2), Spelling(scale_op="mul", scale=0.2)],
                                        "the first block is no attention over the keys, the second is.", batch=STATIC),
}

# L3: one attention of 8 heads x 512 positions x 64, float32, batch 1: the hand-written form writes five 8 MiB score
# tensors, the fused op only its 1 MiB output (and a small log-sum-exp). A batch of 2 read the same speedups (1.78x-
# 2.09x against 1.81x-1.84x, one thread, 2026-11-28) at twice the cost of every call: half a second more a grading.
BENCHMARK = case([Spelling()], "", heads=8, seq=512, dim=64, batch=1)

LOOKALIKES = {
    "softmax_over_queries": lambda s: replace(s, softmax_dim=-2),
    "weights_returned": lambda s: replace(s, returns_weights=True),
    "scale_parameter": lambda s: replace(s, scale_param=True),
}


def hidden_case(rng: random.Random) -> Case:
    """Two or three blocks of random spellings, random sizes, the batch and the sequence length symbolic or every
    size static. Every model holds a masked block that divides and a masked one that multiplies (in a random order):
    masked attention in both ATen forms, so a pass missing one form fails every hidden model (the visible models
    mask only the dividing form). A third block, in one model of two, is a random spelling, masked or not, or more
    often a look-alike of one. In one model of two q, k and v come heads last, permuted in every block, masked or not,
    dividing or multiplying (the visible heads-last model masks only its dividing block). At least two heads: with
    one static head make_fx reads a size of an intermediate score tensor (aten.sym_size of it), a use outside the
    pattern that no matcher may erase."""
    def spelling(op: str, masked: bool) -> Spelling:
        return Spelling(scale_op=op, scale=rng.choice([None, None, 0.125, 0.3]), mask=masked,
                        matmul=rng.choice(["operator", "torch", "method"]),
                        transpose=rng.choice(["negative", "positive", "mT"]),
                        softmax=rng.choice(["torch", "functional", "method", "module"]))

    spellings = [spelling(op, True) for op in rng.sample(["div", "mul"], 2)]
    if rng.random() < 0.5:
        third = spelling(rng.choice(["div", "mul"]), rng.random() < 0.5)
        if rng.random() < 0.8:
            third = LOOKALIKES[rng.choice(sorted(LOOKALIKES))](third)
        spellings.insert(rng.randrange(3), third)
    heads, seq, dim = rng.choice([3, 4]), rng.choice([5, 6, 7, 9]), rng.choice([8, 16, 24, 32])
    symbolic = rng.random() < 0.5  # the batch and the sequence length size symbols; otherwise every size static
    heads_last = rng.random() < 0.5  # q, k, v (batch, seq, heads, dim), permuted in each block
    return case(spellings, "the pass must find every attention whatever its spelling, sizes, scale and layout, and "
                "leave look-alikes alone.", heads=heads, seq=seq, dim=dim, dynamic_seq=symbolic,
                batch=None if symbolic else STATIC, heads_last=heads_last)
