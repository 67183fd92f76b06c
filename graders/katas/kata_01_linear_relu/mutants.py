"""Kata 01: plausible wrong solutions, each caught at the level that should catch it."""
from graders.run import Mutant, Variant

FORWARD = "        return F.linear(x, self.weight, self.bias).relu_()"
REWIRE = "        relu_node.replace_all_uses_with(fused_node)\n        gm.graph.erase_node(relu_node)\n"
# From the fused module's last line in __init__ to its forward's return: one piece, to change both.
INIT_TO_FORWARD = ('        self.register_parameter("bias", linear.bias)  # accepts None, for a Linear without bias\n\n'
                   "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
                   "        # The ReLU overwrites the fresh GEMM output: no second tensor, no second module call.\n"
                   + FORWARD)
INSTALL = "        gm.set_submodule(linear_node.target, FusedLinearReLU(modules[linear_node.target]))\n"
NO_OP = Mutant("no_op", "    modules = dict(gm.named_modules())\n    calls",
               "    return gm\n    modules = dict(gm.named_modules())\n    calls", caught_at=1)
DROPS_THE_BIAS = Mutant("drops_the_bias", FORWARD, "        return F.linear(x, self.weight).relu_()", caught_at=1)

MUTANTS = [
    NO_OP,
    Mutant("forgets_recompile", "    gm.recompile()\n    return gm", "    return gm", caught_at=1),
    DROPS_THE_BIAS,
    Mutant("forgets_the_relu", FORWARD, "        return F.linear(x, self.weight, self.bias)", caught_at=1),
    Mutant("weight_as_buffer", "        self.weight = linear.weight\n",
           '        self.register_buffer("weight", linear.weight.detach().clone())\n', caught_at=1),
    # Outputs stay right (ReLU is idempotent): only the structure check sees the ReLU still running.
    Mutant("keeps_the_relu_node", REWIRE, "        linear_node.replace_all_uses_with(fused_node)\n", caught_at=1),
    Mutant("keeps_the_linear_node", "        gm.graph.erase_node(linear_node)\n", "", caught_at=1),
    Mutant("misses_inplace_spellings",
           'RELU_FUNCTIONS = {torch.relu, torch.relu_, F.relu}\nRELU_METHODS = {"relu", "relu_"}',
           'RELU_FUNCTIONS = {torch.relu, F.relu}\nRELU_METHODS = {"relu"}', caught_at=2),
    Mutant("misses_method_spelling", "        return node.target in RELU_METHODS", "        return False",
           caught_at=2, caught_by="method_relu"),
    Mutant("matches_functions_by_name", "        return node.target in RELU_FUNCTIONS",
           '        return "relu" in getattr(node.target, "__name__", "")',
           caught_at=2, caught_by="functional_relu6_not_fused"),
    Mutant("matches_modules_by_class_name", "type(modules.get(node.target)) is nn.ReLU",
           '"ReLU" in type(modules.get(node.target)).__name__', caught_at=2, caught_by="relu6_not_fused"),
    Mutant("matches_relu_modules_by_name", "type(modules.get(node.target)) is nn.ReLU",
           'type(modules.get(node.target)) is nn.ReLU or node.target.rsplit(".", 1)[-1] == "relu"',
           caught_at=2, caught_by="relu6_named_relu_not_fused"),
    Mutant("matches_linear_subclasses", "and type(modules.get(linear_node.target)) is nn.Linear)",
           "and isinstance(modules.get(linear_node.target), nn.Linear))",
           caught_at=2, caught_by="linear_subclass_not_fused"),
    Mutant("fuses_across_dropout", "        linear_node = _relu_input(relu_node)\n",
           "        linear_node = _relu_input(relu_node)\n"
           "        while isinstance(modules.get(getattr(linear_node, 'target', None)), nn.Dropout):\n"
           "            linear_node = linear_node.args[0]\n", caught_at=2, caught_by="dropout_between"),
    Mutant("fuses_linear_with_another_user", "        if len(linear_node.users) != 1:", "        if False:",
           caught_at=2, caught_by="linear_output_used_twice"),
    # "relu_ overwrites the Linear's output, so its other readers see the ReLU's values anyway": not those that
    # read it before the ReLU ran.
    Mutant("absorbs_readers_of_an_inplace_relu",
           "        if len(linear_node.users) != 1:        # another user needs the values before the ReLU\n",
           "        if len(linear_node.users) != 1 and relu_node.target in (torch.relu_, \"relu_\") \\\n"
           "                and calls[linear_node.target] == 1:  # in place: every reader sees the ReLU's values\n"
           "            gm.set_submodule(linear_node.target, FusedLinearReLU(modules[linear_node.target]))\n"
           "            with gm.graph.inserting_before(linear_node):\n"
           "                fused_node = gm.graph.call_module(linear_node.target, linear_node.args, linear_node.kwargs)\n"
           "            relu_node.replace_all_uses_with(fused_node)\n"
           "            gm.graph.erase_node(relu_node)\n"
           "            linear_node.replace_all_uses_with(fused_node)\n"
           "            gm.graph.erase_node(linear_node)\n"
           "            continue\n"
           "        if len(linear_node.users) != 1:        # another user needs the values before the ReLU\n",
           caught_at=2, caught_by="linear_output_used_twice_inplace"),
    Mutant("fuses_at_shared_linear_module", "        if calls[linear_node.target] != 1:", "        if False:",
           caught_at=2, caught_by="linear_module_shared"),
    Mutant("deletes_the_relu_module", REWIRE,
           REWIRE + '        if relu_node.op == "call_module":\n            gm.delete_submodule(relu_node.target)\n',
           caught_at=2, caught_by="relu_module_shared"),
    Mutant("rewires_only_the_first_user", "        relu_node.replace_all_uses_with(fused_node)\n",
           "        next(iter(relu_node.users)).replace_input_with(relu_node, fused_node)\n",
           caught_at=2, caught_by="relu_output_used_twice"),
    Mutant("refuses_training_mode", "        if calls[linear_node.target] != 1:",
           "        if modules[linear_node.target].training:\n            continue\n"
           "        if calls[linear_node.target] != 1:", caught_at=2, caught_by="trains_like_the_original"),
    Mutant("crashes_without_bias", 'self.register_parameter("bias", linear.bias)',
           "self.bias = nn.Parameter(linear.bias.detach().clone())", caught_at=2),
    Mutant("assumes_2d_input", FORWARD, "        return torch.addmm(self.bias, x, self.weight.t()).relu_()",
           caught_at=2),
    Mutant("forward_under_no_grad", FORWARD, "        with torch.no_grad():  # inference only\n    " + FORWARD,
           caught_at=2, caught_by="trains_like_the_original"),
    Mutant("setattr_with_dotted_name", "gm.set_submodule(linear_node.target,", "setattr(gm, linear_node.target,",
           caught_at=2, caught_by="nested_dotted_names"),
    # The Linear, shared with the caller's model, becomes a FusedLinearReLU in place: same parameters, right
    # outputs and structure in gm, but the caller's model now runs a ReLU after every fused Linear.
    Mutant("converts_the_callers_linear", INSTALL,
           "        modules[linear_node.target].__class__ = FusedLinearReLU  # in place: no copy, no new module\n",
           caught_at=2, caught_by="traced_model_keeps_its_modules"),
    # A ReLU spelled torch.relu(input=y) or self.act(input=y) has no positional argument: node.args[0] raises.
    Mutant("reads_only_the_first_positional_argument",
           '    return node.args[0] if node.args else node.kwargs.get("input")', "    return node.args[0]", caught_at=2),
    # Rewires the users' top-level args and kwargs only: a ReLU read inside a tuple output or a list argument
    # (torch.cat([r, x])) keeps its user, and erase_node refuses to erase it.
    Mutant("rewires_only_top_level_arguments", "        relu_node.replace_all_uses_with(fused_node)\n",
           "        for user in list(relu_node.users):\n"
           "            user.args = tuple(fused_node if a is relu_node else a for a in user.args)\n"
           "            user.kwargs = {k: fused_node if v is relu_node else v for k, v in user.kwargs.items()}\n",
           caught_at=2, caught_by="relu_read_in_a_tuple_output"),
    # Right outputs in a learner's run, which runs the class itself; a competition's worker traces it with
    # torch.fx (README, "Trust model"), and tracing cannot take a branch on the input's rank.
    Mutant("branches_on_input_rank", FORWARD,
           "        if x.dim() == 2 and self.bias is not None:  # one addmm for a matrix input\n"
           "            return torch.addmm(self.bias, x, self.weight.t()).relu_()\n" + FORWARD, caught_at=1),
    Mutant("only_names_seen_in_visible_models", "        linear_node = _relu_input(relu_node)\n",
           "        linear_node = _relu_input(relu_node)\n"
           '        if not isinstance(linear_node, fx.Node) or "fc" not in str(linear_node.target):\n'
           "            continue\n", caught_at=4),
    # Computes into a buffer of its own and returns it: no fresh bytes at all, right outputs call by call, but
    # the next call overwrites the result the caller holds (the run path looks back: graders/run/numerics.py).
    Mutant("returns_its_own_buffer", INIT_TO_FORWARD,
           INIT_TO_FORWARD.replace(
               "\n\n    def forward",
               '\n        self.register_buffer("out", torch.empty(0), persistent=False)  # reused: nothing to allocate'
               "\n\n    def forward").replace(FORWARD, "        return torch.addmm(self.bias, x, self.weight.t(), out=self.out).relu_()"),
           caught_at=1),
    # Each spelling of ReLU is a check of its own: a pass that lists one function and not the other, or that
    # leaves an in-place ReLU alone ("it overwrites the Linear's output": which has no other user), fuses less.
    Mutant("misses_torch_relu", "RELU_FUNCTIONS = {torch.relu, torch.relu_, F.relu}",
           "RELU_FUNCTIONS = {torch.relu_, F.relu}", caught_at=2, caught_by="torch_relu"),
    Mutant("misses_functional_relu", "RELU_FUNCTIONS = {torch.relu, torch.relu_, F.relu}",
           "RELU_FUNCTIONS = {torch.relu, torch.relu_}", caught_at=2, caught_by="functional_relu"),
    Mutant("leaves_functional_inplace_relu", "        return node.target in RELU_FUNCTIONS",
           '        return node.target in RELU_FUNCTIONS and not node.kwargs.get("inplace")',
           caught_at=2, caught_by="functional_relu_inplace"),
    Mutant("leaves_inplace_relu_modules", "type(modules.get(node.target)) is nn.ReLU",
           "type(modules.get(node.target)) is nn.ReLU and not modules[node.target].inplace",
           caught_at=2, caught_by="relu_module_inplace"),
    # Stops after the first pair (a return or break inside the loop): the basic model has one.
    Mutant("fuses_only_the_first_pair", "        gm.graph.erase_node(linear_node)\n",
           "        gm.graph.erase_node(linear_node)\n        break  # done\n", caught_at=2, caught_by="several_layers"),
    # Preallocates the result in the default dtype: a float64 model's matmul refuses to write float32.
    Mutant("output_in_the_default_dtype", FORWARD,
           "        out = torch.empty(x.shape[:-1] + (self.out_features,), device=x.device)\n"
           "        torch.matmul(x, self.weight.t(), out=out)\n"
           "        return (out if self.bias is None else out.add_(self.bias)).relu_()",
           caught_at=2, caught_by="float64_model"),
    # Right outputs and structure, but every layer still writes a second tensor: only L3 counts it.
    Mutant("fused_relu_out_of_place", FORWARD, "        return F.relu(F.linear(x, self.weight, self.bias))",
           caught_at=3),
]

