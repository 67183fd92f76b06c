"""Kata 06: plausible wrong solutions, each caught at the level that should catch it."""
from graders.run import Mutant, Variant

ERASE_LOOP = """    folded = 0
    for node in reversed(graph.nodes):
        if node in values and node not in kept:
            folded += _is_call(node)
            graph.erase_node(node)
"""
EVALUATE = """    with torch.no_grad():
        if node.op == "call_function":
            value = node.target(*args, **kwargs)
        else:
            value = getattr(args[0], node.target)(*args[1:], **kwargs)
    return tree_map_only(torch.Tensor, torch.Tensor.detach, value)
"""
NO_OP = Mutant("no_op", "    graph = gm.graph\n    values = _constant_values(gm)",
               "    return 0\n    graph = gm.graph\n    values = _constant_values(gm)", caught_at=1)

MUTANTS = [
    NO_OP,
    Mutant("forgets_recompile", "    graph.lint()\n    gm.recompile()\n", "    graph.lint()\n", caught_at=1),
    Mutant("leaves_dead_nodes_behind", "            folded += _is_call(node)\n            graph.erase_node(node)\n",
           "            folded += _is_call(node)\n", caught_at=1),
    Mutant("counts_stored_values_not_removed_nodes", "    return folded\n", "    return len(to_store)\n", caught_at=1),
    Mutant("folds_when_any_input_is_constant", "if all(n in values for n in node.all_input_nodes):",
           "if any(n in values for n in node.all_input_nodes) or not node.all_input_nodes:", caught_at=1),
    Mutant("folds_random_draws", " and not _draws_random_numbers(node) and", " and", caught_at=2),
    Mutant("folds_mutated_buffers", "        if node in mutated:\n            continue\n"
           "        if node.op == \"get_attr\" and node.target not in mutated_targets:",
           "        if node.op == \"get_attr\":", caught_at=2),
    Mutant("misses_writes_through_views", "            if _is_call(node) and node.args:\n"
           "                stack.append(node.args[0])\n", "", caught_at=2),
    Mutant("marks_nodes_not_attributes", 'if node.op == "get_attr" and node.target not in mutated_targets:',
           'if node.op == "get_attr" and node not in mutated:', caught_at=2),
    Mutant("cleans_up_with_eliminate_dead_code", ERASE_LOOP,
           "    calls_before = sum(_is_call(n) for n in graph.nodes)\n    graph.eliminate_dead_code()\n"
           "    folded = calls_before - sum(_is_call(n) for n in graph.nodes)\n", caught_at=2),
    Mutant("stores_plain_attributes", "        gm.register_buffer(name, values[node], persistent=False)",
           "        setattr(gm, name, values[node])", caught_at=2, caught_by="folded_values_are_buffers"),
    # nn.Parameter's default, requires_grad=True, where the dtype allows it (an integer mask raises there): the folded
    # model gains trainable parameters the original lacks.
    Mutant("stores_trainable_parameters", "        gm.register_buffer(name, values[node], persistent=False)",
           "        value = values[node]\n"
           "        gm.register_parameter(name, torch.nn.Parameter(value, requires_grad=value.is_floating_point()))",
           caught_at=2, caught_by="folded_values_are_buffers"),
    Mutant("size_cap_exclusive", "if _nbytes(value) <= max(SIZE_CAP_BYTES, GROWTH_CAP * inputs_bytes):",
           "if _nbytes(value) < max(SIZE_CAP_BYTES, GROWTH_CAP * inputs_bytes):",
           caught_at=2, caught_by="result_exactly_at_the_cap"),
    # Writes are looked for in call_function and call_method nodes only: nn.ReLU(inplace=True) writes unseen.
    Mutant("inplace_modules_write_nothing", '    if node.op == "call_module":  # a module built with inplace=True',
           '    if False:  # a module built with inplace=True',
           caught_at=2, caught_by="buffer_written_by_an_inplace_module"),
    Mutant("no_size_cap", "if _nbytes(value) <= max(SIZE_CAP_BYTES, GROWTH_CAP * inputs_bytes):", "if True:",
           caught_at=2),
    Mutant("getattr_on_dotted_target", "values[node] = _fetch_attr(gm, node.target)",
           "values[node] = getattr(gm, node.target)", caught_at=2),
    Mutant("stores_every_constant_as_a_buffer", " and isinstance(values[node], torch.Tensor) and", " and",
           caught_at=2),
    # A default value is what the caller gets when it passes nothing, not what it always gets.
    Mutant("folds_argument_defaults", '        if node.op == "get_attr" and node.target not in mutated_targets:',
           '        if node.op == "placeholder" and node.args:\n            values[node] = node.args[0]\n'
           '        elif node.op == "get_attr" and node.target not in mutated_targets:',
           caught_at=2, caught_by="argument_with_default"),
    Mutant("stores_over_an_existing_name", 'in taken or hasattr(gm, f"{FOLDED_NAME}_{index}"):', "in taken:",
           caught_at=2, caught_by="attribute_names_taken"),
    Mutant("evaluates_with_autograd_on", EVALUATE,
           EVALUATE.replace("    with torch.no_grad():\n", "    if True:\n").replace(
               "tree_map_only(torch.Tensor, torch.Tensor.detach, value)", "value"),
               caught_at=2, caught_by="autograd_after_folding"),
    Mutant("evaluates_under_inference_mode", "    with torch.no_grad():\n        if node.op",
           "    with torch.inference_mode():\n        if node.op", caught_at=2, caught_by="autograd_after_folding"),
    # torch.mul(b, 0.9, out=b) writes b: run at fold time, it writes the real buffer.
    Mutant("out_is_not_a_write", '    if node.kwargs.get("out") is not None:\n        written.append(node.kwargs["out"])\n',
           "", caught_at=2, caught_by="buffer_written_through_out"),
    # torch.arange(5), torch.ones(3): no input nodes, so "all inputs constant" holds; this pass wants at least one.
    Mutant("never_folds_nodes_without_inputs", "if all(n in values for n in node.all_input_nodes):",
           "if node.all_input_nodes and all(n in values for n in node.all_input_nodes):",
           caught_at=2, caught_by="constructors_without_inputs"),
    Mutant("one_get_attr_per_user", "        with graph.inserting_before(node):\n"
           "            stored = graph.get_attr(name)\n            node.replace_all_uses_with(stored)\n",
           "        for user in list(node.users):\n            with graph.inserting_before(user):\n"
           "                user.replace_input_with(node, stored := graph.get_attr(name))\n",
           caught_at=2, caught_by="folded_value_read_twice"),
    # Folds a module call whose inputs are constant unless it is a Dropout (as torch.fx.experimental.const_fold
    # folds call_module nodes whole).
    Mutant("folds_modules_on_constants",
           "        elif _is_call(node) and not _draws_random_numbers(node) and not _written_by(node):\n",
           "        elif (node.op == \"call_module\" and all(n in values for n in node.all_input_nodes)\n"
           "              and not isinstance(gm.get_submodule(node.target), torch.nn.Dropout)):\n"
           "            with torch.no_grad():\n"
           "                args = fx.node.map_arg(node.args, lambda n: values[n])\n"
           "                values[node] = gm.get_submodule(node.target)(*args).detach()\n"
           "        elif _is_call(node) and not _draws_random_numbers(node) and not _written_by(node):\n",
           caught_at=2, caught_by="module_on_constant"),
    # Returns a folded constant as it is, as torch.fx's split_const_subgraphs and Inductor's freezing do: every call
    # hands the caller the stored buffer itself, where the original returns a fresh tensor (graders/run/numerics.py).
    Mutant("returns_stored_values_as_they_are",
           """        for output in [user for user in stored.users if user.op == "output"]:
            with graph.inserting_before(output):
                output.replace_input_with(stored, graph.call_method("clone", (stored,)))
""", "", caught_at=2),
    # Arguments mapped one level deep (`values[a] if isinstance(a, fx.Node) else a`): the nodes inside a list
    # argument (torch.cat([angles.sin(), angles.cos()])) reach the op as fx.Nodes.
    Mutant("evaluates_top_level_args_only",
           "    args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: values[n])\n",
           "    args = [values[a] if isinstance(a, fx.Node) else a for a in node.args]\n"
           "    kwargs = {k: values[v] if isinstance(v, fx.Node) else v for k, v in node.kwargs.items()}\n",
           caught_at=2, caught_by="sinusoidal_positions"),
    # One fresh name picked for "the" folded constant: a second stored value overwrites the first.
    Mutant("one_name_for_every_stored_value",
           "    taken: set[str] = set()\n    for node in to_store:\n        name = _fresh_name(gm, taken)\n",
           "    name = _fresh_name(gm, set())\n    for node in to_store:\n",
           caught_at=2, caught_by="partially_constant"),
    # An early exit when there is nothing to store, that forgets the count: the pass returns None, not 0.
    Mutant("returns_none_when_nothing_folds", "    taken: set[str] = set()\n",
           "    if not to_store:\n        return  # nothing to fold\n    taken: set[str] = set()\n",
           caught_at=2, caught_by="depends_on_input"),
    # Module calls on constant inputs folded whole (as torch.fx.experimental.const_fold does), with randomness
    # looked for in functions and methods only: a Dropout in training mode freezes one mask.
    Mutant("folds_random_modules_on_constants",
           "        elif _is_call(node) and not _draws_random_numbers(node) and not _written_by(node):\n",
           "        elif node.op == \"call_module\" and all(n in values for n in node.all_input_nodes):\n"
           "            with torch.no_grad():\n"
           "                args = fx.node.map_arg(node.args, lambda n: values[n])\n"
           "                values[node] = gm.get_submodule(node.target)(*args).detach()\n"
           "        elif _is_call(node) and not _draws_random_numbers(node) and not _written_by(node):\n",
           caught_at=2, caught_by="dropout_module_on_constant"),
    Mutant("in_place_ops_listed_by_hand",
           'in_place = (name.endswith("_") and not name.endswith("__")) or node.target is operator.setitem',
           'in_place = name in ("add_", "mul_", "copy_", "fill_")', caught_at=4),
    Mutant("random_functions_listed_by_hand", "return node.target in RANDOM_FUNCTIONS",
           "return node.target in (torch.rand, torch.randn_like, F.dropout)", caught_at=4),
]

