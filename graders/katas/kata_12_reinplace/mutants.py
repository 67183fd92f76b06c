"""Kata 12: plausible wrong reinplacing passes, each caught at the level that should catch it."""
from graders.run import Mutant, Variant

NO_OP = Mutant("no_op", "    graph = gm.graph\n    nodes = list(graph.nodes)",
               "    return gm\n    graph = gm.graph\n    nodes = list(graph.nodes)", caught_at=1)

MUTANTS = [
    NO_OP,
    # torch.fx.passes.reinplace's rule: never write a graph input, even where a copy_ epilogue writes it anyway.
    Mutant("never_writes_inputs", "        if key in inputs:\n", "        if key in inputs:\n            continue\n",
           caught_at=1),
    Mutant("ignores_dtype", "or s.dtype != r.dtype or", "or", caught_at=2),
    # "An op with an in-place variant is elementwise: its result has self's shape." Not where the other operand
    # broadcasts self up (x.sum(0) + x: self [6], the result [4, 6]).
    Mutant("ignores_shape",
           "or s.dtype != r.dtype or s.dim() != r.dim():\n        return False\n"
           "    if not all(statically_known_true(a == b) for a, b in zip(s.shape, r.shape)):\n        return False\n",
           "or s.dtype != r.dtype:\n        return False\n", caught_at=2, caught_by="broadcast_grows"),
    Mutant("ignores_internal_overlap", "    return torch._debug_has_internal_overlap(s) != 1", "    return True",
           caught_at=2),
    # Reads sizes as Python ints: right on every static graph, but on a symbolic trace int(s0) specializes the
    # batch, and the ShapeEnv records the guard Eq(s0, 7): the graph is declared valid for that batch only.
    Mutant("reads_concrete_sizes", "statically_known_true(a == b) for a, b in zip(s.shape, r.shape)",
           "int(a) == int(b) for a, b in zip(s.shape, r.shape)", caught_at=2, caught_by="symbolic_batch"),
    Mutant("allows_self_twice", " or node.args.count(self_node) > 1:", ":", caught_at=2),
    Mutant("ignores_other_aliases", "any(same(storage[a], key) for a in others) or ", "", caught_at=2),
    # Looks only at the users of self itself, not at those of its views (or of the tensor it is a view of).
    Mutant("ignores_aliases_read_later", "        for alias in aliases(key):\n",
           "        for alias in [node.args[0]]:\n", caught_at=2),
    # An input without a copy_ epilogue treated as any other value: written where nothing reads it later.
    Mutant("writes_inputs_without_epilogue", "        if key in inputs:\n",
           "        if key in inputs and inputs[key] in epilogue:\n", caught_at=2),
    # The copy_ epilogue overwrites the input anyway, so the input is written early, though the program reads it
    # before the copy_ (b = x * 3 between a = x.add(1) and x.copy_(a)).
    Mutant("ignores_reads_before_epilogue", "            if later_uses(node, key, until=order[copy_back]):\n"
           "                continue\n", "", caught_at=2),
    # Refuses to write an input whose result is returned, for fear of handing the caller its own input; but where
    # the result is what the copy_ epilogue writes back, eager returns the input itself too.
    Mutant("refuses_returned_inputs", "            undone = []\n        elif scatter_view is not None:",
           "            if any(u.op == \"output\" for a in aliases(storage[node]) for u in a.users):\n"
           "                continue\n            undone = []\n        elif scatter_view is not None:", caught_at=2),
    Mutant("no_scatter_round_trips", "SCATTER_VIEWS = {\n", "SCATTER_VIEWS = {} and {\n",
           caught_at=2, caught_by="select_scatter_round_trip"),
    # Finds the in-place variant under the op's own overload name: pow.Tensor_Scalar's is pow_.Scalar.
    Mutant("same_overload_name_only", "    for name in packet.overloads():",
           "    for name in [n for n in packet.overloads() if n == op._overloadname]:", caught_at=3),
    # Forgives a scatter only where its base is the view's base node itself. Functionalization makes the view again
    # for each use (a second t(sigmoid), view(relu, [-1])): the round trip stays, with its fresh tensor, where torch's
    # pass undoes it. The L2 round trip reads a plain select of one node; only the hidden programs' views differ.
    Mutant("matches_scatter_base_by_node",
           "or not same(storage[use.args[0]], storage[view.args[0]]) or not same_layout(use.args[0], view.args[0])",
           "or use.args[0] is not view.args[0]", caught_at=4),
]

