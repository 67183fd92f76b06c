"""Kata 09, reference solution: replace hand-written tanh-GELUs with one F.gelu(x, approximate="tanh")."""
from __future__ import annotations

import math
import operator
from itertools import permutations

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

HALF, ONE, CUBIC = 0.5, 1.0, 0.044715
SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
# Wide enough for 0.7978845608 and the constant's float32 value (2.8e-8 apart), narrow enough to
# reject 0.8 or 0.0447: a GELU with other constants is another function.
CONSTANT_RTOL = 1e-5

MUL = {operator.mul, torch.mul, "mul"}
ADD = {operator.add, torch.add, "add"}
POW = {operator.pow, torch.pow, "pow"}
TANH = {torch.tanh, "tanh"}  # F.tanh traces as the method


def _calls(node, kinds: set) -> bool:
    """Is `node` a call_function or call_method of one of `kinds` (functions, or method names)?"""
    return isinstance(node, fx.Node) and node.op in ("call_function", "call_method") and node.target in kinds


def _binary_operands(node, kinds: set) -> tuple | None:
    """(a, b) of `a op b`; None for anything else, torch.add(a, b, alpha=2) included."""
    if _calls(node, kinds) and len(node.args) == 2 and not node.kwargs:
        return node.args
    return None


def _both_orders(node, kinds: set) -> list[tuple]:
    """[(a, b), (b, a)] for `a op b`, so every match tries the commuted spelling too; [] otherwise."""
    operands = _binary_operands(node, kinds)
    return [] if operands is None else [operands, operands[::-1]]


def _is_constant(value, expected: float) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isclose(value, expected, rel_tol=CONSTANT_RTOL))


def _tanh_argument(node, modules: dict):
    """The argument of tanh(arg) spelled torch.tanh, x.tanh() or an nn.Tanh module; else None."""
    if not isinstance(node, fx.Node) or len(node.args) != 1 or node.kwargs:
        return None
    if _calls(node, TANH) or (node.op == "call_module" and isinstance(modules.get(node.target), nn.Tanh)):
        return node.args[0]
    return None


def _match_cube(node, x) -> list[fx.Node] | None:
    """The nodes of x**3 spelled pow(x, 3) or x*x*x in either association; None if `node` is not one."""
    operands = _binary_operands(node, POW)
    if operands is not None:
        return [node] if operands[0] is x and operands[1] in (3, 3.0) else None
    for square, single in _both_orders(node, MUL):
        if single is x and _binary_operands(square, MUL) == (x, x):
            return [node, square]
    return None


def _match_tanh_part(one_plus, modules: dict) -> tuple[fx.Node, list[fx.Node]] | None:
    """(x, nodes) if `one_plus` is 1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)), in any operand order."""
    for one, tanh in _both_orders(one_plus, ADD):
        argument = _tanh_argument(tanh, modules)
        if not _is_constant(one, ONE) or argument is None:
            continue
        for scale, inner_sum in _both_orders(argument, MUL):
            if not _is_constant(scale, SQRT_2_OVER_PI):
                continue
            for x, cubic_term in _both_orders(inner_sum, ADD):
                for k, cube in _both_orders(cubic_term, MUL):
                    cube_nodes = _match_cube(cube, x) if _is_constant(k, CUBIC) else None
                    if isinstance(x, fx.Node) and cube_nodes:
                        return x, [one_plus, tanh, argument, inner_sum, cubic_term, *cube_nodes]
    return None


def _match_gelu(root: fx.Node, modules: dict) -> tuple[fx.Node, list[fx.Node]] | None:
    """(x, interior nodes) if `root` computes 0.5 * x * (1 + tanh(...)), the product in any shape.

    A product of three factors is a mul node of one factor and another mul node of the other two.
    x may itself be a product, so the tree is not flattened further than that.
    """
    for outer, inner in _both_orders(root, MUL):
        inner_operands = _binary_operands(inner, MUL)
        if inner_operands is None:
            continue
        for half, x, one_plus in permutations((outer, *inner_operands)):
            if not _is_constant(half, HALF):
                continue
            tanh_part = _match_tanh_part(one_plus, modules)
            if tanh_part is not None and tanh_part[0] is x:
                return x, [inner, *tanh_part[1]]
    return None


def _used_only_inside(interior: list[fx.Node], root: fx.Node) -> bool:
    """Every interior node feeds only the subgraph: otherwise erasing it breaks another user."""
    inside = {root, *interior}
    return all(user in inside for node in interior for user in node.users)


def replace_tanh_gelu(gm: fx.GraphModule) -> int:
    """Replace every hand-written tanh-GELU subgraph of `gm` by F.gelu(x, approximate="tanh"); return how many."""
    modules = dict(gm.named_modules())
    replaced = 0
    # Forward order: a subgraph's interior nodes come before its root, so no erased node is visited.
    for root in list(gm.graph.nodes):
        match = _match_gelu(root, modules)
        if match is None:
            continue
        x, interior = match
        if not _used_only_inside(interior, root):
            continue
        with gm.graph.inserting_before(root):
            gelu = gm.graph.call_function(F.gelu, (x,), {"approximate": "tanh"})
        root.replace_all_uses_with(gelu)
        dead = {root, *interior}
        for node in reversed(list(gm.graph.nodes)):  # users before what they use
            if node in dead:
                gm.graph.erase_node(node)
        replaced += 1
    gm.graph.lint()
    gm.recompile()
    return replaced