STORE = """        name = _fresh_name(gm, taken)
        # Not persistent: the folded value is derived from the state_dict, not part of it.
        gm.register_buffer(name, values[node], persistent=False)
"""

VARIANTS = [
    # torch.fx.experimental.const_fold stores folded values as frozen parameters, not buffers.
    Variant("stores_frozen_parameters", "gm.register_buffer(name, values[node], persistent=False)",
            "gm.register_parameter(name, torch.nn.Parameter(values[node], requires_grad=False))"),
    # A prefix the graded model already uses (`_folded_0`, `_folded_1`): a pass that checks hasattr moves on.
    Variant("prefix_already_taken", 'FOLDED_NAME = "_folded_constant"', 'FOLDED_NAME = "_folded"'),
    # Inductor's replace_node_with_constant (torch/_inductor/constant_folding.py): the first `_frozen_param{i}` gm has
    # no attribute of, registered as a buffer with register_buffer's default, persistent (so in the state_dict).
    Variant("inductor_frozen_param_names", STORE, """        index = 0
        while hasattr(gm, name := f"_frozen_param{index}"):
            index += 1
        gm.register_buffer(name, values[node])
"""),
    # torch.fx.experimental.const_fold: a name from its get_unique_attr_name_in_module (`_FX_CONST_FOLDED_ATTRS`,
    # then `_1`, `_2`, ... while hasattr), and FoldedGraphModule.run_folding's _create_param: a frozen Parameter
    # holding a detached clone (never a view of a parameter), requires_grad as the value's (False under no_grad).
    Variant("const_fold_stores_detached_clones", STORE,
            """        from torch.fx.experimental.const_fold import get_unique_attr_name_in_module
        name = get_unique_attr_name_in_module(gm, "_FX_CONST_FOLDED_ATTRS")
        value = values[node]
        param = torch.nn.Parameter(value.detach().clone(), requires_grad=value.requires_grad)
        gm.register_parameter(name, param)
"""),
]