VARIANTS = [
    # The README allows installing the fused module under a new name for its one call site.
    Variant("installs_under_a_new_name", INSTALL + "        with gm.graph.inserting_before(relu_node):\n"
            "            fused_node = gm.graph.call_module(linear_node.target,",
            '        fused_name = linear_node.target + "_relu"  # the unused Linear goes at the end\n'
            "        gm.add_submodule(fused_name, FusedLinearReLU(modules[linear_node.target]))\n"
            "        with gm.graph.inserting_before(relu_node):\n"
            "            fused_node = gm.graph.call_module(fused_name,"),
    # A name that is no Python identifier (`0_relu`, `layers.1 fused`): add_submodule takes it, torch.fx
    # writes getattr(self, "0_relu") for it, and the judge must take it too.
    Variant("installs_under_a_name_that_is_no_identifier", INSTALL + "        with gm.graph.inserting_before(relu_node):\n"
            "            fused_node = gm.graph.call_module(linear_node.target,",
            '        fused_name = f"{len(gm.graph.nodes)}_relu {linear_node.target}"\n'
            "        gm.add_submodule(fused_name, FusedLinearReLU(modules[linear_node.target]))\n"
            "        with gm.graph.inserting_before(relu_node):\n"
            "            fused_node = gm.graph.call_module(fused_name,"),
]
