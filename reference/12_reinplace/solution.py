"""Kata 12: turn the functional ops of a functionalized ATen graph back into in-place ops where that is safe.

Read README.md beside this file first. Grade your work with:  uv run pytest katas/12_reinplace
"""
from __future__ import annotations

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.multiprocessing.reductions import StorageWeakRef

aten = torch.ops.aten

# A {view}_scatter op and the view it writes back into (README, "Writes through a view").
SCATTER_VIEWS = {
    aten.select_scatter.default: aten.select.int,
    aten.slice_scatter.default: aten.slice.Tensor,
    aten.diagonal_scatter.default: aten.diagonal.default,
    aten.as_strided_scatter.default: aten.as_strided.default,
}


def inplace_variant(op) -> torch._ops.OpOverload | None:
    """The in-place overload whose schema matches `op`'s (add.Tensor -> add_.Tensor, pow.Tensor_Scalar ->
    pow_.Scalar), or None: no `<name>_` packet, a view op, or no overload with the same argument types."""
    if not isinstance(op, torch._ops.OpOverload):
        return None
    first = op._schema.arguments[0] if op._schema.arguments else None
    if first is None or first.alias_info is not None:  # a view (or an op that already writes its argument)
        return None
    packet = getattr(getattr(torch.ops, op.namespace), f"{op._schema.name.split('::')[-1]}_", None)
    if packet is None:
        return None
    types = [a.type for a in op._schema.arguments]
    for name in packet.overloads():
        candidate = getattr(packet, name)
        if [a.type for a in candidate._schema.arguments] == types:
            return candidate
    return None


def storage_of(node) -> StorageWeakRef | None:
    """Where `node`'s value lives: the storage of its meta['val'], shared by every view of it (None: no tensor)."""
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return StorageWeakRef(val.untyped_storage()) if isinstance(val, torch.Tensor) else None


def same(a, b) -> bool:
    """Two storages (None: no tensor) are one."""
    return a is not None and b is not None and a == b


def fits(self_node: fx.Node, node: fx.Node) -> bool:
    """`self` can hold the result: the same shape (statically, whatever the size symbols), the same dtype, and
    no element stored twice (an expanded tensor)."""
    s, r = self_node.meta.get("val"), node.meta.get("val")
    if not isinstance(s, torch.Tensor) or not isinstance(r, torch.Tensor) or s.dtype != r.dtype or s.dim() != r.dim():
        return False
    if not all(statically_known_true(a == b) for a, b in zip(s.shape, r.shape)):
        return False
    return torch._debug_has_internal_overlap(s) != 1


def same_layout(a: fx.Node, b: fx.Node) -> bool:
    """`a` and `b` lay their elements out alike: the same sizes, strides and storage offset (statically). With
    one storage, they are the same memory."""
    s, t = a.meta.get("val"), b.meta.get("val")
    if not isinstance(s, torch.Tensor) or not isinstance(t, torch.Tensor) or s.dim() != t.dim():
        return False
    return all(statically_known_true(x == y) for x, y in zip((*s.shape, *s.stride(), s.storage_offset()),
                                                             (*t.shape, *t.stride(), t.storage_offset())))


