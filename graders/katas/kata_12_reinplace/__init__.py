"""Grader for kata 12: reinplacing a functionalized ATen graph. Programs: models.py; mutants: mutants.py.

Every check runs the rewritten graph against eager on private copies of the inputs and compares the outputs and
the inputs after the call; then outputs that share storage with an input must share it in eager too; no op may
write a tensor that another of its arguments reads; a symbolic trace must gain no guard; and the fresh tensors
left per call must be no more than a right pass leaves (`Case.expect`) nor than torch.fx.passes.reinplace leaves
on a static graph (a missed opportunity). Everything but the guards is measured on the graph the judge holds
(rebuilt from the worker's records when isolated), by running it; the guards are the ShapeEnv's, measured around
the pass's call where it ran (`Run.added_guards`, as katas 11 and 13 read them): a check that teaches, which a pass
could dodge by clearing the ShapeEnv, in process as isolated.
"""
from __future__ import annotations

import torch
import torch.fx as fx
from torch.utils._pytree import tree_leaves

from graders.run import ATOL, RTOL, CheckFailed, Context, Kata, Pass, Run, cloned, functionalized, harness

from .models import BASIC, BENCHMARK, EXACT_CASES, hidden_case

KATA = Kata("12_reinplace", imports_torch_internals=True)


def where(run: Run) -> str:
    name = run.ctx.check.name
    return f"hidden program {name[6:]}" if name.startswith("model_") else f"program {name}"


def _outputs(value) -> list:
    return [t for t in tree_leaves(value)]


def compare(run: Run) -> None:
    """Outputs and inputs after the call against eager, then which outputs alias inputs."""
    for inputs in run.input_sets():
        eager_in, graph_in = cloned(inputs), cloned(inputs)
        with torch.no_grad():
            want = run.pristine(*eager_in)
            try:
                got = run.gm(*graph_in)
            except Exception as exc:  # noqa: BLE001 - the rewritten graph's failure, told as a sentence
                run.fail(f"the graph after reinplace raised {type(exc).__name__}: {str(exc).splitlines()[0]} on "
                         f"{where(run)}.")
        for what, g, w in (("output", _outputs(got), _outputs(want)), ("input after the call", graph_in, eager_in)):
            try:
                torch.testing.assert_close(g, w, rtol=RTOL, atol=ATOL)
            except AssertionError as exc:
                detail = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
                run.fail(f"on {where(run)} the graph after reinplace gives another {what} than eager: {detail}",
                         _unwritten_input_hint(inputs, graph_in, eager_in) if what != "output" else None)
        extra = functionalized.aliased_inputs(got, graph_in) - functionalized.aliased_inputs(want, eager_in)
        if extra:
            o, i = sorted(extra)[0]
            run.fail(f"on {where(run)} output {o} of the graph after reinplace shares storage with input {i}; eager's "
                     f"output {o} does not: the caller would hold its own input as a result, and a write into one "
                     "would change the other.")


def _unwritten_input_hint(inputs: tuple, graph_in: tuple, eager_in: tuple) -> str | None:
    """Rule 5's hint where an input that eager leaves as it was comes back changed; None (the case's) otherwise."""
    for i, (x, g, w) in enumerate(zip(inputs, graph_in, eager_in)):
        if isinstance(x, torch.Tensor) and torch.equal(w, x) and not torch.equal(g, x):
            return (f"the program never writes input {i}: with no copy_ epilogue writing a result back into it, it "
                    "must come back as it was. Write an input in place only where its copy_ overwrites it anyway "
                    "(the README's rule 5).")
    return None


def why_fresh(gm: fx.GraphModule, names: list[str]) -> list[str]:
    """Questions about nodes `names` of the reinplaced `gm`, which still write fresh tensors, where a node tells: the
    value a copy_ epilogue writes back into an input (rule 5), an op whose in-place overloads have other names than its
    own (rule 1). Questions, not verdicts: whether the node could run in place depends on the other rules too."""
    nodes = {node.name: node for node in gm.graph.nodes}
    written_back = {node.args[1]: node.args[0] for node in gm.graph.nodes
                    if node.target is torch.ops.aten.copy_.default and node.args[0].op == "placeholder"}
    causes = []
    for name in names:
        node = nodes[name]
        if node in written_back:
            causes.append(f"{name} is the value the copy_ at the end writes back into the input {written_back[node]}: "
                          f"could it be computed in {written_back[node]} itself (the README's rule 5)?")
        elif isinstance(node.target, torch._ops.OpOverload):
            packet = getattr(torch.ops.aten, node.target.overloadpacket.__name__ + "_", None)
            if packet is not None and node.target._overloadname not in packet.overloads():
                causes.append(f"{name} is {node.target}, whose in-place overloads have other names "
                              f"({', '.join(f'{packet.__name__}.{o}' for o in packet.overloads())}): does one of "
                              "them take its argument types (the README's rule 1)?")
    return causes


