"""Grader for kata 11: Conv + BatchNorm folding in a torch.export ExportedProgram. Models: models.py; mutants:
mutants.py. The run path hands the pass a program and builds the module of the one it returns
(graders/run/harness.py, `_apply_to_program`; guards compared there); the verdict here checks the program itself."""
from __future__ import annotations

from collections import Counter

import torch
import torch.fx as fx
from torch.utils._pytree import tree_leaves

from graders.run import CheckFailed, ExportedProgram, Kata, Pass, Run, assert_same_outputs, exported

from .models import BENCHMARK, EXACT_CASES, SINGLE_PAIR, TWO_PAIRS, hidden_case

KATA = Kata("11_export_conv_bn", imports_torch_internals=True)
FUNCTION = "fuse_conv_bn"
BATCH_NORMS = frozenset(f"aten.{op}" for op in (
    "_native_batch_norm_legit_no_training.default", "_native_batch_norm_legit_functional.default",
    "_native_batch_norm_legit.default", "_native_batch_norm_legit.no_stats", "native_batch_norm.default",
    "batch_norm.default", "_batch_norm_with_update.default", "_batch_norm_no_update.default"))
CONVOLUTION = "aten.convolution.default"
STATE = ("PARAMETER", "BUFFER", "CONSTANT_TENSOR")

SOUND_HINT = ("build the result with ExportedProgram(...) from a copy of the graph, a signature whose input specs "
              "name the placeholders in order and whose output specs name the output node's arguments, and a state "
              "dict holding every parameter (as nn.Parameter) and persistent buffer the specs name.")
UNCHANGED_HINT = ("copy the graph (copy.deepcopy(ep.graph)) and the state dict (a new dict; never write into its "
                  "tensors), and build the new program from the copies.")
FAKE_HINT = ("make a new placeholder's meta['val'] with the graph's own fake mode "
             "(fake_mode.from_tensor(tensor, static_shapes=True), the mode of any node's meta['val']), and derive a "
             "rewired node's meta['val'] again from its new arguments' (in that mode, the ShapeEnv's guards "
             "suppressed), and its users' where theirs changes.")
LAYOUT_HINT = ("keep the folded weight in the layout of the weight it replaces (weight.to(dtype) keeps it; "
               ".contiguous() does not): a convolution's output layout follows its weight's.")


def _nodes(program: ExportedProgram, targets) -> list[str]:
    return [n.name for n in program.graph.nodes if n.op == "call_function" and str(n.target) in targets]


def _after_a_biasless_conv(program: ExportedProgram, bns: list[str]) -> list[tuple[str, str]]:
    """(BatchNorm, convolution) for each of the BatchNorm nodes named `bns` whose input is a convolution without
    bias (its args[2] None)."""
    return [(n.name, n.args[0].name) for n in program.graph.nodes if n.name in bns and n.args
            and isinstance(n.args[0], fx.Node) and str(n.args[0].target) == CONVOLUTION and n.args[0].args[2] is None]


def _state_placeholders(program: ExportedProgram) -> dict[str, tuple]:
    """Placeholder name -> (kind, target, read) for the parameters, buffers and constants."""
    readers = {n.name: bool(n.users) for n in program.graph.nodes if n.op == "placeholder"}
    return {s.arg.name: (s.kind.name, s.target, readers.get(s.arg.name, False))
            for s in program.graph_signature.input_specs if s.kind.name in STATE}


