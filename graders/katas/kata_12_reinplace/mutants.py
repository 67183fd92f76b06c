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
    Mutant("ignores_internal_overlap", "    return torch._debug_has_internal_overlap(s) != 1", "    return True",
           caught_at=2),
    Mutant("allows_self_twice", " or node.args.count(self_node) > 1:", ":", caught_at=2),
    Mutant("ignores_other_aliases", "any(same(storage[a], key) for a in others) or ", "", caught_at=2),
    # Looks only at the users of self itself, not at those of its views (or of the tensor it is a view of).
    Mutant("ignores_aliases_read_later", "        for alias in aliases(key):\n",
           "        for alias in [node.args[0]]:\n", caught_at=2),
    Mutant("writes_inputs_without_epilogue", "            if copy_back is None or copy_back.args[1] is not node or",
           "            if copy_back is not None and copy_back.args[1] is not node or", caught_at=2),
    Mutant("no_scatter_round_trips", "SCATTER_VIEWS = {\n", "SCATTER_VIEWS = {} and {\n", caught_at=2),
    # Finds the in-place variant under the op's own overload name: pow.Tensor_Scalar's is pow_.Scalar.
    Mutant("same_overload_name_only", "    for name in packet.overloads():",
           "    for name in [n for n in packet.overloads() if n == op._overloadname]:", caught_at=3),
]
