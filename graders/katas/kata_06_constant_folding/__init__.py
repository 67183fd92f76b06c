"""Grader for kata 06: constant folding. Models: models.py; mutants: mutants.py. Inference-style: parameters
and buffers are constants unless the forward writes them. Folding runs the same ops on the same values, only
earlier, so every case compares bit for bit (Case(compare="bit_exact")): a tolerance would hide a value computed
differently, and the reseeded calls after the first show a frozen random draw or a frozen buffer."""
from __future__ import annotations

import operator
from collections import Counter
from functools import reduce

import torch
import torch.fx as fx

from graders.run import Kata, Pass, Run, assert_bit_identical, describe_difference, describe_exception

from .models import BENCHMARK, EXACT_CASES, L1_CASES, Program, case, hidden_case, param

KATA = Kata("06_constant_folding")


def folded(run: Run) -> dict:
    """The count is what the graph lost and what a correct pass removes; the module's own tensors are intact."""
    written_before = writes_in_place(run.before)
    if lost := Counter(n.target for n in written_before) - Counter(n.target for n in writes_in_place(run.gm)):
        gone = next(n.name for n in written_before if n.target in lost)
        run.fail(f"fold_constants removed `{gone}`, a node that writes into a tensor in place: a write "
                 "is never folded (running it at fold time writes the real tensor) and never erased, even when "
                 "nothing reads its result (graph.eliminate_dead_code() deletes such nodes).",
                 hint="a node writes in place when its name ends in `_` (add_, torch.sqrt_), it has an out= "
                      "argument, or it calls a module built with inplace=True: leave it in the graph, and treat "
                      "what it writes (through views too) as not constant.")
    modules = lambda gm: Counter(n.target for n in gm.graph.nodes if n.op == "call_module")
    if lost := modules(run.before) - modules(run.gm):
        run.fail(f"fold_constants removed the call of module `{next(iter(lost))}` (a call_module node); call_module "
                 "nodes never fold, whatever their inputs: a leaf module is opaque to the pass, and may draw random "
                 "numbers or update state (a BatchNorm in training mode updates its running statistics).")
    old_attributes = {n.target for n in run.before.graph.nodes if n.op == "get_attr"}
    readers = Counter(n.target for n in run.gm.graph.nodes if n.op == "get_attr" and n.target not in old_attributes)
    if shared := [(target, count) for target, count in readers.items() if count > 1]:
        target, count = shared[0]
        run.fail(f"fold_constants reads its stored value `{target}` with {count} get_attr nodes; expected one new "
                 "get_attr node per stored value, each value under a name of its own.",
                 hint="read each folded value with one get_attr node that all of its users read "
                      "(node.replace_all_uses_with(new_get_attr)), and give each stored value a fresh name: a second "
                      "register_buffer under a name replaces the value stored there before.")
    calls = lambda gm: sum(n.op in ("call_function", "call_method", "call_module") for n in gm.graph.nodes)
    copies = [n for n in run.gm.graph.nodes if returned_copy(n, old_attributes)]
    removed = calls(run.before) - calls(run.gm) + len(copies)
    if run.result != removed:
        besides = f" (not counting the {len(copies)} copies of stored values that the output returns)" if copies else ""
        run.fail(f"fold_constants returned {run.result}, but the graph has {removed} fewer call nodes than "
                 f"before{besides}. The count is the number of call_function/call_method nodes removed: count a node "
                 "when you erase it, and erase every folded node that nothing reads any more.", hint="")
    after = dict(run.gm.named_parameters()) | dict(run.gm.named_buffers())
    for name, old in [*run.before.named_parameters(), *run.before.named_buffers()]:
        if name in after and (difference := describe_difference(after[name].detach(), old.detach())):
            run.fail(f"after fold_constants, the module's `{name}` is not what it was before the pass ({difference}): "
                     "a folded value was stored under a name the module already uses, or an in-place op ran at fold "
                     "time.", hint="a stored value needs a fresh name, one that no parameter, buffer, submodule or "
                                   "other attribute of gm has (hasattr(gm, name)); and a node that writes in place "
                                   "(a name ending in `_`, an out= argument) must never run at fold time.")
    if run.result != run.case.expect:
        run.fail(f"fold_constants removed {run.result} call nodes from this model; a correct pass removes "
                 f"{run.case.expect}.")
    return {"folded": run.result}


def returned_copy(node, old_attributes: set[str]) -> bool:
    """A copy (x.clone(), torch.clone(x)) of a value the pass stored, read by the output alone: what a folded constant
    the graph returns as it is becomes, so that each call returns a fresh tensor as the original does. Not
    subtracted from the count: it replaces no computation of the original."""
    is_clone = (node.op == "call_method" and node.target == "clone") or (
        node.op == "call_function" and node.target in (torch.clone, torch.Tensor.clone))
    source = node.args[0] if is_clone and node.args else None
    return (getattr(source, "op", None) == "get_attr" and source.target not in old_attributes
            and all(user.op == "output" for user in node.users))


