"""Kata 07, reference solution: algebraic simplification that never changes a single bit of a result."""
from __future__ import annotations

import math
import operator

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from torch.fx.passes.shape_prop import ShapeProp

# Every spelling of an operation, by the name the rule table uses.
FUNCTIONS = {
    operator.mul: "mul", torch.mul: "mul",
    operator.truediv: "div", torch.div: "div", torch.true_divide: "div",
    operator.add: "add", torch.add: "add",
    operator.sub: "sub", torch.sub: "sub",
    operator.pow: "pow", torch.pow: "pow",
    torch.relu: "relu", F.relu: "relu",
    torch.permute: "permute", torch.transpose: "transpose", torch.t: "t",
    torch.ones: "ones", torch.ones_like: "ones",
    torch.zeros: "zeros", torch.zeros_like: "zeros",
}
METHODS = {"mul": "mul", "div": "div", "true_divide": "div", "add": "add", "sub": "sub", "pow": "pow",
           "relu": "relu", "permute": "permute", "transpose": "transpose", "t": "t"}
MODULES = {nn.ReLU: "relu"}


def op_kind(node, modules: dict) -> str | None:
    if not isinstance(node, fx.Node):
        return None
    if node.op == "call_function":
        return FUNCTIONS.get(node.target)
    if node.op == "call_method":
        return METHODS.get(node.target)
    if node.op == "call_module":
        return MODULES.get(type(modules.get(node.target)))
    return None  # a get_attr is state (a parameter, a buffer): never a literal, whatever its value


def is_literal_number(value) -> bool:
    return type(value) in (bool, int, float)


def is_one(value, modules) -> bool:
    return (is_literal_number(value) and value == 1) or op_kind(value, modules) == "ones"


def is_positive_zero(value, modules) -> bool:
    literal = is_literal_number(value) and value == 0 and math.copysign(1.0, value) > 0
    return literal or op_kind(value, modules) == "zeros"


def is_negative_zero(value) -> bool:
    return type(value) is float and value == 0 and math.copysign(1.0, value) < 0


def meta(node):
    return node.meta.get("tensor_meta") if isinstance(node, fx.Node) else None


def is_float(node) -> bool:
    return meta(node).dtype.is_floating_point or meta(node).dtype.is_complex


def is_complex(node) -> bool:
    return meta(node) is None or meta(node).dtype.is_complex  # unknown: it may be


def identity_operand(node: fx.Node, modules: dict):
    """The operand that `node` returns unchanged by the rule table, or None.

    Whether the shape and dtype also stay the same is checked afterwards, from the metadata.
    """
    kind = op_kind(node, modules)
    if kind not in ("mul", "div", "add", "sub") or len(node.args) != 2 or node.kwargs:
        return None  # kwargs such as rounding_mode="floor" or alpha=2 change what the op computes
    a, b = node.args
    if kind in ("mul", "div") and any(isinstance(v, fx.Node) and is_complex(v) for v in (a, b)):
        return None  # complex * 1 multiplies by 1+0j: inf+0j becomes inf+nanj, -0.0 a real part 0.0
    if kind == "mul":
        return a if is_one(b, modules) else b if is_one(a, modules) else None
    if kind == "div":
        return a if is_one(b, modules) else None
    if kind == "sub":
        # x - (+0) = x for every x; but x - (-0.0) = x + 0.0, which turns -0.0 into +0.0.
        return a if is_positive_zero(b, modules) else None
    # add. x + (-0.0) = x for every x (-0.0 + -0.0 = -0.0). x + (+0) is exact only for integers:
    # for floats, -0.0 + 0 = +0.0.
    for x, zero in ((a, b), (b, a)):
        if isinstance(x, fx.Node) and (is_negative_zero(zero) or
                                       (is_positive_zero(zero, modules) and meta(x) and not is_float(x))):
            return x
    return None


def permutation(node: fx.Node, rank: int, modules: dict) -> list[int] | None:
    """Which input dimension each output dimension of a permute/transpose/t reads, or None."""
    kind = op_kind(node, modules)
    if node.kwargs or kind not in ("permute", "transpose", "t"):
        return None
    if kind == "permute":
        dims = node.args[1:]
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = dims[0]
    elif kind == "transpose":
        dims = list(range(rank))
        if len(node.args) != 3:
            return None
        a, b = node.args[1:]
        if not (type(a) is int and type(b) is int):
            return None
        dims[a], dims[b] = dims[b], dims[a]  # negative dims index from the end, as in the op
    else:
        dims = list(reversed(range(rank)))
    if len(dims) != rank or not all(type(d) is int for d in dims):
        return None
    return [d % rank for d in dims]  # -1 and rank-1 are the same dimension


def cancelling_permutes(node: fx.Node, modules: dict):
    """x when `node` is a permute of a permute of x that composes to the identity, else None."""
    inner = node.args[0] if node.args else None
    if op_kind(node, modules) not in ("permute", "transpose", "t") or op_kind(inner, modules) is None:
        return None
    x = inner.args[0]
    if meta(x) is None:
        return None
    rank = len(meta(x).shape)
    p, q = permutation(inner, rank, modules), permutation(node, rank, modules)
    if p is None or q is None:
        return None
    # Output dim i of `node` is dim q[i] of `inner`, which is dim p[q[i]] of x.
    return x if all(p[q[i]] == i for i in range(rank)) else None


