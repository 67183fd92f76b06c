"""Kata 05: plausible wrong solutions, each caught at the level that should catch it."""
from graders.run import Mutant, Variant, reference_source

MERGE = """        first = available.setdefault(key, node)
        if first is not node:
            # Replacing at once makes the users' keys name `first`, so chains merge in this same pass.
            node.replace_all_uses_with(first)
            graph.erase_node(node)
            merged += 1
"""
# The naive loop: find the copies first, rewire afterwards, so `sin_1 * y` never matches `sin * y`.
MERGE_AFTER_THE_LOOP = """        first = available.setdefault(key, node)
        if first is not node:
            copies.append((node, first))
    for node, first in copies:
        node.replace_all_uses_with(first)
        graph.erase_node(node)
        merged += 1
"""
START = "    available: dict[object, fx.Node] = {}\n"
_REFERENCE = reference_source("05_cse")
LOOP = _REFERENCE[_REFERENCE.index(START):_REFERENCE.index(MERGE) + len(MERGE)]
UNKNOWN_ARGUMENTS = """    if isinstance(arg, slice):  # unhashable before Python 3.12
        return (slice, _constant_key(arg.start), _constant_key(arg.stop), _constant_key(arg.step))
    if isinstance(arg, torch.Tensor):
        return (torch.Tensor, id(arg))  # only the very same tensor; == on tensors is elementwise
    raise _Unmergeable(type(arg).__name__)
"""
SCALARS = """    if isinstance(arg, (float, complex)):
        return (type(arg), repr(arg))
    if isinstance(arg, _PLAIN_CONSTANTS):
        return (type(arg), arg)
"""
SKIP = "        if node in mutated or node in returned or not _is_pure(node, modules):\n"
TUPLES_TO_NODE_KEY = _REFERENCE[_REFERENCE.index("    if isinstance(arg, (tuple, list)):"):
                                _REFERENCE.index("_constant_key(dict(node.kwargs)))")]
SKIP_TO_MERGE = _REFERENCE[_REFERENCE.index(SKIP):
                           _REFERENCE.index(MERGE) + len(MERGE)]
TENSOR_KEY_TO_SKIP = _REFERENCE[_REFERENCE.index("        return (torch.Tensor, id(arg))"):
                                _REFERENCE.index(SKIP) + len(SKIP)]
RANDOM_OPS_END = '    "feature_alpha_dropout", "rrelu", "gumbel_softmax",\n}\n'
PURE_MODULES_END = "    nn.Softmax, nn.LogSoftmax, nn.PReLU,\n)\n"
BARRIER = "            available.clear()\n"
NO_OP = Mutant("no_op", "    mutated = _mutated_nodes(graph, modules)\n",
               "    return 0\n    mutated = _mutated_nodes(graph, modules)\n", caught_at=1)

