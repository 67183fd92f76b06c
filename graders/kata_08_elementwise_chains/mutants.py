"""Kata 08: plausible wrong solutions, each caught at the level that should catch it."""
from graders.mutation import Mutant, Variant

NO_OP = Mutant("no_op", "    modules = dict(gm.named_modules())\n    chains = find_elementwise_chains(gm)",
               "    return 0\n    modules = dict(gm.named_modules())\n    chains = find_elementwise_chains(gm)",
               caught_at=1)
ONE_USER = "if source in elementwise and len(source.users) == 1:"
GRAD_MODE = "    grad = torch.is_grad_enabled()\n"
HEAD_STEP = "            if index > 0 and _fits_in_place(step, value, args, kwargs):"

MUTANTS = [
    NO_OP,
    Mutant("returns_nodes_fused_not_chains", "    return len(chains)", "    return sum(len(c) for c in chains)",
           caught_at=1),
    Mutant("forgets_recompile", "    gm.recompile()\n    return len(chains)", "    return len(chains)", caught_at=1),
    Mutant("misses_method_spellings", "return METHOD_KINDS.get(node.target)", "return None", caught_at=2),
    Mutant("misses_module_spellings", 'MODULE_KINDS = {nn.ReLU: "relu", nn.Sigmoid: "sigmoid", nn.Tanh: "tanh"}',
           "MODULE_KINDS = {}", caught_at=2),
    Mutant("crosses_multi_user_node", ONE_USER, "if source in elementwise and len(source.users) >= 1:", caught_at=2),
    Mutant("graph_output_as_interior", ONE_USER,
           "if source in elementwise and len([u for u in source.users if u.op != 'output']) == 1:", caught_at=2),
    Mutant("treats_inplace_methods_as_elementwise", "return METHOD_KINDS.get(node.target)",
           "return METHOD_KINDS.get(node.target.rstrip('_'))", caught_at=2),
    Mutant("ignores_inplace_kwarg", 'if "out" in node.kwargs or node.kwargs.get("inplace", False):',
           'if "out" in node.kwargs:', caught_at=2),
    Mutant("treats_dropout_as_elementwise", '    torch.tanh: "tanh",\n', '    torch.tanh: "tanh", F.dropout: "neg",\n',
           caught_at=2),
    Mutant("keeps_single_node_chains", "if node in successor and node not in has_predecessor:",
           "if node in elementwise and node not in has_predecessor:", caught_at=2),
    Mutant("picks_last_eligible_input", "for source in node.all_input_nodes:",
           "for source in reversed(node.all_input_nodes):", caught_at=2),
    Mutant("orders_chains_by_name", "    return chains\n", "    return sorted(chains, key=lambda c: c[0].name)\n",
           caught_at=2),
    Mutant("inserts_fused_node_at_head", "with gm.graph.inserting_before(tail):",
           "with gm.graph.inserting_before(chain[0]):", caught_at=2),
    Mutant("puts_chain_value_first", "BINARY_FUNCTIONS[step.kind](*args, **kwargs, out=value)",
           "BINARY_FUNCTIONS[step.kind](value, *[a for a in args if a is not value], **kwargs, out=value)",
           caught_at=2),
    Mutant("ignores_broadcast_growth", "                return False  # the result is larger",
           "                pass  # the result is larger", caught_at=2),
    Mutant("ignores_dtype_promotion", "    return dtype == value.dtype", "    return True", caught_at=2),
    # Runs every step after the head in place even when autograd needs the overwritten value (a sigmoid's
    # output) or a parameter operand requires grad: outputs under no_grad are right, backward is not.
    Mutant("in_place_under_autograd", GRAD_MODE, "    grad = False\n", caught_at=2),
    # The head step writes into the tensor it reads (the caller's input) when the result fits it.
    Mutant("writes_into_its_input", HEAD_STEP,
           "            if index == 0 and isinstance(args[0], torch.Tensor) and _fits_in_place(step, args[0], args, kwargs):\n"
           "                value = args[0]\n"
           "            if value is not None and _fits_in_place(step, value, args, kwargs):", caught_at=2),
    # Runs the chain without autograd (for speed): the outputs are right, but no gradient flows back.
    Mutant("fused_node_under_no_grad", "    def forward(self, *inputs):\n        value = None",
           "    @torch.no_grad()\n    def forward(self, *inputs):\n        value = None", caught_at=2),
    Mutant("modules_by_attribute_name", "        module = modules.get(node.target)\n",
           "        return {'relu': 'relu', 'sigmoid': 'sigmoid', 'tanh': 'tanh'}.get(node.target.split('.')[-1])\n"
           "        module = modules.get(node.target)\n", caught_at=4),
    # The fused node is one node, numerically right, but still runs the ops one by one: only L3 sees it.
    Mutant("fused_node_calls_ops_one_by_one", GRAD_MODE, "    return False\n" + GRAD_MODE, caught_at=3),
]

VARIANTS = [
    # More cautious than the reference: no in-place step at all while grad mode is on, even where nothing
    # requires grad (the speed level runs under torch.no_grad, so it keeps its speed there).
    Variant("out_of_place_whenever_grad_is_on", "or (grad and value.requires_grad):", "or grad:"),
]
