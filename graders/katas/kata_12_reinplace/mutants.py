"""Kata 12: plausible wrong reinplacing passes, each caught at the level that should catch it."""
from graders.run import Mutant

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
