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
    # TODO(human): look up torch.ops.<namespace>.<name>_ and pick the overload whose argument types match op's
    #   (op._schema.arguments); a view op (its first argument has alias_info) never gets one.
    raise NotImplementedError("TODO(human): inplace_variant")


def storage_of(node) -> StorageWeakRef | None:
    """Where `node`'s value lives: the storage of its meta['val'], shared by every view of it (None: no tensor)."""
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return StorageWeakRef(val.untyped_storage()) if isinstance(val, torch.Tensor) else None


def reinplace(gm: fx.GraphModule) -> fx.GraphModule:
    """Rewrite `gm` (make_fx of torch.func.functionalize(f, remove="mutations")) so that each functional op with
    an in-place variant runs in place where nobody can tell: return `gm`, rewritten and recompiled."""
    # TODO(human): for each call_function node in graph order, with self = node.args[0]:
    #   - an in-place variant (inplace_variant), or a {view}_scatter (SCATTER_VIEWS) to undo;
    #   - self can hold the result: same shape (statically_known_true per dimension), dtype, no internal overlap;
    #   - no other argument aliases self (storage_of), and self is not passed twice;
    #   - no alias of self is read after the node (a view's own users count, the output node too), except a
    #     {view}_scatter that writes this very result back into the memory it read (the scatter's base: the same
    #     storage, sizes, strides and offset as the view's base, often another node; the same view arguments);
    #   - self the whole of a graph input: only with a copy_(input, src) epilogue and nothing reading the input
    #     before it; if src is this node the copy_ goes, else nothing may read the result from the copy_ on.
    # TODO(human): rewrite (node.target = the in-place overload), remember that the node (and an erased scatter)
    #   now lives in self's storage, erase what became useless; then gm.graph.lint() and gm.recompile().
    raise NotImplementedError("TODO(human): reinplace")
