"""Kata 09: plausible wrong solutions, each caught at the level that should catch it."""
from graders.run import Mutant

ERASE_SUBGRAPH = "        dead = {root, *interior}\n"
NO_OP = Mutant("no_op", "    modules = dict(gm.named_modules())\n    replaced = 0\n",
               "    return 0\n    modules = dict(gm.named_modules())\n    replaced = 0\n", caught_at=1)

MUTANTS = [
    NO_OP,
    Mutant("emits_exact_gelu", '(x,), {"approximate": "tanh"})', "(x,), {})", caught_at=1),
    Mutant("forgets_recompile", "    gm.graph.lint()\n    gm.recompile()\n", "    gm.graph.lint()\n", caught_at=1),
    Mutant("erases_only_the_root", ERASE_SUBGRAPH, "        dead = {root}\n", caught_at=1),
    Mutant("cube_only_as_pow",
           "    for square, single in _both_orders(node, MUL):\n"
           "        if single is x and _binary_operands(square, MUL) == (x, x):\n"
           "            return [node, square]\n", "", caught_at=2),
    Mutant("cube_x_x_x_one_association_only", "for square, single in _both_orders(node, MUL):",
           "for square, single in [_binary_operands(node, MUL) or (None, None)]:", caught_at=2),
    Mutant("one_plus_tanh_written_order_only", "for one, tanh in _both_orders(one_plus, ADD):",
           "for one, tanh in [_binary_operands(one_plus, ADD) or (None, None)]:", caught_at=2),
    Mutant("cubic_term_written_order_only", "for k, cube in _both_orders(cubic_term, MUL):",
           "for k, cube in [_binary_operands(cubic_term, MUL) or (None, None)]:", caught_at=2),
    Mutant("constants_compared_loosely", "rel_tol=CONSTANT_RTOL)", "abs_tol=0.01)", caught_at=2),
    Mutant("constants_compared_exactly", "rel_tol=CONSTANT_RTOL)", "rel_tol=0)", caught_at=2),
    Mutant("replaces_when_interior_used_elsewhere",
           "        if not _used_only_inside(interior, root):\n            continue\n", "",
           caught_at=2, caught_by="tanh_used_elsewhere"),
    Mutant("cube_of_any_tensor", "operands[0] is x and operands[1] in (3, 3.0)", "operands[1] in (3, 3.0)",
           caught_at=2, caught_by="cube_of_another_tensor"),
    Mutant("outer_factor_of_any_tensor", "if tanh_part is not None and tanh_part[0] is x:",
           "if tanh_part is not None:", caught_at=2, caught_by="outer_factor_another_tensor"),
    # Takes x from the cube and only asks that the linear term be some node: y + 0.044715 * x**3 matches.
    Mutant("linear_term_of_any_tensor",
           "            for x, cubic_term in _both_orders(inner_sum, ADD):\n"
           "                for k, cube in _both_orders(cubic_term, MUL):\n"
           "                    cube_nodes = _match_cube(cube, x) if _is_constant(k, CUBIC) else None\n",
           "            for linear, cubic_term in _both_orders(inner_sum, ADD):\n"
           "                for k, cube in _both_orders(cubic_term, MUL):\n"
           "                    bases = [a for a in getattr(cube, 'args', ()) if isinstance(a, fx.Node)]\n"
           "                    x = next((b for b in bases if _match_cube(cube, b)), None)  # the cube's base\n"
           "                    cube_nodes = (_match_cube(cube, x) if _is_constant(k, CUBIC) and isinstance(linear, fx.Node)\n"
           "                                  else None)\n", caught_at=2, caught_by="linear_term_another_tensor"),
    Mutant("one_of_any_value", "        if not _is_constant(one, ONE) or argument is None:",
           "        if argument is None:", caught_at=2, caught_by="two_plus_tanh"),
    Mutant("one_plus_optional", "    for one, tanh in _both_orders(one_plus, ADD):",
           "    for one, tanh in [*_both_orders(one_plus, ADD), (ONE, one_plus)]:",
           caught_at=2, caught_by="tanh_without_one"),
    Mutant("tanh_module_by_class_name", "isinstance(modules.get(node.target), nn.Tanh)",
           '"Tanh" in type(modules.get(node.target)).__name__', caught_at=2, caught_by="tanhshrink_module_not_tanh"),
    Mutant("returns_whether_changed", "    return replaced\n", "    return int(replaced > 0)\n",
           caught_at=2, caught_by="chained_gelus"),
    Mutant("tanh_module_found_by_name", "isinstance(modules.get(node.target), nn.Tanh)",
           'str(node.target).rsplit(".", 1)[-1] == "tanh"', caught_at=4),
]

