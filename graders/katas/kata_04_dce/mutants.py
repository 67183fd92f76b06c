"""Kata 04: plausible wrong solutions, each caught at the level that should catch it."""
from graders.run import Mutant, Variant

SWEEP = """    for node in reversed(gm.graph.nodes):
        if len(node.users) == 0 and not has_side_effects(node, modules):
            gm.graph.erase_node(node)
            removed += 1
"""
NO_OP = Mutant("no_op", "    modules = dict(gm.named_modules())\n    removed = 0",
               "    return 0\n    modules = dict(gm.named_modules())\n    removed = 0", caught_at=1)

MUTANTS = [
    NO_OP,
    Mutant("single_forward_sweep", "for node in reversed(gm.graph.nodes):", "for node in list(gm.graph.nodes):",
           caught_at=1),
    Mutant("forgets_recompile", "    gm.recompile()\n    return removed", "    return removed", caught_at=1),
    Mutant("returns_bool_like_torch", "    return removed\n", "    return removed > 0\n", caught_at=1),
    Mutant("counts_nodes_visited", "            removed += 1\n", "        removed += 1\n", caught_at=1),
    # Graph.eliminate_dead_code: Node.is_impure misses call_method in-place ops, inplace=True, out=,
    # dropout and in-place or training-mode modules.
    Mutant("calls_torch_eliminate_dead_code", SWEEP,
           "    count = len(gm.graph.nodes)\n    gm.graph.eliminate_dead_code()\n"
           "    removed = count - len(gm.graph.nodes)\n", caught_at=2),
    Mutant("user_count_only", "    if node.op in (\"placeholder\", \"output\"):",
           "    return node.op in (\"placeholder\", \"output\")\n    if node.op in (\"placeholder\", \"output\"):",
           caught_at=2),
    Mutant("removes_placeholders", "    if node.op in (\"placeholder\", \"output\"):", "    if node.op == \"output\":",
           caught_at=2),
    Mutant("removes_inplace_methods", "return node.target.endswith(\"_\") and not node.target.endswith(\"__\")",
           "return False", caught_at=2),
    Mutant("removes_random_ops", "    return _mutates(node, modules) or _draws_random_numbers(node, modules)",
           "    return _mutates(node, modules)", caught_at=2),
    Mutant("removes_setitem", "SIDE_EFFECT_FUNCTIONS = {operator.setitem, ", "SIDE_EFFECT_FUNCTIONS = {",
           caught_at=2, caught_by="setitem"),
    Mutant("ignores_out_keyword", " or arguments.get(\"out\") is not None", "", caught_at=2),
    Mutant("inplace_keyword_only", "        arguments = _bound_arguments(node)\n",
           "        arguments = node.kwargs\n", caught_at=2),
    Mutant("ignores_module_state", "        return not _module_is_pure(modules[node.target])\n",
           "        return False\n", caught_at=2),
    Mutant("ignores_uses_inside_lists", "if len(node.users) == 0 and",
           "if not any(node in (*user.args, *user.kwargs.values()) for user in gm.graph.nodes) and",
           caught_at=2),
    # "An in-place op on a tensor nobody reads afterwards is dead": wrong as soon as the tensor is a view.
    Mutant("inplace_dead_when_target_unread", "        if len(node.users) == 0 and not has_side_effects(node, modules):",
           "        target = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None\n"
           "        inplace_on_unread = target is not None and node.op == 'call_method' and len(target.users) == 1\n"
           "        if len(node.users) == 0 and (inplace_on_unread or not has_side_effects(node, modules)):",
           caught_at=2),
    Mutant("keeps_every_module_call", "    if node.op in (\"placeholder\", \"output\"):",
           "    if node.op in (\"placeholder\", \"output\", \"call_module\"):",
           caught_at=2, caught_by="dropout_module_eval"),
    # Gaps closed in round 3: modules that are pure in the state they are in, and random methods.
    Mutant("keeps_dropout_modules_in_eval", "        return not module.training  # random in training mode",
           "        return False  # random in training mode", caught_at=2, caught_by="dropout_module_eval"),
    Mutant("keeps_batchnorm_without_running_stats", "        return not (module.training and module.track_running_stats)",
           "        return not module.training", caught_at=2, caught_by="batchnorm_without_running_stats"),
    Mutant("keeps_batchnorm_in_eval", "        return not (module.training and module.track_running_stats)",
           "        return False", caught_at=2, caught_by="batchnorm_without_running_stats"),
    # Round 4: a deny-list of effects (training BatchNorm, dropout modules, inplace=True) takes every other leaf
    # module for pure: a dead InstanceNorm tracking statistics, a GRU or a TransformerEncoderLayer with dropout
    # in training mode go, and the running statistics or the random stream change.
    # A learner's deny-list: BatchNorm1d and nn.Dropout only, every other module pure.
    Mutant("deny_list_of_batchnorm1d_and_dropout", "    if getattr(module, \"inplace\", False) is True:\n        return False\n",
           "    if getattr(module, \"inplace\", False) is True:\n        return False\n"
           "    if isinstance(module, nn.BatchNorm1d):\n        return not (module.training and module.track_running_stats)\n"
           "    if isinstance(module, nn.Dropout):\n        return not module.training\n"
           "    return True\n", caught_at=2, caught_by="other_batchnorm_and_dropout_modules"),
    Mutant("random_functions_by_name", "        random = node.target in RANDOM_FUNCTIONS or getattr(node.target, \"_nondeterministic_seeded\", False)\n",
           "        name = getattr(node.target, \"__name__\", \"\")\n"
           "        random = name.startswith(\"rand\") or \"dropout\" in name or name == \"bernoulli\"\n",
           caught_at=2, caught_by="normal_and_poisson"),
    Mutant("dropout_functions_always_draw", "        return random and _training(node)", "        return random",
           caught_at=2, caught_by="dropout_function_not_training"),
    Mutant("modules_pure_unless_listed", "    return isinstance(module, PURE_MODULES)\n", "    return True\n",
           caught_at=2, caught_by="opaque_modules_training"),
    Mutant("removes_random_methods", "        return node.target in RANDOM_METHODS", "        return False",
           caught_at=2, caught_by="random_method"),
    # Liveness read off the users' positional arguments: torch.add(x, other=a) leaves `a` without a use.
    Mutant("uses_in_positional_arguments_only", "if len(node.users) == 0 and",
           "if not any(node in user.args for user in gm.graph.nodes) and", caught_at=2, caught_by="uses_inside_kwargs"),
    # "Touching the model's state is a side effect": a rule meant for self.calls.add_(1) (state_mutation) that
    # keeps every op reading a parameter, though only writing it has an effect; self.weight * 2 stays, dead.
    Mutant("keeps_ops_reading_parameters", "    return _mutates(node, modules) or _draws_random_numbers(node, modules)",
           "    if any(arg.op == \"get_attr\" for arg in node.all_input_nodes):  # reads the model's state\n"
           "        return True\n"
           "    return _mutates(node, modules) or _draws_random_numbers(node, modules)",
           caught_at=2, caught_by="unused_parameter"),
    Mutant("inplace_methods_from_a_list", "return node.target.endswith(\"_\") and not node.target.endswith(\"__\")",
           "return node.target in {\"add_\", \"mul_\", \"zero_\"}", caught_at=4),
]

VARIANTS = [
    # torch.fx's own sweep, Graph.eliminate_dead_code, told which nodes are impure (its `is_impure_node`, the hook
    # PyTorch's callers use for effects Node.is_impure cannot see): the same pass as the hand-written loop.
    Variant("torch_sweep_with_this_impurity_test",
            "    for node in reversed(gm.graph.nodes):\n"
            "        if len(node.users) == 0 and not has_side_effects(node, modules):\n"
            "            gm.graph.erase_node(node)\n"
            "            removed += 1\n",
            "    before = len(gm.graph.nodes)\n"
            "    gm.graph.eliminate_dead_code(is_impure_node=lambda node: has_side_effects(node, modules))\n"
            "    removed = before - len(gm.graph.nodes)\n"),
]
