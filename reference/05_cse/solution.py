"""Kata 05, reference solution: common-subexpression elimination on a torch.fx graph."""
from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.nn as nn

# Ops that draw from the random generator: two calls give two different results.
RANDOM_OPS = {
    "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm", "normal", "bernoulli",
    "multinomial", "poisson", "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
    "feature_alpha_dropout", "rrelu", "gumbel_softmax",
}

# Ops whose result may share memory with their first argument: a write through the result is a write
# to the argument, and the other way round. Views, and ops that return their input itself when there is
# nothing to do (`contiguous()` of a contiguous tensor, `float()` of a float32 one, `to(its own dtype)`).
VIEW_OPS = {
    "view", "view_as", "reshape", "reshape_as", "transpose", "t", "permute", "squeeze", "unsqueeze", "expand",
    "expand_as", "narrow", "select", "unfold", "flatten", "unflatten", "contiguous", "detach", "as_strided",
    "split", "chunk", "unbind", "movedim", "swapaxes", "swapdims", "diagonal", "getitem", "getattr", "real",
    "imag", "view_as_real", "view_as_complex", "tensor_split", "type_as", "to", "type", "float", "double",
    "half", "bfloat16", "int", "long", "short", "char", "byte", "bool", "cfloat", "cdouble", "cpu", "cuda",
}

INPLACE_OPERATORS = {
    operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv, operator.imod,
    operator.ipow, operator.imatmul, operator.iand, operator.ior, operator.ixor, operator.ilshift,
    operator.irshift, operator.setitem,
}

# Leaf modules whose output depends on nothing but their input and parameters, and that change nothing.
PURE_MODULES = (
    nn.Linear, nn.Bilinear, nn.Identity, nn.Flatten, nn.Unflatten, nn.Embedding, nn.modules.conv._ConvNd,
    nn.modules.pooling._MaxPoolNd, nn.modules.pooling._AvgPoolNd, nn.modules.pooling._AdaptiveAvgPoolNd,
    nn.modules.pooling._AdaptiveMaxPoolNd, nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._NormBase,
    nn.modules.dropout._DropoutNd, nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU,
    nn.Mish, nn.Sigmoid, nn.Tanh, nn.Hardtanh, nn.Hardsigmoid, nn.Hardswish, nn.Softplus, nn.Softsign,
    nn.Softmax, nn.LogSoftmax, nn.PReLU,
)

_PLAIN_CONSTANTS = (bool, int, str, type(None), type(Ellipsis), torch.dtype, torch.device, torch.layout,
                    torch.memory_format)


class _Unmergeable(Exception):
    """An argument the pass cannot compare safely: the node is left alone."""


def _op_name(node: fx.Node) -> str:
    return node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")


def _is_inplace_name(name: str) -> bool:
    return name.endswith("_") and not name.endswith("__")


def _written_arguments(node: fx.Node, modules: dict) -> list:
    """The arguments `node` writes to: its first argument for an in-place op, and any out= tensor."""
    if node.op == "call_module":
        inplace = getattr(modules[node.target], "inplace", False) is True
    elif node.op == "call_method":
        inplace = _is_inplace_name(node.target)
    elif node.op == "call_function":
        # torch.nn.functional records every argument after the input by keyword: F.relu(x, inplace=True)
        inplace = (node.target in INPLACE_OPERATORS or _is_inplace_name(_op_name(node))
                   or node.kwargs.get("inplace") is True)
    else:
        return []
    written = [node.args[0]] if inplace and node.args else []
    if node.kwargs.get("out") is not None:
        written.append(node.kwargs["out"])
    return written


def _may_alias_input(node: fx.Node, modules: dict) -> fx.Node | None:
    """The input whose memory `node`'s result may share (views and in-place ops return it)."""
    if node.op in ("call_function", "call_method", "call_module") and node.args:
        if _op_name(node) in VIEW_OPS or _written_arguments(node, modules):
            first = node.args[0]
            return first if isinstance(first, fx.Node) else None
    return None


def _mutated_nodes(graph: fx.Graph, modules: dict) -> set[fx.Node]:
    """Every node whose value some in-place op changes, directly or through a view or an alias."""
    mutated = set()
    for node in graph.nodes:
        written: list[fx.Node] = []
        fx.node.map_arg(_written_arguments(node, modules), written.append)  # out= may be a tuple
        for arg in written:
            while isinstance(arg, fx.Node) and arg not in mutated:
                mutated.add(arg)
                arg = _may_alias_input(arg, modules)
    return mutated