def assert_signature(run: Run) -> None:
    """torch.export's order (lifted state, then user inputs), a state dict that matches the specs, no state left
    unread that the given program read (the folded BNs' and weights'), and the mutated buffers still written back."""
    program, before = run.result, run.program_before
    specs = program.graph_signature.input_specs
    kinds = [s.kind.name for s in specs]
    if "USER_INPUT" in kinds:
        late = [s for s in specs[kinds.index("USER_INPUT"):] if s.kind.name != "USER_INPUT"]
        if late:
            run.fail(f"in the program {FUNCTION} returned, the placeholder {late[0].arg.name} ({late[0].kind.name} "
                     f"{late[0].target!r}) comes after a user input: an exported program's inputs are its parameters, "
                     "buffers and constants first, then the user inputs, as ExportGraphSignature documents "
                     "([*parameters_buffers_constant_tensors, *flattened_user_inputs]) and torch's own passes "
                     "produce (run_decompositions() returns them in that order).",
                     "insert a new placeholder before the first user input's (graph.inserting_before(node)).")
    if kinds.count("USER_INPUT") != [s.kind.name for s in before.graph_signature.input_specs].count("USER_INPUT"):
        run.fail(f"the program {FUNCTION} returned takes {kinds.count('USER_INPUT')} user input(s); the program it was "
                 "given took another number.", "a fold adds parameters and removes state; it never adds a user input.")
    state = _state_placeholders(program)
    named = {t for kind, t, _ in state.values() if kind == "PARAMETER"} | set(program.graph_signature.buffers) - set(
        program.graph_signature.non_persistent_buffers)
    for what, held, wanted in (("state dict", set(program.state_dict), named),
                               ("constants", set(program.constants), {t for _, t, _ in state.values()} - named)):
        if held - wanted:
            run.fail(f"the {what} of the program {FUNCTION} returned holds {', '.join(sorted(held - wanted)[:4])}, "
                     "which no input spec names: state without a placeholder is dead weight that ep.module(), "
                     "torch.export.save and every later pass carry along.",
                     "keep in the state dict exactly the targets of the PARAMETER and persistent BUFFER specs.")
    unread_before = {t for _, t, read in _state_placeholders(before).values() if not read}
    dead = [f"{name} ({kind} {target!r})" for name, (kind, target, read) in state.items()
            if not read and target not in unread_before]
    if dead:
        run.fail(f"in the program {FUNCTION} returned, the placeholder(s) {', '.join(dead[:4])} feed no node: once a "
                 "BN is folded, its running statistics, gamma and beta (and a convolution weight nothing else reads) "
                 "are dead state.", "erase the dead placeholders, drop their input specs and their state dict entries.")
    mutated = [(s.kind.name, s.target) for s in program.graph_signature.output_specs if s.kind.name != "USER_OUTPUT"]
    if mutated != [(s.kind.name, s.target) for s in before.graph_signature.output_specs if s.kind.name != "USER_OUTPUT"]:
        run.fail(f"the program {FUNCTION} returned writes back {mutated or 'no buffer'}; the program it was given wrote "
                 "back other buffers: a BN in training mode updates its running statistics through outputs of kind "
                 "BUFFER_MUTATION, which must stay.", "leave a BN in training mode, and its outputs, as they were.")


def assert_output_layout(run: Run) -> None:
    """The folded program returns each output in the layout the given one does (strides of real outputs, on one
    input): Inductor keeps a compiled graph's output strides as eager's too (torch._inductor.config.
    keep_output_stride), since a caller may depend on them."""
    inputs = run.make_inputs(run.case.batch_sizes[0])
    with torch.no_grad():
        before, after = tree_leaves(run.before(*inputs)), tree_leaves(run.gm(*inputs))
    for i, (was, now) in enumerate(zip(before, after)):
        if isinstance(was, torch.Tensor) and isinstance(now, torch.Tensor) and was.stride() != now.stride():
            run.fail(f"the program {FUNCTION} returned gives its output {i} with strides {tuple(now.stride())}; the "
                     f"program it was given returns it with strides {tuple(was.stride())} (shape "
                     f"{tuple(was.shape)}): a fold changes what a convolution computes, not the layout of what the "
                     "program returns.", LAYOUT_HINT)


