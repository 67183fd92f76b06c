"""Grader for kata 13: hand-written attention in Inductor's post-grad ATen graph replaced by one
scaled_dot_product_attention through torch._inductor.pattern_matcher. Models: models.py; mutants: mutants.py."""
from dataclasses import replace

import torch.fx as fx

from graders.run import Kata, Pass, Run, aten, harness

from .models import BENCHMARK, EXACT_CASES, L1_CASES, hidden_case

KATA = Kata("13_sdpa_pattern", imports_torch_internals=True)


def sdpa_nodes(gm: fx.GraphModule) -> list[str]:
    """The fused attention ops of an ATen graph (on the CPU, aten._scaled_dot_product_flash_attention_for_cpu)."""
    return [n.name for n in gm.graph.nodes if n.op == "call_function" and "scaled_dot_product" in str(n.target)]


def _op(node) -> str:
    return str(node.target) if isinstance(node, fx.Node) and node.op == "call_function" else ""


def _copied(operand) -> bool:
    """Whether a bmm operand was copied before its view: view(clone(expand(x))), a permuted x that cannot be viewed."""
    return _op(operand) == "aten.view.default" and _op(operand.args[0]) == "aten.clone.default"


def softmaxes_left(gm: fx.GraphModule) -> list[str]:
    """Each softmax still in the graph (its aten.amax) and the form of its block, as a search pattern must be to match
    it: the scores divided or multiplied, a mask added or not, query and key copied before their views or not."""
    left = []
    for amax in (n for n in gm.graph.nodes if _op(n) == "aten.amax.default"):
        try:
            left.append(_block_form(amax))
        except (IndexError, AttributeError, TypeError):  # a graph a pass left in another shape: its name alone
            left.append(amax.name)
    return left


def _block_form(amax: fx.Node) -> str:
    """One softmax's block, in words (softmaxes_left)."""
    dims = amax.args[1] if isinstance(amax.args[1], (list, tuple)) else [amax.args[1]]
    scores, words = amax.args[0], [f"{amax.name} (a softmax over dim {', '.join(map(str, dims))})"]
    if _op(scores) == "aten.add.Tensor":
        added = scores.args[1]
        words.append("a mask added" if isinstance(added, fx.Node) else f"the number {added!r} added")
        scores = scores.args[0]
    scaled = {"aten.div.Tensor": "divided", "aten.mul.Tensor": "multiplied"}.get(_op(scores))
    if scaled:
        by = scores.args[1]
        words.insert(1, f"scores {scaled} by {'the tensor ' + by.name if isinstance(by, fx.Node) else repr(by)}")
        bmm = scores.args[0].args[0] if _op(scores.args[0]) == "aten.view.default" else None
        if _op(bmm) == "aten.bmm.default":
            words.append("query and key copied before their views (aten.clone: permuted inputs)"
                         if _copied(bmm.args[0]) or _copied(bmm.args[1]) else "query and key viewed as they are")
    return ", ".join(words)


def fused(run: Run) -> dict:
    """In order: as many new fused attention ops as the model has attention blocks that may be fused, the count
    returned, meta['val'] on every node, the size symbols neither specialised nor constrained (no new guard)."""
    expected = run.case.expect
    new = [name for name in sdpa_nodes(run.gm) if name not in set(sdpa_nodes(run.before))]
    if len(new) != expected:
        left = softmaxes_left(run.gm) if len(new) < expected else []
        run.fail(f"after fuse_attention the graph holds {len(new)} new scaled_dot_product_attention op(s); this model "
                 f"has {expected} attention block(s) that may be fused."
                 + (f" Softmaxes left: {'; '.join(left)}." if left else ""))
    if run.result != expected:
        run.fail(f"fuse_attention fused {expected} attention block(s) but returned {run.result}.",
                 "return the number of matches replaced: PatternMatcherPass.apply returns it.", graphs=False)
    described = aten.val_descriptions(run.gm)
    bare = [n.name for n in run.gm.graph.nodes if n.op != "output" and n.name not in described]
    if bare:
        run.fail(f"after fuse_attention, node(s) {', '.join(bare[:5])} carry no meta['val']: every node of a post-grad "
                 "graph records the fake tensor it computes, and the passes after yours read it.",
                 "let the pattern matcher insert the replacement (it traces it on the matched nodes' meta['val']) "
                 "instead of creating nodes by hand.")
    before = aten.val_descriptions(run.before)
    changed = [(n.name, before[n.name], described[n.name]) for n in run.gm.graph.nodes
               if n.op == "placeholder" and n.name in before and before[n.name] != described.get(n.name)]
    if changed:
        name, was, now = changed[0]
        run.fail(f"after fuse_attention the input {name} is {now}; it was traced as {was}: the pass specialised a "
                 "size symbol.", "build the replacement from the matched nodes, never from concrete sizes.")
    run.assert_no_guard_added("graph", "a post-grad pass keeps the graph valid for every size the symbols stand "
                                       "for: do not branch on or compute with concrete sizes in the pattern, the "
                                       "replacement or extra_check.")
    return {"fused": run.result, "nodes_before": len(run.before.graph.nodes), "nodes_after": len(run.gm.graph.nodes)}


FUSE = Pass("fuse_attention", returns=int, verdict=fused, what="the rewritten graph")
REPLACED_WRONG = ("as many blocks fused as may be, yet the outputs differ: a replacement must compute what its pattern "
                  "does (scale=1.0 / inv_scale where the pattern divides, scale where it multiplies; attn_mask=mask "
                  "where it adds a mask), and only genuine attention may match, never a look-alike in its place.")


def compare(run: Run) -> None:
    """After `fused` passed, the count is right: outputs that differ come from what the matches were replaced by
    (compared as every kata compares them, REPLACED_WRONG for the case's hint)."""
    harness.compare(replace(run, case=replace(run.case, compare="allclose", hint=REPLACED_WRONG)))


def compared(cases: dict) -> dict:
    """The cases, their outputs compared by `compare`."""
    return {name: replace(case, compare=compare) for name, case in cases.items()}


KATA.cases(1, compared(L1_CASES), FUSE)
KATA.cases(2, compared(EXACT_CASES), FUSE)
KATA.speed("attention_1x8x512x64_speedup", BENCHMARK, FUSE, what="the fused attention", verdict=True,
           hint="one scaled_dot_product_attention never writes the 512 x 512 score matrices the hand-written form "
                "writes five times.")
KATA.hidden(lambda rng: replace(hidden_case(rng), compare=compare), FUSE)
