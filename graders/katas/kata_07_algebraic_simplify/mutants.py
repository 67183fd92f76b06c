"""Kata 07: plausible wrong simplifiers, each caught at the level that should catch it."""
from graders.run import Mutant, Variant

NEXT_RULE = "        replacement = (identity_operand(node, modules)"
ADD_ZERO = ("        if isinstance(x, fx.Node) and (is_negative_zero(zero) or\n"
            "                                       (is_positive_zero(zero, modules) and meta(x) and not is_float(x))):\n")
NO_OP = Mutant("no_op", "    # Shapes and dtypes of every node", "    return 0\n    # Shapes and dtypes of every node",
               caught_at=1)
# What a name-matching pass calls a node: the module's class name, else the function's or method's name.
NAME = '(type(modules[n.target]).__name__ if n.op == "call_module" else getattr(n.target, "__name__", str(n.target)))'


def before_the_rules(name: str, condition: str, replacement_node: str) -> Mutant:
    """A rule the table leaves out on purpose, added in front of the others."""
    return Mutant(name, NEXT_RULE,
                  f"        if {condition}:\n"
                  "            with graph.inserting_before(node):\n"
                  f"                constant = graph.call_function({replacement_node}, (node.args[0],))\n"
                  "            node.replace_all_uses_with(constant)\n"
                  "            graph.erase_node(node)\n"
                  "            rewrites += 1\n"
                  "            continue\n" + NEXT_RULE, caught_at=2)