def assert_round_trip(run: Run) -> None:
    """torch.export.save then torch.export.load gives a program that computes the same, on the cases that ask
    (`extra["round_trip"]`: a load costs a second, it propagates fake tensors through the whole graph again).
    Isolated, every program already came from the worker that way (graders/isolation/records/programs.py)."""
    if run.ctx.session.isolate or not run.case.extra.get("round_trip"):
        return
    try:
        back = exported.round_trip(run.result).module()
    except Exception as exc:  # noqa: BLE001 - the serializer's own sentence is the failure
        run.fail(f"the program {FUNCTION} returned does not survive torch.export.save and torch.export.load "
                 f"({type(exc).__name__}: {str(exc).strip()[:300]}).", SOUND_HINT)
    assert_same_outputs(run.gm, back, [run.make_inputs(run.case.batch_sizes[0])],
                        what=f"the program {FUNCTION} returned, saved and loaded again", hint=SOUND_HINT)


def folded(run: Run) -> dict:
    """The program is sound (validates, meta['val'] on every node and what the graph computes), the given one is
    unchanged, the signature is in order, BatchNorms are left as the case expects, every convolution kept."""
    program, before = run.result, run.program_before
    targets = [Counter(s.target for s in p.graph_signature.input_specs if s.kind.name in STATE)
               for p in (program, before)]
    if shared := [t for t, n in targets[0].items() if n > max(1, targets[1][t])]:
        run.fail(f"in the program {FUNCTION} returned, {targets[0][shared[0]]} input specs name the state dict entry "
                 f"{shared[0]!r}: their placeholders all read that one tensor.",
                 "every pair gets parameters of its own: give each new parameter a name of its own.")
    try:
        exported.assert_program_sound(program, FUNCTION, SOUND_HINT)
        exported.assert_program_unchanged(run.traced, before, FUNCTION, UNCHANGED_HINT)
        unchecked = exported.assert_fake_propagation(program, before, FUNCTION, FAKE_HINT)
    except CheckFailed as failure:
        raise CheckFailed(str(failure) + run.graphs()) from None
    assert_signature(run)
    if str(program.range_constraints) != str(before.range_constraints):
        run.fail(f"the program {FUNCTION} returned has the range constraints {program.range_constraints}; the program "
                 f"it was given had {before.range_constraints}.",
                 "a fold changes no input's shape: pass the given program's range_constraints on.")
    bns, convs = _nodes(program, BATCH_NORMS), _nodes(program, {CONVOLUTION})
    if run.case.expect is not None and len(bns) not in run.case.expect:
        biasless = _after_a_biasless_conv(program, bns) if run.case.expect == (0,) else []
        run.fail(f"after {FUNCTION}, the program holds {len(bns)} BatchNorm node(s) ({', '.join(bns) or 'none'}); "
                 f"expected {' or '.join(map(str, run.case.expect))}.",
                 f"{biasless[0][0]} follows {biasless[0][1]}, a convolution without bias (args[2] is None): it folds "
                 "all the same, into a new bias b' = (0 - mean) * scale + beta." if biasless else None)
    if len(convs) != len(_nodes(before, {CONVOLUTION})):
        run.fail(f"after {FUNCTION}, the program holds {len(convs)} convolution node(s); the program it was given held "
                 f"{len(_nodes(before, {CONVOLUTION}))}.", "folding keeps every convolution; it only removes BatchNorms.")
    assert_output_layout(run)
    assert_round_trip(run)
    figures = {"batchnorms_before": len(_nodes(before, BATCH_NORMS)), "batchnorms_after": len(bns)}
    if unchecked:  # torch's own program records these ops' strides otherwise than their kernels compute them
        figures["strides_unchecked"] = unchecked
    return figures


FOLD = Pass(FUNCTION, returns=ExportedProgram, verdict=folded, what="the folded program's module")

KATA.cases(1, {"single_pair": SINGLE_PAIR, "two_pairs": TWO_PAIRS}, FOLD)
KATA.cases(2, EXACT_CASES, FOLD)
KATA.speed("small_cnn_speedup", BENCHMARK, FOLD, what="the folded small CNN's program",
           hint="every BatchNorm in this CNN follows a convolution it can fold into: fold all eight, once, in the "
                "pass (new parameters), not in ops the program runs on every call.")
KATA.hidden(hidden_case, FOLD)