def verdict(run: Run) -> dict:
    """No new guard, no op writing what another of its arguments reads, no more fresh tensors than a right pass."""
    run.assert_no_guard_added("graph", where=f"on {where(run)} ")
    inputs = run.make_inputs(run.case.batch_sizes[0])
    if (clash := functionalized.self_read_twice(run.gm, cloned(inputs))):
        run.fail(f"on {where(run)} the node {clash} writes its first argument in place while another of its "
                 "arguments overlaps that memory: the op reads what it is overwriting.",
                 hint="no other argument may alias self (the same node, or a view of the same storage).")
    left = functionalized.fresh_tensors(run.gm, cloned(inputs))
    bound, by = run.case.expect, "a right pass"
    if not run.case.extra.get("symbolic"):  # torch's pass reads static shapes from sample inputs
        torch_left = _torch_fresh(run, inputs)
        if torch_left is not None and (bound is None or len(torch_left) < bound):
            bound, by = len(torch_left), f"torch.fx.passes.reinplace ({', '.join(n for n, _ in torch_left) or 'none'})"
    if bound is not None and len(left) > bound:
        hint = run.case.hint  # after the questions the nodes ask, a sentence of its own
        hint = " ".join([*why_fresh(run.gm, [n for n, _ in left]), hint[:1].upper() + hint[1:]]).strip()
        run.fail(f"missed opportunity on {where(run)}: the graph after reinplace allocates {len(left)} fresh tensor(s) "
                 f"per call ({', '.join(n for n, _ in left)}); {by} leaves {bound}.", hint)
    return {"fresh_tensors": len(left)}


def _torch_fresh(run: Run, inputs: tuple) -> list | None:
    """The fresh tensors torch's own pass leaves on the graph before the pass, where its result is right."""
    try:
        rewritten = functionalized.torch_reinplaced(run.before, cloned(inputs))
        eager_in, graph_in = cloned(inputs), cloned(inputs)
        with torch.no_grad():
            torch.testing.assert_close(_outputs(rewritten(*graph_in)), _outputs(run.pristine(*eager_in)))
        torch.testing.assert_close(graph_in, eager_in)
    except Exception:  # noqa: BLE001 - torch's pass is wrong here (mul(a, a.t())): no bound from it
        return None
    return functionalized.fresh_tensors(rewritten, cloned(inputs))


PASS = Pass("reinplace", verdict=verdict, what="the graph after reinplace", compare_first=True)


def case_of(c):
    from dataclasses import replace

    return replace(c, compare=compare)


KATA.cases(1, {"basic": case_of(BASIC)}, PASS)
KATA.cases(2, {name: case_of(c) for name, c in EXACT_CASES.items()}, PASS)


@KATA.check(3)
def chain_fresh_bytes(ctx: Context) -> dict:
    """L3: the fresh bytes the reinplaced chain writes per call against the functional graph's, counted exactly."""
    run = harness.apply(ctx, case_of(BENCHMARK), PASS)
    compare(run)
    inputs = run.make_inputs(BENCHMARK.batch_sizes[0])
    before = sum(b for _, b in functionalized.fresh_tensors(run.before, cloned(inputs)))
    after_nodes = functionalized.fresh_tensors(run.gm, cloned(inputs))
    after = sum(b for _, b in after_nodes)
    limit = ctx.kata.max_bytes_fraction
    figures = {"bytes_written_before": before, "bytes_written_after": after, "max_bytes_fraction": limit,
               "fresh_bytes_ratio": round(before / max(after, 1), 3)}
    if after > limit * before:
        causes = why_fresh(run.gm, [n for n, _ in after_nodes])
        hint = " ".join(causes) if causes else ("which ops of the chain could still write into a tensor "
                                                         "nobody reads again?")
        raise CheckFailed(
            f"the reinplaced chain writes {after / 2**20:.1f} MiB of fresh tensors per call "
            f"({', '.join(n for n, _ in after_nodes)}), the functional graph {before / 2**20:.1f} MiB; this level allows "
            f"at most {limit:.0%} of it, counted exactly, not timed. Hint: {hint}", figures)
    return figures


KATA.hidden(lambda rng: case_of(hidden_case(rng)), PASS)
