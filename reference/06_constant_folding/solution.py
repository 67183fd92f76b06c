"""Kata 06, reference solution: fold every subgraph whose inputs are all known before the model runs."""
from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.utils._pytree import tree_leaves, tree_map_only

# The size cap (README, "The size cap"): a node is folded only if its result is at most
# max(SIZE_CAP_BYTES, GROWTH_CAP * bytes of its tensor inputs). Small results always fold; a large
# one folds only when it is not much larger than what it was computed from.
SIZE_CAP_BYTES = 1 << 20
GROWTH_CAP = 4

# Functions and methods that draw from the random-number generator: folding one would freeze a
# single draw, where the model draws afresh on every call. (In-place ones such as uniform_ end in
# "_" and are never folded anyway.)
RANDOM_FUNCTIONS = {
    torch.rand, torch.rand_like, torch.randn, torch.randn_like, torch.randint, torch.randint_like,
    torch.randperm, torch.normal, torch.poisson, torch.bernoulli, torch.multinomial,
    torch.dropout, torch.alpha_dropout, torch.feature_alpha_dropout, torch.rrelu,
    F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout,
    F.rrelu, F.gumbel_softmax,
}
RANDOM_METHODS = {"bernoulli", "multinomial"}

FOLDED_NAME = "_folded_constant"


def _is_call(node: fx.Node) -> bool:
    return node.op in ("call_function", "call_method")


def _name(node: fx.Node) -> str:
    return node.target if node.op == "call_method" else getattr(node.target, "__name__", "")


def _written_by(node: fx.Node) -> list:
    """The arguments `node` writes into: empty for a node that writes nothing in place."""
    if node.op == "call_module":  # a module built with inplace=True (nn.ReLU(inplace=True)) writes its input
        module = node.graph.owning_module.get_submodule(node.target)
        return [node.args[0]] if getattr(module, "inplace", False) is True and node.args else []
    if not _is_call(node):
        return []
    name = _name(node)
    # PyTorch's convention: a trailing underscore means in place (x.add_, x.copy_, torch.relu_).
    in_place = (name.endswith("_") and not name.endswith("__")) or node.target is operator.setitem
    in_place |= node.kwargs.get("inplace") is True
    written = [node.args[0]] if in_place and node.args else []
    if node.kwargs.get("out") is not None:
        written.append(node.kwargs["out"])
    return written


def _mutated_targets(graph: fx.Graph) -> tuple[set[fx.Node], set[str]]:
    """Nodes whose value some node overwrites, and the attribute names behind them.

    A write into a view (`self.buf[0].add_(1)`) changes the tensor it is a view of, so follow first
    arguments back from the written node. This is conservative: it may also mark a tensor that the
    written one was merely computed from, which costs a missed fold, never a wrong one.
    """
    mutated: set[fx.Node] = set()
    stack = [arg for node in graph.nodes for arg in _written_by(node)]
    while stack:
        node = stack.pop()
        if isinstance(node, fx.Node) and node not in mutated:
            mutated.add(node)
            if _is_call(node) and node.args:
                stack.append(node.args[0])
    return mutated, {n.target for n in mutated if n.op == "get_attr"}


def _draws_random_numbers(node: fx.Node) -> bool:
    if node.op == "call_function":
        return node.target in RANDOM_FUNCTIONS
    return node.op == "call_method" and node.target in RANDOM_METHODS


def _fetch_attr(gm: fx.GraphModule, target: str):
    """get_attr targets are dotted paths ('blocks.0.attn.mask'): walk them one name at a time."""
    value = gm
    for name in target.split("."):
        value = getattr(value, name)
    return value


def _nbytes(value) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(value) if isinstance(t, torch.Tensor))


