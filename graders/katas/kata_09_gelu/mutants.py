"""Kata 09: plausible wrong solutions, each caught at the level that should catch it."""
from graders.run import Mutant, Variant

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
    # Lists the cube's functions, not its operator: x ** 3 traces to operator.pow.
    Mutant("misses_pow_operator", 'POW = {operator.pow, torch.pow, "pow"}', 'POW = {torch.pow, "pow"}',
           caught_at=2, caught_by="cube_pow_operator"),
    # Lists the cube's functions, not the Tensor method: x.pow(3) traces to call_method 'pow'.
    Mutant("misses_pow_method", 'POW = {operator.pow, torch.pow, "pow"}', 'POW = {operator.pow, torch.pow}',
           caught_at=2, caught_by="cube_method_pow"),
    Mutant("misses_tanh_method", 'TANH = {torch.tanh, "tanh"}', "TANH = {torch.tanh}",
           caught_at=2, caught_by="tanh_method"),
    Mutant("misses_tanh_module",
           '    if _calls(node, TANH) or (node.op == "call_module" and isinstance(modules.get(node.target), nn.Tanh)):\n',
           "    if _calls(node, TANH):\n", caught_at=2, caught_by="tanh_module"),
    # Looks for the 0.5 inside the inner product only (0.5 * x, or 0.5 * (1 + t)): x * (1 + t) * 0.5 has it outside.
    Mutant("half_inside_the_inner_product_only", "for half, x, one_plus in permutations((outer, *inner_operands)):",
           "for half, x, one_plus in [(a, b, outer) for a, b in permutations(inner_operands)]"
           " + [(a, outer, b) for a, b in permutations(inner_operands)]:",
           caught_at=2, caught_by="half_applied_last"),
    # Looks for x inside the inner product only (0.5 * x, or x * (1 + t)): x * (0.5 * (1 + t)) has it outside.
    Mutant("x_inside_the_inner_product_only", "for half, x, one_plus in permutations((outer, *inner_operands)):",
           "for half, x, one_plus in [(outer, a, b) for a, b in permutations(inner_operands)]"
           " + [(b, a, outer) for a, b in permutations(inner_operands)]:",
           caught_at=2, caught_by="half_times_tanh_part"),
    # Asks that every node of the match feed only the match, x included: x's other users are no reason to skip.
    Mutant("requires_x_used_only_inside", "if not _used_only_inside(interior, root):",
           "if not _used_only_inside([x, *interior], root):", caught_at=2, caught_by="gelu_input_used_elsewhere"),
    # Only asks that the third factor be a constant, not 0.5: x * (1.0 * (1 + t)) is twice a GELU.
    Mutant("half_any_constant", "            if not _is_constant(half, HALF):\n                continue\n",
           "            if isinstance(half, fx.Node):\n                continue\n", caught_at=2, caught_by="half_missing"),
    # Matches the outer product 0.5 * x * (1 + f(...)) only, and takes every node between it and x as the subgraph:
    # the exact GELU 0.5 * x * (1 + erf(x / sqrt(2))) has that shape too.
    Mutant("matches_the_outer_product_only",
           "            tanh_part = _match_tanh_part(one_plus, modules)\n"
           "            if tanh_part is not None and tanh_part[0] is x:\n"
           "                return x, [inner, *tanh_part[1]]\n",
           "            operands = _binary_operands(one_plus, ADD)\n"
           "            if operands is None or not any(_is_constant(o, ONE) for o in operands) or not isinstance(x, fx.Node):\n"
           "                continue\n"
           "            nodes, stack = [], [one_plus]\n"
           "            while stack:  # back from 1 + f(...) to x\n"
           "                node = stack.pop()\n"
           "                if node is not x and node not in nodes:\n"
           "                    nodes.append(node)\n"
           "                    stack.extend(node.all_input_nodes)\n"
           "            return x, [inner, *nodes]\n",
           caught_at=2, caught_by="exact_erf_gelu"),
    # Takes QuickGELU, x * sigmoid(1.702 * x), for the same approximation and rewrites it too.
    Mutant("rewrites_quick_gelu_too", "    for outer, inner in _both_orders(root, MUL):\n",
           "    for x, gate in _both_orders(root, MUL):\n"
           "        scaled = gate.args[0] if _calls(gate, {torch.sigmoid, \"sigmoid\"}) and len(gate.args) == 1 else None\n"
           "        operands = _binary_operands(scaled, MUL) or ()\n"
           "        if isinstance(x, fx.Node) and x in operands and any(_is_constant(o, 1.702) for o in operands):\n"
           "            return x, [gate, scaled]\n"
           "    for outer, inner in _both_orders(root, MUL):\n",
           caught_at=2, caught_by="quick_gelu_sigmoid"),
    Mutant("tanh_module_found_by_name", "isinstance(modules.get(node.target), nn.Tanh)",
           'str(node.target).rsplit(".", 1)[-1] == "tanh"', caught_at=4),
]


VARIANTS = [
    # An nn.GELU(approximate="tanh") module instead of the function, installed under a fresh name: the module form
    # torch.fx passes that swap modules in produce (add_submodule, then call_module).
    Variant("installs_an_nn_gelu_module",
            "            gelu = gm.graph.call_function(F.gelu, (x,), {\"approximate\": \"tanh\"})\n",
            "            name = next(f\"gelu_{i}\" for i in range(len(gm.graph.nodes) + 1) if not hasattr(gm, f\"gelu_{i}\"))\n"
            "            gm.add_submodule(name, nn.GELU(approximate=\"tanh\"))\n"
            "            gelu = gm.graph.call_module(name, (x,))\n"),
]