MUTANTS = [
    NO_OP,
    Mutant("forgets_recompile", "    graph.lint()\n    gm.recompile()\n", "    graph.lint()\n", caught_at=1),
    Mutant("leaves_dead_nodes", "        for input_node in inputs:\n            erase_if_dead(input_node, graph)  #",
           "        for input_node in []:\n            erase_if_dead(input_node, graph)  #", caught_at=1),
    Mutant("square_not_counted", "            rewrites += 1\n            continue", "            continue",
           caught_at=1),
    Mutant("rewrites_float_plus_zero", "(is_positive_zero(zero, modules) and meta(x) and not is_float(x))",
           "is_positive_zero(zero, modules)", caught_at=2),
    Mutant("ignores_the_sign_of_zero", "return a if is_positive_zero(b, modules) else None",
           "return a if is_positive_zero(b, modules) or is_negative_zero(b) else None", caught_at=2),
    before_the_rules("rewrites_times_zero_to_zeros", "op_kind(node, modules) == 'mul' and len(node.args) == 2 "
                     "and is_literal_number(node.args[1]) and node.args[1] == 0", "torch.zeros_like"),
    before_the_rules("rewrites_x_over_x_to_ones", "op_kind(node, modules) == 'div' and len(node.args) == 2 "
                     "and node.args[0] is node.args[1]", "torch.ones_like"),
    Mutant("rewrites_exp_of_log", "or relu_of_relu(node, modules)\n",
           "or relu_of_relu(node, modules)\n                       or (node.args[0].args[0] if node.target is "
           "torch.exp and getattr(node.args[0], 'target', None) is torch.log else None)\n", caught_at=2),
    Mutant("ignores_broadcasting", "before.shape == after.shape and before.dtype", "before.dtype",
           caught_at=2, caught_by="broadcasting"),
    # Compares ranks, not shapes: (3, 1, 5) * ones(3, 4, 5) has x's rank and a larger shape.
    Mutant("compares_rank_not_shape", "before.shape == after.shape and",
           "len(before.shape) == len(after.shape) and", caught_at=2, caught_by="broadcasting_same_rank"),
    Mutant("ignores_dtype_promotion", "before.shape == after.shape and before.dtype == after.dtype",
           "before.shape == after.shape", caught_at=2, caught_by="dtype_promotion"),
    Mutant("square_ignores_dtype", "\n                and meta(node.args[0]).dtype == meta(node).dtype)",
           ")", caught_at=2, caught_by="dtype_promotion"),
    # int ** 2.0 is float, so it refuses a float exponent on a non-float tensor; but bool ** 2 is int64, b * b bool.
    Mutant("square_checks_the_exponent_only", "\n                and meta(node.args[0]).dtype == meta(node).dtype)",
           "\n                and (type(node.args[1]) is int or meta(node.args[0]).dtype.is_floating_point))",
           caught_at=2, caught_by="bool_squared"),
    Mutant("folds_parameter_equal_to_one", 'or op_kind(value, modules) == "ones"',
           'or op_kind(value, modules) == "ones" or (isinstance(value, fx.Node) and value.op == "get_attr" '
           'and bool((operator.attrgetter(value.target)(modules[""]) == 1).all()))',
           caught_at=2, caught_by="plain_tensor_of_ones"),
    # Folds a parameter of ones only where it has x's own shape, so the result's shape cannot change.
    Mutant("folds_parameter_of_inputs_shape", '    if kind == "mul":\n',
           '    if (kind == "mul" and isinstance(b, fx.Node) and b.op == "get_attr" and meta(a) and meta(b)\n'
           '            and meta(b).shape == meta(a).shape\n'
           '            and bool((operator.attrgetter(b.target)(modules[""]) == 1).all())):\n'
           '        return a\n    if kind == "mul":\n', caught_at=2, caught_by="plain_tensor_of_ones"),
    # 1 / x -> x and 0 - x -> x, as if / and - commuted like * and +.
    Mutant("div_and_sub_commute", "        return a if is_one(b, modules) else None\n",
           "        return a if is_one(b, modules) else b if is_one(a, modules) else None\n",
           caught_at=2, caught_by="reversed_operands"),
    Mutant("sub_commutes", "return a if is_positive_zero(b, modules) else None",
           "return a if is_positive_zero(b, modules) else b if is_positive_zero(a, modules) else None",
           caught_at=2, caught_by="reversed_operands"),
    # Looks for in-place users of the node only: s.add_(1) after y = s * 1.0 then writes what y reads.
    Mutant("in_place_check_misses_replacement",
           "    return not written_through(node, modules) and not written_through(replacement, modules, skip=node)",
           "    return not written_through(node, modules)", caught_at=2, caught_by="in_place_on_replacement"),
    # Looks at the direct users only: a write through a view (y.view(-1)[:2].add_(1)) goes unseen.
    Mutant("in_place_check_ignores_views",
           "            if user.op in (\"call_function\", \"call_method\") and _name(user) in VIEW_OPS and user.args \\\n",
           "            if False and user.args \\\n", caught_at=2, caught_by="in_place_through_a_view"),
    # A complex tensor treated as an integer one: * 1, / 1 and + 0 all dropped.
    Mutant("complex_as_integer", "    return meta(node).dtype.is_floating_point or meta(node).dtype.is_complex\n",
           "    return meta(node).dtype.is_floating_point\n", caught_at=2, caught_by="complex_identities"),
    Mutant("complex_times_one_is_complex", "    if kind in (\"mul\", \"div\") and any(isinstance(v, fx.Node) and is_complex(v) for v in (a, b)):\n"
           "        return None", "    if False:\n        return None", caught_at=2, caught_by="complex_identities"),
    # A tensor attribute of ones that is no parameter (self.unit, torch.ones(5) traced to _tensor_constant0) as 1.
    Mutant("tensor_attribute_of_ones_is_one", 'or op_kind(value, modules) == "ones"',
           'or op_kind(value, modules) == "ones" or (isinstance(value, fx.Node) and value.op == "get_attr" '
           'and value.target not in dict(modules[""].named_parameters()) '
           'and bool((operator.attrgetter(value.target)(modules[""]) == 1).all()))',
           caught_at=2, caught_by="plain_tensor_of_ones"),
    # Removes a cancelling pair as a unit: the inner permute's other users are pointed at x too.
    Mutant("erases_inner_of_a_pair", "        graph.erase_node(node)\n        for input_node in inputs:\n",
           "        graph.erase_node(node)\n"
           "        if op_kind(node, modules) in ('permute', 'transpose', 't'):\n"
           "            inputs[0].replace_all_uses_with(replacement)\n"
           "        for input_node in inputs:\n", caught_at=2, caught_by="permute_pair_with_other_user"),
    Mutant("same_permutation_twice_cancels", "all(p[q[i]] == i for i in range(rank))", "p == q", caught_at=2,
           caught_by="same_permute_twice"),
    # A transpose of a transpose taken for the original, as (A^T)^T = A for a matrix: right for t().t() and for
    # transpose(1, 2) twice, wrong for transpose(0, 1).transpose(1, 2), a 3-cycle.
    Mutant("transpose_of_transpose_is_identity", "    # Output dim i of `node` is dim q[i] of `inner`",
           "    if {op_kind(node, modules), op_kind(inner, modules)} <= {\"transpose\", \"t\"}:\n"
           "        return x  # (A^T)^T = A\n"
           "    # Output dim i of `node` is dim q[i] of `inner`", caught_at=2, caught_by="same_permute_twice"),
    Mutant("negative_dims_not_normalised", "return [d % rank for d in dims]", "return list(dims)", caught_at=2),
    Mutant("ignores_rounding_mode", 'len(node.args) != 2 or node.kwargs:', 'len(node.args) != 2:',
           caught_at=2, caught_by="div_with_rounding_mode"),
    Mutant("ignores_in_place_users",
           "        if not aliasing_is_safe(node, replacement, modules):\n            continue\n", "",
           caught_at=2, caught_by="in_place_on_replacement"),
    Mutant("collapses_any_repeated_function",
           'if op_kind(node, modules) == "relu" and op_kind(inner, modules) == "relu":',
           'if (op_kind(node, modules) == "relu" and op_kind(inner, modules) == "relu") or (isinstance(inner, fx.Node) '
           'and node.op == inner.op == "call_function" and node.target == inner.target and len(node.args) == 1):',
           caught_at=2),
    # Knows a relu by "relu" in its name: relu6(relu(x)) -> relu(x), relu(leaky_relu(x)) -> leaky_relu(x).
    Mutant("relu_by_name", 'if op_kind(node, modules) == "relu" and op_kind(inner, modules) == "relu":',
           f'if isinstance(inner, fx.Node) and all("relu" in {NAME}.lower() for n in (node, inner)):',
           caught_at=2, caught_by="relu_lookalikes"),
    Mutant("misses_nn_relu_modules", 'MODULES = {nn.ReLU: "relu"}', "MODULES = {}", caught_at=2),
    # x + 0 left alone whatever the dtype (the -0.0 + 0 trap of floats), integers included.
    Mutant("never_plus_zero_for_integers", ADD_ZERO,
           "        if isinstance(x, fx.Node) and is_negative_zero(zero):\n",
           caught_at=2, caught_by="integer_identities"),
    # x + 0 rewritten for integers only: -0.0, the one float zero that adds exactly, is not known as an identity.
    Mutant("never_plus_negative_zero", ADD_ZERO,
           "        if isinstance(x, fx.Node) and is_positive_zero(zero, modules) and meta(x) and not is_float(x):\n",
           caught_at=2, caught_by="plus_negative_zero"),
    # The promotion predicted with torch.promote_types, a Python float taken for a float32 tensor: h * 1.0 on a
    # float16 h is thought to become float32, so it is left alone (torch.result_type keeps float16).
    Mutant("python_float_promotes_half", "    a, b = node.args\n",
           "    a, b = node.args\n"
           "    tensor, literal = (a, b) if isinstance(a, fx.Node) else (b, a)\n"
           "    if (is_literal_number(literal) and meta(tensor)\n"
           "            and torch.promote_types(meta(tensor).dtype, torch.tensor(literal).dtype) != meta(tensor).dtype):\n"
           "        return None  # the literal would promote x\n",
           caught_at=2, caught_by="half_precision"),
    # Erases the constant a rewrite leaves unused, but not its own inputs: torch.ones(x.shape[-1], device=x.device)
    # goes, x.shape, its [-1] and x.device stay behind, dead.
    Mutant("erases_dead_inputs_one_level",
           "    graph.erase_node(node)\n    for input_node in inputs:\n        erase_if_dead(input_node, graph)\n",
           "    graph.erase_node(node)\n", caught_at=2, caught_by="ones_and_zeros_tensors"),
    # Collapses a relu pair only when the inner relu has no other user, as a fusion pass does; but relu(y) is y
    # whoever else reads y.
    Mutant("relu_pair_needs_a_single_user",
           'if op_kind(node, modules) == "relu" and op_kind(inner, modules) == "relu":',
           'if op_kind(node, modules) == "relu" and op_kind(inner, modules) == "relu" and len(inner.users) == 1:',
           caught_at=2, caught_by="relu_chain_with_other_user"),
    Mutant("top_level_module_names_only", "return MODULES.get(type(modules.get(node.target)))",
           'return MODULES.get(type(getattr(modules[""], node.target, None)))', caught_at=4),
    # Only in-place ops count as writes: a call's out= tensor is written too.
    Mutant("out_is_no_write", "            if is_in_place(user, modules) or writes_into(user, value):\n",
           "            if is_in_place(user, modules):\n", caught_at=2, caught_by="written_through_out"),
]