def _evaluate(node: fx.Node, values: dict):
    """`node` run on its inputs' values, as a plain tensor: without autograd (no grad_fn keeping the graph
    back to the parameters alive), and not under torch.inference_mode() (an inference tensor fails later
    autograd or in-place use). Detached, since `self.w.contiguous()` returns the parameter itself."""
    args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: values[n])
    with torch.no_grad():
        if node.op == "call_function":
            value = node.target(*args, **kwargs)
        else:
            value = getattr(args[0], node.target)(*args[1:], **kwargs)
    return tree_map_only(torch.Tensor, torch.Tensor.detach, value)


def _constant_values(gm: fx.GraphModule) -> dict[fx.Node, object]:
    """The value of every node that is known before the model runs, evaluated once, in graph order."""
    mutated, mutated_targets = _mutated_targets(gm.graph)
    values: dict[fx.Node, object] = {}
    for node in gm.graph.nodes:
        if node in mutated:
            continue
        if node.op == "get_attr" and node.target not in mutated_targets:
            values[node] = _fetch_attr(gm, node.target)
        elif _is_call(node) and not _draws_random_numbers(node) and not _written_by(node):
            # Placeholders (even one with a default: the caller may pass another value) and call_module
            # nodes never enter `values`, so whatever reads one stays.
            if all(n in values for n in node.all_input_nodes):
                value = _evaluate(node, values)
                inputs_bytes = sum(_nbytes(values[n]) for n in node.all_input_nodes)
                if _nbytes(value) <= max(SIZE_CAP_BYTES, GROWTH_CAP * inputs_bytes):
                    values[node] = value
    return values


def _fresh_name(gm: fx.GraphModule, taken: set[str]) -> str:
    index = 0
    while f"{FOLDED_NAME}_{index}" in taken or hasattr(gm, f"{FOLDED_NAME}_{index}"):
        index += 1
    taken.add(f"{FOLDED_NAME}_{index}")
    return f"{FOLDED_NAME}_{index}"


def fold_constants(gm: fx.GraphModule) -> int:
    """Replace every constant subgraph of `gm` by one get_attr of its precomputed value (and, where the output
    returns it as it is, a copy of it made at every call).

    Returns the number of call_function and call_method nodes folded away (the copies are not subtracted).
    """
    graph = gm.graph
    values = _constant_values(gm)

    # Walk backwards, so that every user of a node is decided before the node itself: a constant
    # is needed when a node that stays reads it.
    needed: set[fx.Node] = set()
    kept: set[fx.Node] = set()          # constant nodes that stay as they are
    to_store: list[fx.Node] = []        # constant tensors that become one get_attr each
    for node in reversed(graph.nodes):
        if node in values and node not in needed:
            continue                    # only other constants read it: it goes
        if node in values and isinstance(values[node], torch.Tensor) and node.op != "get_attr":
            to_store.append(node)
            continue
        # A runtime node, a get_attr, or a constant that is no tensor (a shape, a device, a tuple):
        # it stays, and so must the constants it reads.
        if node in values:
            kept.add(node)
        needed.update(n for n in node.all_input_nodes if n in values)

    taken: set[str] = set()
    for node in to_store:
        name = _fresh_name(gm, taken)
        # Not persistent: the folded value is derived from the state_dict, not part of it.
        gm.register_buffer(name, values[node], persistent=False)
        with graph.inserting_before(node):
            stored = graph.get_attr(name)
            node.replace_all_uses_with(stored)
        # The output returns a copy made at every call, as the original returns a fresh tensor: the stored value
        # itself would hand every caller the module's memory, and a caller writing into its result would change
        # what every later call returns. One copy, shared by the output wherever it returns the value.
        for output in [user for user in stored.users if user.op == "output"]:
            with graph.inserting_before(output):
                output.replace_input_with(stored, graph.call_method("clone", (stored,)))

    folded = 0
    for node in reversed(graph.nodes):
        if node in values and node not in kept:
            folded += _is_call(node)
            graph.erase_node(node)
    graph.lint()
    gm.recompile()
    return folded