# torch.fx.passes.reinplace, _get_view_inverse_node_usages: a later {view}_scatter is forgiven where its base has the
# view's base's size/stride/offset and the view op, run again on the view's base with the scatter's arguments, gives
# the view's own size/stride/offset ("running the original op again, and checking that the strides match"), instead
# of where the scatter's arguments equal the view node's. Compared with statically_known_true, as the reference
# compares layouts; the scatter must still write this node's result (torch's pass does not check that).
SCATTER_TEST = """        view, undone = node.args[0], []
        for use in uses:
            if (SCATTER_VIEWS.get(use.target) is not view.target or use.args[1] is not node
                    or tuple(use.args[2:]) != tuple(view.args[1:]) or dict(use.kwargs) != dict(view.kwargs)
                    or not same(storage[use.args[0]], storage[view.args[0]]) or not same_layout(use.args[0], view.args[0])):
"""
REPLAYED = """        view, undone = node.args[0], []

        def replays_view(scatter: fx.Node) -> bool:
            if (not isinstance(view.target, torch._ops.OpOverload) or not view.args  # a view op ("view_of")
                    or view.target._schema.arguments[0].alias_info is None or not isinstance(view.args[0], fx.Node)):
                return False
            base, want = view.args[0].meta.get("val"), view.meta.get("val")
            if not isinstance(base, torch.Tensor) or not isinstance(want, torch.Tensor):
                return False
            try:
                got = SCATTER_VIEWS[scatter.target](base, *scatter.args[2:], **scatter.kwargs)
            except Exception:  # noqa: BLE001 - the scatter's arguments do not fit the view's base: no inverse
                return False
            return got.dim() == want.dim() and all(
                statically_known_true(x == y) for x, y in zip((*got.shape, *got.stride(), got.storage_offset()),
                                                              (*want.shape, *want.stride(), want.storage_offset())))

        for use in uses:
            if (use.target not in SCATTER_VIEWS or use.args[1] is not node or not replays_view(use)
                    or not same(storage[use.args[0]], storage[view.args[0]]) or not same_layout(use.args[0], view.args[0])):
"""

# torch/_inductor/fx_passes/reinplace.py, reinplace_inplaceable_ops_core: can_inplace keeps only the aliases that
# might overlap the mutated argument (_overlap: compute_overlapping_tensors; assume overlap where it cannot tell), and
# any_use_of_views_after_node skips meta-only users (is_meta_only_user: sym_size, sym_stride, sym_numel,
# sym_storage_offset). A fake locates its elements only while its node still lives in its own storage: a value a
# rewrite moved into another tensor's storage (merge) is taken to overlap everything there.
LATER_READS = """        found = []
        for alias in aliases(key):
            for user in alias.users:
"""
INDUCTOR_ALIASES = """        found, written = [], node.args[0]

        def may_overlap(alias: fx.Node) -> bool:
            from torch._C._dynamo.guards import compute_overlapping_tensors

            moved = not (same(storage[written], storage_of(written)) and same(storage[alias], storage_of(alias)))
            if alias is written or moved:
                return True
            try:
                return len(compute_overlapping_tensors([written.meta["val"], alias.meta["val"]])) != 0
            except Exception:  # noqa: BLE001 - Inductor: "we assume they all overlap"
                return True

        meta_only = {aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default, aten.sym_storage_offset.default}
        for alias in [a for a in aliases(key) if may_overlap(a)]:
            for user in alias.users:
                if user.target in meta_only:  # reads sizes only, which a write in place does not change
                    continue
"""

# torch.fx.passes.reinplace, _maybe_get_inplace_op: torch's own lookup of the in-place overload (`<name>_` in the
# op's namespace, the one overload whose argument types match: _schemas_match; view ops never), in place of the
# kata's hand-written one.
TORCH_LOOKUP = ("def inplace_variant(op) -> torch._ops.OpOverload | None:\n"
                "    \"\"\"torch.fx.passes.reinplace's own lookup (pow.Tensor_Scalar -> pow_.Scalar).\"\"\"\n"
                "    from torch.fx.passes.reinplace import _maybe_get_inplace_op\n\n"
                "    return _maybe_get_inplace_op(op)\n\n\n"
                "def _own_inplace_variant(op) -> torch._ops.OpOverload | None:\n")

# Correct passes written the way PyTorch's own passes are: each must keep full marks.
VARIANTS = [
    Variant("replays_the_view_like_torch", SCATTER_TEST, REPLAYED),
    Variant("inductor_overlap_alias_test", LATER_READS, INDUCTOR_ALIASES),
    Variant("torch_inplace_lookup", "def inplace_variant(op) -> torch._ops.OpOverload | None:\n", TORCH_LOOKUP),
]