VARIANTS = [
    # Where only the dtype differs (int * 1.0, int / 1, bool * 1, half * float32 ones), x.to(dtype) is exact:
    # Inductor's remove_no_ops inserts prims.convert_element_type the same way.
    Variant("converts_promoted_dtypes", "        if replacement is None or not same_tensor_type(node, replacement):\n",
            "        if (replacement is not None and replacement is identity_operand(node, modules) and meta(node)\n"
            "                and meta(replacement) and meta(node).shape == meta(replacement).shape\n"
            "                and meta(node).dtype != meta(replacement).dtype):\n"
            "            with graph.inserting_before(node):\n"
            "                replacement = graph.call_method(\"to\", (replacement, meta(node).dtype))\n"
            "            replacement.meta = dict(node.meta)\n"
            "        if replacement is None or not same_tensor_type(node, replacement):\n"),
    # Inductor's is_mutated (joint_graph.py, remove_no_ops, pytorch/pytorch#174187): a user mutates a value when the
    # argument of its op's schema that receives it is annotated as written (Tensor(a!)). A torch-level call is looked
    # up as the ATen op of its name (y.add_(1) -> aten.add_, torch.add(a, b, out=y) -> aten.add.out); the name rule
    # stays for what has no ATen op, and views are still followed, as the README asks (Inductor's graphs have none).
    Variant("in_place_by_schema",
            "def written_through(node: fx.Node, modules: dict, skip: fx.Node | None = None) -> bool:\n",
            "def writes(user: fx.Node, value: fx.Node, modules: dict) -> bool:\n"
            "    if user.op == \"call_module\":\n"
            "        return getattr(modules.get(user.target), \"inplace\", False) is True  # a module has no schema\n"
            "    if user.op not in (\"call_function\", \"call_method\"):\n"
            "        return False\n"
            "    if user.kwargs.get(\"inplace\") is True:  # F.relu(y, inplace=True): its schema is aten.relu's\n"
            "        return True\n"
            "    try:\n"
            "        packet = getattr(torch.ops.aten, _name(user))\n"
            "        schemas = [getattr(packet, overload)._schema for overload in packet.overloads()]\n"
            "    except (AttributeError, RuntimeError):  # no ATen op of that name: the name rule\n"
            "        return is_in_place(user, modules)\n"
            "    positions = [i for i, arg in enumerate(user.args) if arg is value]\n"
            "    names = {name for name, arg in user.kwargs.items() if arg is value}\n"
            "    for schema in schemas:\n"
            "        positional = [a for a in schema.arguments if not a.kwarg_only]\n"
            "        received = [positional[i] for i in positions if i < len(positional)]\n"
            "        received += [a for a in schema.arguments if a.name in names]\n"
            "        if any(a.alias_info is not None and a.alias_info.is_write for a in received):\n"
            "            return True\n"
            "    return False\n\n\n"
            "def written_through(node: fx.Node, modules: dict, skip: fx.Node | None = None) -> bool:\n"
            "    seen, reached = set(), [node]\n"
            "    while reached:\n"
            "        value = reached.pop()\n"
            "        for user in value.users:\n"
            "            if user is skip or (user, value) in seen:\n"
            "                continue\n"
            "            seen.add((user, value))\n"
            "            if writes(user, value, modules):\n"
            "                return True\n"
            "            if user.op in (\"call_function\", \"call_method\") and _name(user) in VIEW_OPS and user.args \\\n"
            "                    and user.args[0] is value:\n"
            "                reached.append(user)\n"
            "    return False\n\n\n"
            "def written_through_by_name(node: fx.Node, modules: dict, skip: fx.Node | None = None) -> bool:\n"),
    # Inductor's remove_noop_ops (post_grad.py): "Don't introduce new aliasing between inputs and outputs": a copy
    # whose result is returned stays where its replacement is an input or shares its memory with another output (the
    # graders accept outputs that share, and outputs kept apart: a hidden model where this keeps one identity).
    Variant("keeps_a_copy_rather_than_share_outputs",
            "        if not aliasing_is_safe(node, replacement, modules):\n            continue\n",
            """        if not aliasing_is_safe(node, replacement, modules):
            continue

        def storage(value):  # the node whose memory `value` shares: views followed back to their base
            while (isinstance(value, fx.Node) and value.op in ("call_function", "call_method")
                   and _name(value) in VIEW_OPS and value.args and isinstance(value.args[0], fx.Node)):
                value = value.args[0]
            return value

        outputs = next(n for n in reversed(graph.nodes) if n.op == "output").all_input_nodes
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        output_storages = {storage(n) for n in outputs}
        if storage(node) is not storage(replacement):  # not a view: a copy that keeps its result apart
            if storage(node) in output_storages and (storage(replacement) in placeholders
                                                     or storage(replacement) in output_storages):
                continue
        elif node in outputs and (replacement in placeholders or replacement in outputs):
            continue
"""),
]