def relu_of_relu(node: fx.Node, modules: dict):
    inner = node.args[0] if node.args else None
    if op_kind(node, modules) == "relu" and op_kind(inner, modules) == "relu":
        return inner  # relu is idempotent: relu(relu(x)) = relu(x), NaN and -0.0 included
    return None


def is_in_place(node: fx.Node, modules: dict) -> bool:
    if node.op == "call_method":
        return node.target.endswith("_") and not node.target.endswith("__")
    if node.op == "call_function":
        return getattr(node.target, "__name__", "").endswith("_") or node.kwargs.get("inplace") is True
    if node.op == "call_module":
        return getattr(modules.get(node.target), "inplace", False) is True
    return False


# Ops whose result may share memory with their first argument (a view, or the tensor itself when there is
# nothing to do: contiguous() of a contiguous tensor, float() of a float32 one): a write through it writes that.
VIEW_OPS = {
    "view", "view_as", "reshape", "reshape_as", "getitem", "t", "transpose", "permute", "expand", "expand_as",
    "narrow", "select", "squeeze", "unsqueeze", "flatten", "unflatten", "unfold", "diagonal", "as_strided",
    "movedim", "swapaxes", "swapdims", "split", "chunk", "unbind", "tensor_split", "real", "imag", "view_as_real",
    "view_as_complex", "detach", "contiguous", "to", "type", "type_as", "float", "double", "half", "bfloat16",
    "int", "long", "short", "bool", "cpu", "cuda",
}


def _name(node: fx.Node) -> str:
    return node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")


def writes_into(user: fx.Node, value: fx.Node) -> bool:
    """A call that writes its result into `value`, given as its out= tensor: torch.mul(a, 2, out=y) writes y."""
    out = user.kwargs.get("out")
    return out is value or isinstance(out, (tuple, list)) and any(o is value for o in out)


def written_through(node: fx.Node, modules: dict, skip: fx.Node | None = None) -> bool:
    """Whether an in-place op uses `node`'s tensor, or a call writes into it (out=): directly, or through a view of
    it, or a view of a view (`y.view(-1)[:2].add_(1)` writes y). `skip`: a user that is not asked about (the node
    being replaced)."""
    seen, reached = set(), [node]
    while reached:
        value = reached.pop()
        for user in value.users:
            if user is skip or user in seen:
                continue
            seen.add(user)
            if is_in_place(user, modules) or writes_into(user, value):
                return True
            if user.op in ("call_function", "call_method") and _name(user) in VIEW_OPS and user.args \
                    and user.args[0] is value:
                reached.append(user)
    return False


def aliasing_is_safe(node: fx.Node, replacement: fx.Node, modules: dict) -> bool:
    """After the rewrite, node's users and replacement's users read one tensor: nobody may write it, whatever
    view the write goes through."""
    return not written_through(node, modules) and not written_through(replacement, modules, skip=node)


def same_tensor_type(node: fx.Node, replacement) -> bool:
    """Shape and dtype unchanged: broadcasting and type promotion are the traps here."""
    before, after = meta(node), meta(replacement)
    return before is not None and after is not None and before.shape == after.shape and before.dtype == after.dtype


def erase_if_dead(node, graph: fx.Graph) -> None:
    """Erase a node our rewrite left without users, then its inputs that become dead in turn."""
    if not isinstance(node, fx.Node) or node.users or node.op in ("placeholder", "output") or node.is_impure():
        return
    inputs = node.all_input_nodes
    graph.erase_node(node)
    for input_node in inputs:
        erase_if_dead(input_node, graph)


def simplify(gm: fx.GraphModule, example_inputs: tuple) -> int:
    """Apply the README's rule table wherever it is exact; return the number of rewrites applied."""
    # Shapes and dtypes of every node for inputs like these. Clones: the model may mutate its inputs.
    ShapeProp(gm).propagate(*(t.clone() if isinstance(t, torch.Tensor) else t for t in example_inputs))
    modules = dict(gm.named_modules())
    graph, rewrites = gm.graph, 0
    # One forward sweep reaches the fixed point: a rewrite only changes what later nodes read.
    for node in list(graph.nodes):
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        if (op_kind(node, modules) == "pow" and len(node.args) == 2 and not node.kwargs
                and node.args[1] in (2, 2.0) and is_literal_number(node.args[1]) and meta(node.args[0])
                and meta(node.args[0]).dtype == meta(node).dtype):  # int ** 2.0 is a float
            x = node.args[0]
            with graph.inserting_before(node):
                square = graph.call_function(operator.mul, (x, x))
            square.meta = dict(node.meta)
            node.replace_all_uses_with(square)
            graph.erase_node(node)
            rewrites += 1
            continue
        replacement = (identity_operand(node, modules) or relu_of_relu(node, modules)
                       or cancelling_permutes(node, modules))
        if replacement is None or not same_tensor_type(node, replacement):
            continue
        if not aliasing_is_safe(node, replacement, modules):
            continue
        inputs = node.all_input_nodes
        node.replace_all_uses_with(replacement)
        graph.erase_node(node)
        for input_node in inputs:
            erase_if_dead(input_node, graph)  # a torch.ones_like(x), the inner permute of a pair
        rewrites += 1
    graph.lint()
    gm.recompile()
    return rewrites