MUTANTS = [
    NO_OP,
    Mutant("forgets_recompile", "    gm.recompile()\n    return merged", "    return merged", caught_at=1),
    Mutant("not_transitive", LOOP,
           LOOP.replace(MERGE, MERGE_AFTER_THE_LOOP).replace(START, START + "    copies = []\n"), caught_at=1),
    Mutant("keeps_the_last_copy", MERGE, """        first = available.get(key)
        available[key] = node
        if first is not None:
            first.replace_all_uses_with(node)
            graph.erase_node(first)
            merged += 1
""", caught_at=1),
    Mutant("crashes_on_list_args",
           "        return (tuple if isinstance(arg, tuple) else list, tuple(_constant_key(a) for a in arg))",
           "        return [_constant_key(a) for a in arg]", caught_at=1),
    Mutant("crashes_on_slices", UNKNOWN_ARGUMENTS, "    return (type(arg), arg)\n",
           caught_at=2, caught_by="slice_args"),
    Mutant("ignores_kwargs", "_constant_key(dict(node.kwargs)))", "())", caught_at=2),
    Mutant("merges_1_and_1_0", SCALARS,
           "    if isinstance(arg, (float, complex) + _PLAIN_CONSTANTS):\n        return arg\n", caught_at=2),
    Mutant("merges_0_0_and_minus_0_0", "        return (type(arg), repr(arg))", "        return (type(arg), arg)",
           caught_at=2),
    Mutant("merges_random_ops", "    return _op_name(node) not in RANDOM_OPS", "    return True", caught_at=2),
    Mutant("merges_any_module", "        module = modules[node.target]\n        if isinstance(module, (nn",
           "        return True\n        module = modules[node.target]\n        if isinstance(module, (nn",
           caught_at=2, caught_by="dropout_module_training"),
    Mutant("merges_inplace_ops", "    written = [node.args[0]] if inplace and node.args else []",
           "    written = []", caught_at=2),
    Mutant("merges_across_an_inplace_op", BARRIER, "", caught_at=2),
    Mutant("merges_values_mutated_later", "        if node in mutated or node in returned or not _is_pure(node, modules):",
           "        if node in returned or not _is_pure(node, modules):", caught_at=2),
    Mutant("ignores_writes_through_views",
           "        if _op_name(node) in VIEW_OPS or _written_arguments(node, modules):",
           "        if _written_arguments(node, modules):", caught_at=2, caught_by="duplicate_mutated_through_view"),
    Mutant("inplace_only_for_methods",
           "        inplace = (node.target in INPLACE_OPERATORS or _is_inplace_name(_op_name(node))\n"
           "                   or node.kwargs.get(\"inplace\") is True)",
           "        inplace = node.target in INPLACE_OPERATORS", caught_at=2, caught_by="identical_inplace_functions"),
    # Gap: only the arithmetic methods count as writes; h.clamp_(...), h.exp_(), h.masked_fill_(...) do not.
    Mutant("inplace_only_arithmetic_methods", "        inplace = _is_inplace_name(node.target)\n",
           '        inplace = node.target in ("add_", "sub_", "mul_", "div_")\n',
           caught_at=2, caught_by="inplace_methods_beyond_arithmetic"),
    # Gap: a write forgets only the keys of nodes that read the written node itself, so a write through
    # `h.view(-1)[:4]` leaves `h.exp()` available, and a write to h leaves `h.t().sin()` available.
    Mutant("barrier_ignores_aliases", BARRIER,
           "            written = set(_written_arguments(node, modules))\n"
           "            for key in [k for k, first in available.items() if written & set(first.all_input_nodes)]:\n"
           "                del available[key]\n",
           caught_at=2, caught_by="duplicate_mutated_through_self_returning_ops"),
    # Gap: counts each merged expression once, whatever the number of copies it absorbed.
    Mutant("counts_merge_groups", "            merged += 1\n",
           "            merged += not first.meta.get('absorbed_a_copy')\n"
           "            first.meta['absorbed_a_copy'] = True\n",
           caught_at=2, caught_by="three_copies_of_one_expression"),
    # Gap: a key without the op kind: x.neg() (call_method 'neg') meets a submodule named `neg` (call_module 'neg').
    Mutant("key_without_op_kind", "    return (node.op, node.target, _constant_key(node.args)",
           "    return (node.target, _constant_key(node.args)", caught_at=2, caught_by="method_and_module_of_one_name"),
    # Gap: keyword arguments keyed in call order, so f(x, a=1, b=2) and f(x, b=2, a=1) stay apart.
    Mutant("kwargs_in_call_order", "        return (dict, tuple(sorted((k, _constant_key(v)) for k, v in arg.items())))",
           "        return (dict, tuple((k, _constant_key(v)) for k, v in arg.items()))",
           caught_at=2, caught_by="kwargs_in_any_order"),
    # Gap: out= is not a write: torch.mul(h, 2, out=h) between two h.exp() lets them merge.
    Mutant("ignores_out_keyword", '    if node.kwargs.get("out") is not None:\n        written.append(node.kwargs["out"])\n',
           "", caught_at=2, caught_by="write_with_out_keyword"),
    # Gap: aliases followed through views only, not through ops that return their input itself.
    Mutant("aliases_through_views_only", '"tensor_split", "type_as", "to", "type", "float", "double",\n'
           '    "half", "bfloat16", "int", "long", "short", "char", "byte", "bool", "cfloat", "cdouble", "cpu", "cuda",\n',
           '"tensor_split",\n', caught_at=2, caught_by="duplicate_mutated_through_self_returning_ops"),
    # Gap: only nn.Dropout is random in training mode; AlphaDropout, FeatureAlphaDropout, Dropout2d merge.
    Mutant("only_nn_dropout_is_random", "isinstance(module, (nn.modules.dropout._DropoutNd, nn.RReLU))",
           "isinstance(module, (nn.Dropout, nn.RReLU))", caught_at=2),
    # Gaps: modules that are pure in the state they are in, treated as impure whatever their state.
    Mutant("never_merges_dropout_modules", "            return not module.training  # random in training mode",
           "            return False", caught_at=2, caught_by="eval_mode_modules_merge"),
    Mutant("batchnorm_impure_in_eval", "_NormBase) and module.training and module.track_running_stats:",
           "_NormBase):", caught_at=2, caught_by="eval_mode_modules_merge"),
    Mutant("batchnorm_without_running_stats_impure",
           "_NormBase) and module.training and module.track_running_stats:", "_NormBase) and module.training:",
           caught_at=2, caught_by="eval_mode_modules_merge"),
    # Gap: only functions and methods are expressions; a module call (a Linear, a GELU) is never merged.
    Mutant("never_merges_modules", '    if node.op not in ("call_function", "call_method", "call_module"):\n            continue',
           '    if node.op not in ("call_function", "call_method"):\n            continue',
           caught_at=2, caught_by="pure_modules_merge"),
    # Gap: node.args keyed element by element, and only lists (torch.cat's) handled inside it: a tuple
    # argument (torch.stack((x, y))) is "unknown", so the stacks never merge.
    Mutant("tuple_args_unmergeable", TUPLES_TO_NODE_KEY,
           TUPLES_TO_NODE_KEY.replace("isinstance(arg, (tuple, list)):", "isinstance(arg, list):")
           .replace("_constant_key(node.args)", "tuple(_constant_key(a) for a in node.args)"),
           caught_at=2, caught_by="list_and_tuple_args"),
    # Gap: returned copies "kept apart" by handing the caller a clone of the first copy, and each clone
    # counted as a merge although no node left the graph.
    Mutant("clones_returned_copies", SKIP_TO_MERGE,
           SKIP_TO_MERGE.replace(" or node in returned", "").replace(
               "            node.replace_all_uses_with(first)\n",
               "            if node in returned:  # the caller still gets two tensors\n"
               "                with graph.inserting_before(node):\n"
               "                    first = graph.call_method(\"clone\", (first,))\n"
               "            node.replace_all_uses_with(first)\n"),
           caught_at=2, caught_by="returned_copies"),
    # Gap: torch.fx's CSEPass way (returned copies merge, which is accepted), with a tensor constant keyed by
    # its dtype and shape (what a trace guard looks at), not its identity: two different tensors merge.
    Mutant("tensor_keyed_by_metadata", TENSOR_KEY_TO_SKIP,
           TENSOR_KEY_TO_SKIP.replace("        return (torch.Tensor, id(arg))",
                                      "        return (torch.Tensor, arg.dtype, tuple(arg.shape))")
           .replace(" or node in returned", ""), caught_at=2, caught_by="tensor_constant_args"),
    # Lists cut down to what the visible models use: the hidden models draw from wider ones.
    Mutant("random_ops_seen_in_visible_models", RANDOM_OPS_END,
           RANDOM_OPS_END + 'RANDOM_OPS = {"rand", "rand_like", "randn_like", "dropout"}\n', caught_at=4),
    Mutant("pure_modules_seen_in_visible_models", PURE_MODULES_END,
           PURE_MODULES_END + "PURE_MODULES = (nn.Linear, nn.GELU, nn.modules.batchnorm._NormBase)\n", caught_at=4),
]

VARIANTS = [
    # torch.fx's CSEPass (torch/fx/passes/dialect/common/cse_pass.py) merges returned copies; AOTAutograd's
    # fx_graph_cse, which the reference follows, leaves every node that shares memory with an output apart.
    Variant("merges_returned_copies", " or node in returned", ""),
]