def writes_in_place(gm: fx.GraphModule) -> list[fx.Node]:
    """The nodes of `gm` that write into a tensor: a name ending in `_`, setitem, inplace=True, out=, or a call of a
    module built with inplace=True (the README's rule; the reference's _written_by)."""
    modules = dict(gm.named_modules())

    def writes(node: fx.Node) -> bool:
        if node.op == "call_module":
            return getattr(modules.get(node.target), "inplace", False) is True
        if node.op not in ("call_function", "call_method"):
            return False
        name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
        return ((name.endswith("_") and not name.endswith("__")) or node.target is operator.setitem
                or node.kwargs.get("inplace") is True or node.kwargs.get("out") is not None)

    return [node for node in gm.graph.nodes if writes(node)]


FOLD = Pass("fold_constants", returns=int, verdict=folded, what="the folded module")


def bit_identical(run: Run) -> None:
    assert_bit_identical(run.pristine, run.gm, run.input_sets(), what=FOLD.label, hint=run.case.hint,
                         graphs=(run.before, run.gm))


def tensors_read(gm, leaving_out: set[str]) -> list[tuple[str, torch.Tensor]]:
    """The tensors `gm`'s graph reads by get_attr, as (target, tensor), but those at the targets `leaving_out`."""
    read = [(node.target, reduce(getattr, node.target.split("."), gm))
            for node in gm.graph.find_nodes(op="get_attr") if node.target not in leaving_out]
    return [(target, value) for target, value in read if isinstance(value, torch.Tensor)]


def plain_tensors_under_autograd(run: Run) -> None:
    """Bit for bit as usual; then every stored value is a plain tensor, and backward runs call after call."""
    bit_identical(run)
    for target, value in tensors_read(run.gm, leaving_out=set(dict(run.gm.named_parameters()))):
        if value.is_inference():
            run.fail(f"fold_constants stored `{target}` as an inference tensor (made under "
                     "torch.inference_mode()), which autograd and in-place ops outside inference mode refuse.")
        if value.requires_grad:
            run.fail(f"fold_constants stored `{target}` as a tensor that requires grad (grad_fn "
                     f"{type(value.grad_fn).__name__}): it was computed with autograd on, and keeps the autograd graph "
                     "back to the parameters alive.")
    for call in (1, 2):  # the first backward frees a stored autograd graph: the second one fails
        try:
            run.gm(run.make_inputs(3)[0].requires_grad_()).sum().backward()
        except Exception as exc:
            run.fail(f"backward through {FOLD.label} raised {describe_exception(exc)} on call {call}; the original's "
                     "backward runs.")


def stored_as_state(run: Run) -> None:
    """Bit for bit as usual; then every value the pass stored is a buffer (or a frozen parameter), so `.to()`,
    `.double()` and `.cuda()` move it with the module."""
    bit_identical(run)
    state = {name for name, _ in [*run.gm.named_parameters(), *run.gm.named_buffers()]}
    for target, _ in tensors_read(run.gm, leaving_out=state):
        run.fail(f"fold_constants stored `{target}` as a plain tensor attribute: `.to(torch.float64)`, "
                 "`.double()` or `.cuda()` move a module's parameters and buffers, not its plain attributes, so "
                 "after `gm.double()` it would stay float32 on its device.",
                 hint="store a folded value with gm.register_buffer(name, value, persistent=False).")
    old = set(dict(run.before.named_parameters()))
    for target, value in tensors_read(run.gm, leaving_out=old | set(dict(run.gm.named_buffers()))):
        if value.requires_grad:  # a new parameter, trainable
            run.fail(f"fold_constants stored `{target}` as a parameter that requires grad: an optimiser built from "
                     "`gm.parameters()` would now train a value derived from the weights, apart from them, and "
                     "backward computes its gradient on every call. The original has no such parameter.",
                     hint="a folded value is a constant: a buffer (gm.register_buffer(name, value, persistent=False)) "
                          "or a frozen parameter (nn.Parameter(value, requires_grad=False)).")


EXACT_CASES["folded_values_are_buffers"] = case(
    lambda: Program(lambda m, x: x @ (m.w * 2).t(), w=param(6, 6)), (6,), 2,
    "a stored value must move with the module (.to(), .double(), .cuda()): a buffer (non-persistent: derived "
    "from the state_dict, not part of it).", compare=stored_as_state)

EXACT_CASES["autograd_after_folding"] = case(
    lambda: Program(lambda m, x: x * m.w.exp() + m.w.sin(), w=param(6)), (6,), 2,
    "evaluate constants under torch.no_grad() (not torch.inference_mode()) and store value.detach(): a stored "
    "value is a plain tensor, so the folded model still runs backward to its input like the original.",
    compare=plain_tensors_under_autograd)

KATA.cases(1, L1_CASES, FOLD)
KATA.cases(2, EXACT_CASES, FOLD)
KATA.speed("causal_attention_speedup", BENCHMARK, FOLD, what="the folded causal attention block",
           hint="the mask, the position table and the scaled weight read no input: all 12 of their call nodes fold.",
           verdict=True)
KATA.hidden(hidden_case, FOLD)
