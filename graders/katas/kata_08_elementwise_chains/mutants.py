"""Kata 08: plausible wrong solutions, each caught at the level that should catch it."""
from graders.run import Mutant, Variant

NO_OP = Mutant("no_op", "    modules = dict(gm.named_modules())\n    chains = find_elementwise_chains(gm)",
               "    return 0\n    modules = dict(gm.named_modules())\n    chains = find_elementwise_chains(gm)",
               caught_at=1)
ONE_USER = "if source in elementwise and len(source.users) == 1:"
PLAN = "        steps = plan_in_place(steps)\n"
FUSE_TAIL = ("        children = {step.target: modules[chain[position].target]\n"
             "                    for position, step in enumerate(steps) if step.op == \"call_module\"}\n"
             "        name = f\"fused_chain_{number}\"\n"
             "        while hasattr(gm, name):\n"
             "            name += \"_\"\n"
             "        tensor_inputs = tuple(i for i, node in enumerate(inputs) if not is_number(node))\n"
             "        gm.add_submodule(name, FusedElementwiseChain(steps, children, tensor_inputs, len(inputs)))\n")

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
           "if source in elementwise and len([u for u in source.users if u.op != 'output']) == 1:",
           caught_at=2, caught_by="find_graph_output_interior"),
    Mutant("treats_inplace_methods_as_elementwise", "return METHOD_KINDS.get(node.target)",
           "return METHOD_KINDS.get(node.target.rstrip('_'))", caught_at=2, caught_by="find_inplace_ops_break"),
    Mutant("ignores_inplace_kwarg", 'if "out" in node.kwargs or node.kwargs.get("inplace", False):',
           'if "out" in node.kwargs:', caught_at=2, caught_by="find_inplace_ops_break"),
    Mutant("treats_dropout_as_elementwise", '    torch.tanh: "tanh",\n', '    torch.tanh: "tanh", F.dropout: "neg",\n',
           caught_at=2, caught_by="find_random_ops_break"),
    Mutant("keeps_single_node_chains", "if node in successor and node not in has_predecessor:",
           "if node in elementwise and node not in has_predecessor:", caught_at=2),
    Mutant("picks_last_eligible_input", "for source in node.all_input_nodes:",
           "for source in reversed(node.all_input_nodes):", caught_at=2),
    # At a join, lets the chain that started first go on (not the first input's, as the README says).
    Mutant("earliest_chain_takes_the_join",
           "        for source in node.all_input_nodes:\n"
           "            # Its only user is `node` (the output node counts as a user): nothing else needs its value,\n"
           "            # so it can live inside the fused node. The first such input continues the chain.\n"
           "            if source in elementwise and len(source.users) == 1:\n"
           "                successor[source] = node\n"
           "                break\n",
           "        eligible = [s for s in node.all_input_nodes if s in elementwise and len(s.users) == 1]\n"
           "        before = {v: k for k, v in successor.items()}\n"
           "        order = list(gm.graph.nodes)\n"
           "\n"
           "        def started(s):\n"
           "            while s in before:\n"
           "                s = before[s]\n"
           "            return order.index(s)\n"
           "\n"
           "        if eligible:\n"
           "            successor[min(eligible, key=started)] = node\n",
           caught_at=2, caught_by="find_join_first_input_started_later"),
    # Ops that act elementwise but are not among the README's ten join chains (run out of place, exactly).
    Mutant("treats_look_alikes_as_elementwise", '    torch.tanh: "tanh",\n',
           '    torch.tanh: "tanh", torch.clamp: "abs", torch.sqrt: "abs", F.gelu: "abs",\n',
           caught_at=2, caught_by="find_look_alikes_break"),
    # Rewrites the nodes in positional args only: a value passed by keyword (torch.sigmoid(input=v)) stays a
    # graph node inside the fused module's plan, and running it fails.
    Mutant("plans_positional_arguments_only", "map_arg(node.kwargs, to_template)))", "dict(node.kwargs)))",
           caught_at=2, caught_by="fuse_value_by_keyword"),
    # "add and mul commute": puts the chain's value first, alpha= or not (torch.add(y, v, alpha=3) is y + 3v).
    Mutant("commutes_add_with_alpha", "map_arg(node.args, to_template), map_arg(node.kwargs, to_template)))",
           "(lambda a: a[::-1] if elementwise_kind(node, modules) in ('add', 'mul') and len(a) == 2 "
           "and a[1] is CHAIN_VALUE else a)(map_arg(node.args, to_template)), map_arg(node.kwargs, to_template)))",
           caught_at=2, caught_by="fuse_alpha_on_the_value"),
    Mutant("orders_chains_by_name", "    return chains\n", "    return sorted(chains, key=lambda c: c[0].name)\n",
           caught_at=2, caught_by="find_chains_in_graph_order"),
    Mutant("inserts_fused_node_at_head", "with gm.graph.inserting_before(tail):",
           "with gm.graph.inserting_before(chain[0]):", caught_at=2, caught_by="fuse_operand_defined_mid_chain"),
    Mutant("puts_chain_value_first", "map_arg(node.args, to_template), map_arg(node.kwargs, to_template)",
           "tuple(sorted(map_arg(node.args, to_template), key=lambda a: a is not CHAIN_VALUE)), "
           "map_arg(node.kwargs, to_template)", caught_at=2, caught_by="fuse_reversed_operands"),
    # Runs `value.add_(tensor)` in place too: wrong where the tensor operand promotes the dtype (a float64
    # operand of a float32 value), or, untiled, where it broadcasts the value larger.
    Mutant("in_place_with_tensor_operand",
           "by_a_number = len(step.args) == 2 and isinstance(step.args[1], (int, float))",
           "by_a_number = len(step.args) == 2", caught_at=2, caught_by="fuse_tensor_operand_promotes"),
    # Runs in place on a value that may be an integer tensor: `v.div_(2)` cannot promote it to float.
    Mutant("ignores_dtype_promotion", "and float_tensor and before.kind", "and before.kind",
           caught_at=2, caught_by="fuse_dtype_promotion"),
    # Overwrites a sigmoid's or relu's output, which their backward reads: outputs right, backward raises.
    Mutant("in_place_under_autograd", "and before.kind not in SAVES_RESULT:", ":",
           caught_at=2, caught_by="fuse_under_autograd"),
    # The head step writes into the tensor it reads (the caller's input) when it has an in-place form.
    Mutant("writes_into_its_input", "    planned = [steps[0]]  # the head",
           "    head = steps[0]\n"
           "    head_in_place = _in_place(Step(head.kind, head.op, head.target, (CHAIN_VALUE, *head.args[1:]), head.kwargs))\n"
           "    planned = [Step(head.kind, 'call_method', head.kind + '_', head.args, head_in_place.kwargs)\n"
           "               if head_in_place else head]  # the head", caught_at=2, caught_by="fuse_multi_user_interior"),
    # Runs the chain without autograd (for speed): the outputs are right, but no gradient flows back.
    Mutant("fused_node_under_no_grad", "    def forward(self, *inputs):\n        chain = self.chain",
           "    @torch.no_grad()\n    def forward(self, *inputs):\n        chain = self.chain",
           caught_at=2, caught_by="fuse_under_autograd"),
    # Links each elementwise node to its input with one user, forgetting to ask that the input be elementwise
    # too: the basic model's linear becomes the head of its chain.
    Mutant("links_non_elementwise_inputs", ONE_USER, "if len(source.users) == 1:",
           caught_at=1, caught_by="find_basic"),
    # Lists an op with an operator by its operator only: torch.add(a, b), torch.neg(v), ... are spellings too.
    Mutant("misses_torch_function_spellings",
           '    operator.add: "add", torch.add: "add",\n'
           '    operator.sub: "sub", torch.sub: "sub",\n'
           '    operator.mul: "mul", torch.mul: "mul",\n'
           '    operator.truediv: "div", torch.div: "div",\n'
           '    operator.neg: "neg", torch.neg: "neg",\n'
           '    operator.abs: "abs", torch.abs: "abs",\n',
           '    operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.truediv: "div",\n'
           '    operator.neg: "neg", operator.abs: "abs",\n',
           caught_at=2, caught_by="find_function_spellings"),
    # Takes the operators to be + - * / only: -v and abs(v) trace to operator.neg and operator.abs.
    Mutant("misses_unary_operators",
           '    operator.neg: "neg", torch.neg: "neg",\n    operator.abs: "abs", torch.abs: "abs",\n',
           '    torch.neg: "neg",\n    torch.abs: "abs",\n', caught_at=2, caught_by="find_operator_spellings"),
    # Runs a unary step in place with the keywords of its call: F.relu(v) traces with inplace=False, which
    # Tensor.relu_ does not take.
    Mutant("in_place_keeps_call_keywords",
           '    if step.kind in IN_PLACE_UNARY and len(step.args) == 1 and not kwargs:\n'
           '        return Step(step.kind, "call_method", step.kind + "_", step.args, {})\n',
           '    if step.kind in IN_PLACE_UNARY and len(step.args) == 1:\n'
           '        return Step(step.kind, "call_method", step.kind + "_", step.args, step.kwargs)\n',
           caught_at=2, caught_by="fuse_function_spellings"),
    Mutant("modules_by_attribute_name", "        module = modules.get(node.target)\n",
           "        return {'relu': 'relu', 'sigmoid': 'sigmoid', 'tanh': 'tanh'}.get(node.target.split('.')[-1])\n"
           "        module = modules.get(node.target)\n", caught_at=4),
    # The fused node is one node, numerically right, but still runs the ops one by one on the whole tensor
    # (no plan in place, no tiles): only L3 sees it.
    Mutant("fused_node_calls_ops_one_by_one", PLAN + FUSE_TAIL, FUSE_TAIL.replace("tensor_inputs, len(inputs)", "(), len(inputs)"),
           caught_at=3),
    # One buffer, every later op in place, no tiles (this kata's reference before tiling): no fresh tensors,
    # yet each op still reads and writes the whole tensor. The traffic count at L3 sees it; under glibc's
    # default allocator the clock alone would not (the page faults it saves read 3.8x).
    Mutant("reuses_one_buffer_untiled", "\nTILES = 64\n", "\nTILES = 1\n", caught_at=3),
    # Lets a call with out= join a chain: it writes into a tensor that others hold.
    Mutant("ignores_out_kwarg", 'if "out" in node.kwargs or node.kwargs.get("inplace", False):',
           'if node.kwargs.get("inplace", False):', caught_at=2, caught_by="find_out_keyword_breaks"),
    # Deletes each fused call_module's module from the GraphModule, though another node may still call it.
    Mutant("deletes_modules_still_called", "            gm.graph.erase_node(node)\n",
           "            gm.graph.erase_node(node)\n"
           "            if node.op == 'call_module':\n"
           "                gm.delete_submodule(node.target)\n", caught_at=2, caught_by="fuse_module_called_twice"),
]

VARIANTS = [
    # More cautious than the reference: nothing in place after a neg either (its backward needs nothing).
    Variant("no_in_place_after_neg", 'SAVES_RESULT = {"relu", "sigmoid", "tanh", "exp"}',
            'SAVES_RESULT = {"relu", "sigmoid", "tanh", "exp", "neg"}'),
]