def _returned_storage(graph: fx.Graph, modules: dict) -> set[fx.Node]:
    """Every node whose result may share memory with a tensor the graph returns: the returned nodes, views
    of them, and what they are views of. Merging two of these hands the caller one tensor twice, where eager
    PyTorch gave two: an in-place op on one output would change the other. AOTAutograd's CSE
    (torch/_functorch/compile_utils.py, fx_graph_cse) leaves such nodes alone; so does this pass."""
    aliases: dict[fx.Node, set[fx.Node]] = {}  # node -> the nodes that may share its memory (shared sets)
    for node in graph.nodes:
        linked: list[fx.Node] = []
        fx.node.map_arg([_may_alias_input(node, modules), *_written_arguments(node, modules)], linked.append)
        group = {node}.union(*(aliases.get(other, {other}) for other in linked))
        for member in group:
            aliases[member] = group
    return set().union(*(aliases.get(n, {n}) for n in graph.output_node().all_input_nodes))


def _is_pure(node: fx.Node, modules: dict) -> bool:
    if node.op == "call_module":
        module = modules[node.target]
        if isinstance(module, (nn.modules.dropout._DropoutNd, nn.RReLU)):
            return not module.training  # random in training mode
        if isinstance(module, nn.modules.batchnorm._NormBase) and module.training and module.track_running_stats:
            return False  # each call updates the running statistics
        return isinstance(module, PURE_MODULES)
    return _op_name(node) not in RANDOM_OPS


def _constant_key(arg):
    """A hashable key that is equal only for arguments that are interchangeable.

    `1 == 1.0 == True` and `0.0 == -0.0`, all with equal hashes, yet `x + 1` is an integer tensor for an
    integer x and `x + 1.0` a float one: so the key carries the type, and floats compare by repr.
    """
    if isinstance(arg, fx.Node):
        return arg  # nodes compare by identity
    if isinstance(arg, (float, complex)):
        return (type(arg), repr(arg))
    if isinstance(arg, _PLAIN_CONSTANTS):
        return (type(arg), arg)
    if isinstance(arg, (tuple, list)):  # fx stores lists as immutable_list; keep list and tuple apart
        return (tuple if isinstance(arg, tuple) else list, tuple(_constant_key(a) for a in arg))
    if isinstance(arg, dict):
        return (dict, tuple(sorted((k, _constant_key(v)) for k, v in arg.items())))
    if isinstance(arg, slice):  # unhashable before Python 3.12
        return (slice, _constant_key(arg.start), _constant_key(arg.stop), _constant_key(arg.step))
    if isinstance(arg, torch.Tensor):
        return (torch.Tensor, id(arg))  # only the very same tensor; == on tensors is elementwise
    raise _Unmergeable(type(arg).__name__)


def _node_key(node: fx.Node):
    return (node.op, node.target, _constant_key(node.args), _constant_key(dict(node.kwargs)))


def eliminate_common_subexpressions(gm: fx.GraphModule) -> int:
    """Merge every call node into an earlier identical one where that cannot change the result.

    Returns how many nodes were merged away (each merge erases one node).
    """
    graph = gm.graph
    modules = dict(gm.named_modules())
    mutated = _mutated_nodes(graph, modules)
    returned = _returned_storage(graph, modules)
    available: dict[object, fx.Node] = {}
    merged = 0
    for node in list(graph.nodes):
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        if _written_arguments(node, modules):
            # A write: never merged itself (two `x.add_(1)` add 2), and every value computed so far may
            # have read the tensor it changes, so nothing before it can stand in for anything after it.
            available.clear()
            continue
        if node in mutated or node in returned or not _is_pure(node, modules):
            continue
        try:
            key = _node_key(node)
        except _Unmergeable:
            continue
        first = available.setdefault(key, node)
        if first is not node:
            # Replacing at once makes the users' keys name `first`, so chains merge in this same pass.
            node.replace_all_uses_with(first)
            graph.erase_node(node)
            merged += 1
    graph.lint()
    gm.recompile()
    return merged
