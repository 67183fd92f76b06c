"""Kata 08, reference solution: find chains of elementwise ops and fuse each into one node."""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from torch.fx.node import map_aggregate, map_arg

# Every spelling of the ten elementwise ops this kata recognises, mapped to the op's kind.
FUNCTION_KINDS = {
    operator.add: "add", torch.add: "add",
    operator.sub: "sub", torch.sub: "sub",
    operator.mul: "mul", torch.mul: "mul",
    operator.truediv: "div", torch.div: "div",
    operator.neg: "neg", torch.neg: "neg",
    operator.abs: "abs", torch.abs: "abs",
    torch.exp: "exp",
    torch.relu: "relu", F.relu: "relu",
    torch.sigmoid: "sigmoid",
    torch.tanh: "tanh",
}
METHOD_KINDS = {name: name for name in ("add", "sub", "mul", "div", "neg", "abs", "exp", "relu", "sigmoid", "tanh")}
MODULE_KINDS = {nn.ReLU: "relu", nn.Sigmoid: "sigmoid", nn.Tanh: "tanh"}

UNARY_KINDS = {"neg", "abs", "exp", "relu", "sigmoid", "tanh"}
FLOAT_RESULT_KINDS = {"exp", "sigmoid", "tanh"}  # an integer input gives a floating-point result
# The binary ops as torch functions: each accepts out=, with the operands in either order.
BINARY_FUNCTIONS = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}


def elementwise_kind(node: fx.Node, modules: dict[str, nn.Module]) -> str | None:
    """The kind ('add', 'relu', ...) of an out-of-place elementwise node, or None for anything else."""
    if "out" in node.kwargs or node.kwargs.get("inplace", False):
        return None  # writes into an existing tensor: other holders of that tensor would see it change
    if node.op == "call_function":
        return FUNCTION_KINDS.get(node.target)
    if node.op == "call_method":
        return METHOD_KINDS.get(node.target)
    if node.op == "call_module":
        module = modules.get(node.target)
        # type(...), not isinstance: a subclass may override forward.
        if type(module) in MODULE_KINDS and not getattr(module, "inplace", False):
            return MODULE_KINDS[type(module)]
    return None


def find_elementwise_chains(gm: fx.GraphModule) -> list[list[fx.Node]]:
    """The maximal chains of two or more elementwise nodes, in graph order (README: "What a chain is")."""
    modules = dict(gm.named_modules())
    elementwise = {node for node in gm.graph.nodes if elementwise_kind(node, modules)}
    successor: dict[fx.Node, fx.Node] = {}
    for node in gm.graph.nodes:
        if node not in elementwise:
            continue
        for source in node.all_input_nodes:
            # Its only user is `node` (the output node counts as a user): nothing else needs its value,
            # so it can live inside the fused node. The first such input continues the chain.
            if source in elementwise and len(source.users) == 1:
                successor[source] = node
                break
    has_predecessor = set(successor.values())
    chains = []
    for node in gm.graph.nodes:  # heads in graph order, so the chains come out in topological order
        if node in successor and node not in has_predecessor:
            chain = [node]
            while chain[-1] in successor:
                chain.append(successor[chain[-1]])
            chains.append(chain)
    return chains


class _ChainValue:
    """Marks where a step reads the value computed by the step before it."""

    def __repr__(self) -> str:
        return "<chain value>"


CHAIN_VALUE = _ChainValue()


@dataclass(frozen=True)
class _Input:
    index: int  # position among the fused node's arguments


@dataclass
class Step:
    kind: str
    call: Callable  # the original op: used where the step cannot run in place
    args: Any       # the node's args and kwargs with nodes replaced by CHAIN_VALUE or _Input(i)
    kwargs: Any


def _fits_in_place(step: Step, value, args, kwargs) -> bool:
    """Can this step overwrite `value` with its result: same shape, same dtype, no autograd?"""
    grad = torch.is_grad_enabled()
    if not isinstance(value, torch.Tensor) or (grad and value.requires_grad):
        return False
    if step.kind in UNARY_KINDS:
        return step.kind not in FLOAT_RESULT_KINDS or value.is_floating_point()
    operands = list(args[:2]) + [kwargs[k] for k in ("input", "other") if k in kwargs]
    if len(operands) != 2:
        return False
    for operand in operands:
        if isinstance(operand, torch.Tensor) and operand is not value:
            if grad and operand.requires_grad:
                return False
            if torch.broadcast_shapes(operand.shape, value.shape) != value.shape:
                return False  # the result is larger than the buffer: broadcasting grows the value
    dtype = torch.result_type(*operands)
    if step.kind == "div" and kwargs.get("rounding_mode") is None and not dtype.is_floating_point:
        return False  # true division of integers gives floats
    return dtype == value.dtype


class FusedElementwiseChain(nn.Module):
    """Runs a chain in one buffer: the head allocates it, every later step overwrites it in place.

    An unfused n-op chain writes n fresh tensors and reads about n; this writes one, so it moves about
    2 tensors' worth of memory instead of 2n (README: "Why this pass exists").
    """

    def __init__(self, steps: list[Step]):
        super().__init__()
        self.steps = steps

    def forward(self, *inputs):
        value = None
        for index, step in enumerate(self.steps):
            bind = lambda a: value if a is CHAIN_VALUE else inputs[a.index] if isinstance(a, _Input) else a  # noqa: E731
            args, kwargs = map_aggregate(step.args, bind), map_aggregate(step.kwargs, bind)
            if index > 0 and _fits_in_place(step, value, args, kwargs):
                if step.kind in UNARY_KINDS:
                    value = getattr(value, step.kind + "_")()
                else:
                    value = BINARY_FUNCTIONS[step.kind](*args, **kwargs, out=value)
            else:
                value = step.call(*args, **kwargs)
        return value

    def extra_repr(self) -> str:
        return " -> ".join(step.kind for step in self.steps)


@dataclass(frozen=True)
class _Method:
    name: str

    def __call__(self, tensor, *args, **kwargs):
        return getattr(tensor, self.name)(*args, **kwargs)


def _original_call(node: fx.Node, modules: dict[str, nn.Module]) -> Callable:
    if node.op == "call_function":
        return node.target
    if node.op == "call_method":
        return _Method(node.target)
    return modules[node.target]


def fuse_elementwise_chains(gm: fx.GraphModule) -> int:
    """Replace every chain of find_elementwise_chains(gm) by one call_module node; return how many."""
    modules = dict(gm.named_modules())
    chains = find_elementwise_chains(gm)
    for number, chain in enumerate(chains):
        members = set(chain)
        inputs = list(dict.fromkeys(i for node in chain for i in node.all_input_nodes if i not in members))
        steps = []
        for position, node in enumerate(chain):
            previous = chain[position - 1] if position else None
            to_template = lambda n: CHAIN_VALUE if n is previous else _Input(inputs.index(n))  # noqa: E731
            steps.append(Step(elementwise_kind(node, modules), _original_call(node, modules),
                              map_arg(node.args, to_template), map_arg(node.kwargs, to_template)))
        name = f"fused_chain_{number}"
        while hasattr(gm, name):
            name += "_"
        gm.add_submodule(name, FusedElementwiseChain(steps))
        modules[name] = gm.get_submodule(name)
        tail = chain[-1]
        # At the tail: every operand of every step is computed before the tail, not always before the head.
        with gm.graph.inserting_before(tail):
            fused = gm.graph.call_module(name, tuple(inputs))
        tail.replace_all_uses_with(fused)
        for node in reversed(chain):
            gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    return len(chains)
