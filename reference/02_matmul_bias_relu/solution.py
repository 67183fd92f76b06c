"""Kata 02, reference solution: fuse matmul + bias + ReLU declaratively, with torch.fx.subgraph_rewriter."""
from __future__ import annotations

import itertools
import operator

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.fx import subgraph_rewriter


def pattern(x, w, b):
    """The canonical spelling of the site: relu(x @ w + b)."""
    return F.relu(x @ w + b)


def replacement(x, w, b):
    """The fused form: the bias add and the ReLU work in the product's own buffer.

    The product is a fresh tensor, and the matcher only accepts a match whose inner nodes (the product
    and the sum) have no user outside the match, so nobody else can see the buffer being overwritten.
    torch.matmul, not torch.addmm: addmm multiplies 2-D matrices only, and x may be batched. The in-place
    add is exact only where the sum has the product's shape and dtype: `epilogue_is_exact` admits those.
    """
    return torch.matmul(x, w).add_(b).relu_()


# The matcher compares call targets by identity and arguments position by position, literals and
# keyword arguments included. Each spelling of each step is therefore a pattern of its own.
MATMULS = [operator.matmul, torch.matmul, torch.mm]  # x @ w traces to operator.matmul
BIAS_ADDS = [
    lambda p, b: p + b,
    lambda p, b: b + p,  # no commutativity: the commuted add is another pattern
    lambda p, b: torch.add(p, b),
    lambda p, b: torch.add(b, p),
]
RELUS = [
    F.relu,  # traced as relu(y, inplace=False): the keyword is part of the pattern
    lambda y: F.relu(y, inplace=True),
    torch.relu,
    lambda y: y.relu(),  # a call_method node, not a call_function
]


def _known(gm: fx.GraphModule, arg):
    """What the graph knows of a matched argument: a Python number as itself; a tensor (a parameter or buffer
    read by get_attr, or a node with shape metadata from ShapeProp or make_fx) as a meta tensor of its shape
    and dtype; None when the graph does not know (a placeholder of a plain symbolic_trace)."""
    if isinstance(arg, (bool, int, float)):
        return arg
    if not isinstance(arg, fx.Node):
        return None
    if arg.op == "get_attr":
        value = operator.attrgetter(arg.target)(gm)
    else:
        value = arg.meta.get("val", arg.meta.get("tensor_meta"))
    if not (isinstance(value, torch.Tensor) or hasattr(value, "shape") and hasattr(value, "dtype")):
        return None
    try:
        return torch.empty(tuple(value.shape), dtype=value.dtype, device="meta")
    except (TypeError, RuntimeError):  # a symbolic size (make_fx with dynamic shapes): not known here
        return None


def epilogue_is_exact(match, original_graph: fx.Graph, pattern_graph: fx.Graph) -> bool:
    """A match filter (replace_pattern_with_filters), as Inductor's pattern matcher checks a match's shapes and
    dtypes in an extra_check: `p.add_(b)` computes what `p + b` does only when the sum keeps the product's shape
    (b broadcasts into p without growing it) and dtype (b does not promote it: float32 + float64 is float64,
    which add_ would silently round back to float32). Where the graph does not know enough, leave the site."""
    x, w, b = (_known(original_graph.owning_module, arg) for arg in match.placeholder_nodes)
    if not isinstance(w, torch.Tensor) or w.dim() < 2 or b is None:
        return False
    try:
        if isinstance(x, torch.Tensor):
            product = torch.matmul(x, w)  # on the meta device: shapes and dtypes only
        elif isinstance(b, torch.Tensor) and b.dim() > 1:
            return False  # x's shape is unknown: only a bias of one dimension surely aligns with the product's last
        else:
            product = torch.empty(w.shape[-1:], dtype=w.dtype, device="meta")  # the product's last dimension
        return (torch.broadcast_shapes(product.shape, getattr(b, "shape", ())) == product.shape
                and torch.result_type(product, b) == product.dtype)
    except RuntimeError:  # shapes that do not multiply or broadcast: the original raises; leave it so
        return False


def spelled_pattern(matmul, bias_add, relu):
    def spelling(x, w, b):
        return relu(bias_add(matmul(x, w), b))

    return spelling


PATTERNS = [spelled_pattern(*steps) for steps in itertools.product(MATMULS, BIAS_ADDS, RELUS)]
# replace_pattern traces a pattern or replacement given as a function on every call: 48 patterns, two traces
# each, on every model. Traced once here, they are matched as the graphs they are.
TRACED_PATTERNS, TRACED_REPLACEMENT = [fx.symbolic_trace(p) for p in PATTERNS], fx.symbolic_trace(replacement)


def calls(graph: fx.Graph) -> set:
    """The (op, target) of every call in a graph: a pattern matches nowhere in a graph that lacks one of its own."""
    return {(node.op, node.target) for node in graph.nodes if node.op in ("call_function", "call_method")}


def fuse_matmul_bias_relu(gm: fx.GraphModule) -> int:
    """Rewrite every matmul + bias + ReLU site of gm in place; return how many sites were rewritten."""
    rewritten = 0
    for spelling in TRACED_PATTERNS:
        # Only the patterns whose every call occurs in the graph can match, as Inductor's pattern matcher looks its
        # patterns up by the op a node calls. Tried anyway, each would still recompile gm: 48 recompiles per call.
        if not calls(spelling.graph) <= calls(gm.graph):
            continue
        # replace_pattern_with_filters edits gm.graph in place and recompiles gm; it returns one match per site
        # rewritten, those every filter admitted.
        rewritten += len(subgraph_rewriter.replace_pattern_with_filters(gm, spelling, TRACED_REPLACEMENT,
                                                                        [epilogue_is_exact]))
    return rewritten