def reinplace(gm: fx.GraphModule) -> fx.GraphModule:
    """Rewrite `gm` (make_fx of torch.func.functionalize(f, remove="mutations")) so that each functional op with
    an in-place variant runs in place where nobody can tell: return `gm`, rewritten and recompiled."""
    graph = gm.graph
    nodes = list(graph.nodes)
    order = {node: index for index, node in enumerate(nodes)}
    storage = {node: storage_of(node) for node in nodes}
    # The graph inputs by storage, and the copy_ epilogue of each mutated one: copy_(input, value), at the end.
    inputs = {storage[n]: n for n in nodes if n.op == "placeholder" and storage[n] is not None}
    epilogue = {n.args[0]: n for n in nodes if n.target is aten.copy_.default and n.args[0].op == "placeholder"}
    erased: set[fx.Node] = set()

    def aliases(key) -> list[fx.Node]:
        return [n for n, k in storage.items() if same(k, key) and n not in erased]

    def later_uses(node: fx.Node, key, until: int | None = None) -> list[fx.Node]:
        """Nodes after `node` (and before `until`) that read storage `key` through any alias. A view of an alias
        reads nothing: it is an alias itself, whose own users count."""
        found = []
        for alias in aliases(key):
            for user in alias.users:
                if user in erased or order[user] <= order[node] or same(storage.get(user), key) and user.op != "output":
                    continue
                if until is None or order[user] < until:
                    found.append(user)
        return found

    def scatters_undone(node: fx.Node, uses: list[fx.Node]) -> list[fx.Node] | None:
        """The later uses that are {view}_scatters writing `node`'s result back into the very memory it read (forgiven:
        in place, that memory is written already); None if any other use remains. Functionalization makes the view
        again for the scatter: its base is another node, with the same storage and layout as the view's base."""
        view, undone = node.args[0], []
        for use in uses:
            if (SCATTER_VIEWS.get(use.target) is not view.target or use.args[1] is not node
                    or tuple(use.args[2:]) != tuple(view.args[1:]) or dict(use.kwargs) != dict(view.kwargs)
                    or not same(storage[use.args[0]], storage[view.args[0]]) or not same_layout(use.args[0], view.args[0])):
                return None
            undone.append(use)
        return undone

    def merge(node: fx.Node, key) -> None:
        """`node`'s value now lives in storage `key`, and so do its views."""
        old = storage[node]
        for n, k in list(storage.items()):
            if same(k, old):
                storage[n] = key

    for node in nodes:
        if node in erased or node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if not node.args or not isinstance(node.args[0], fx.Node):
            continue
        self_node, scatter_view = node.args[0], SCATTER_VIEWS.get(node.target)
        inplace = None if scatter_view else inplace_variant(node.target)
        if (scatter_view is None and inplace is None) or not fits(self_node, node):
            continue
        key = storage[self_node]
        others = [a for a in node.all_input_nodes if a is not self_node]
        if key is None or any(same(storage[a], key) for a in others) or node.args.count(self_node) > 1:
            continue
        copy_back = None
        if key in inputs:
            # Inductor's rule: write an input only where the program overwrites all of it anyway (its copy_ epilogue),
            # and nothing reads it before that copy_. The copy_ goes where it copies this very result.
            copy_back = epilogue.get(inputs[key])
            if copy_back in erased:  # gone: the input holds its final value, which nothing may overwrite
                copy_back = None
            if copy_back is None or scatter_view is not None or not same_layout(self_node, inputs[key]):
                continue
            if later_uses(node, key, until=order[copy_back]):
                continue
            # Otherwise the copy_ overwrites the result: nobody may read it from there on (the output node included).
            if copy_back.args[1] is not node and any(
                    order[u] >= order[copy_back] for a in aliases(storage[node]) for u in a.users if u not in erased):
                continue
            undone = []
        elif scatter_view is not None:
            undone = None if later_uses(node, key) else []
        else:
            undone = scatters_undone(node, later_uses(node, key))
        if undone is None:
            continue
        if scatter_view is not None:
            # b = view_scatter(a, src, args): write src into a's view instead; b is a.
            with graph.inserting_before(node):
                view = graph.call_function(scatter_view, (self_node, *node.args[2:]), dict(node.kwargs))
                write = graph.call_function(aten.copy_.default, (view, node.args[1]))
            order[view], order[write] = order[node] - 0.2, order[node] - 0.1
            storage[view] = storage[write] = key
            merge(node, key)  # the scatter's value, and every view of it, is self now
            node.replace_all_uses_with(self_node)
            erased.add(node)
            graph.erase_node(node)
            continue
        node.target = inplace
        merge(node, key)
        if copy_back is not None and copy_back.args[1] is node:  # the input holds the result already
            erased.add(copy_back)
            graph.erase_node(copy_back)
        for scatter in undone:  # the view already holds the result: the scatter's value is the base itself
            merge(scatter, key)
            scatter.replace_all_uses_with(scatter.args[0])
            erased.add(scatter)
            graph.erase_node(scatter)
    graph.lint()
    gm.recompile()
    return gm
