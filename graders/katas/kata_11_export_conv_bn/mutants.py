"""Kata 11: plausible wrong solutions, each caught at the level that should catch it."""
from graders.run import Mutant, Variant, reference_source

DOC = '    """A new program with every foldable convolution -> BatchNorm pair folded; `ep` is left as it was."""\n'
NEW_WEIGHT = '''        conv.args = (conv.args[0], parameter(f"{name}_folded", weight),
                     parameter(f"{name.rpartition('.')[0] or name}.bias_folded", bias), *conv.args[3:])
'''
RUN_TIME_FOLD = """        gamma, beta, mean, var, eps = *bn.args[1:5], bn.args[6]

        def op(target, *args):
            with graph.inserting_before(conv):
                node = graph.call_function(target, args)
            with fake_mode:
                node.meta["val"] = target(*[a.meta["val"] if isinstance(a, fx.Node) else a for a in args])
            return node

        scale = op(aten.rsqrt.default, op(aten.add.Tensor, var, eps))
        scale = scale if gamma is None else op(aten.mul.Tensor, scale, gamma)
        new_weight = op(aten.mul.Tensor, conv.args[1], op(aten.view.default, scale, [-1, 1, 1, 1]))
        new_bias = op(aten.neg.default, op(aten.mul.Tensor, mean, scale))
        if conv.args[2] is not None:
            new_bias = op(aten.add.Tensor, new_bias, op(aten.mul.Tensor, conv.args[2], scale))
        if beta is not None:
            new_bias = op(aten.add.Tensor, new_bias, beta)
        conv.args = (conv.args[0], new_weight, new_bias, *conv.args[3:])
"""
REFERENCE = reference_source("11_export_conv_bn")
BN_HEAD = REFERENCE[REFERENCE.index("        if bn.target is not BATCH_NORM:"):REFERENCE.index("        conv, (weight, bias) = found\n")]
# "The model is in eval mode, so every BN folds; one without running statistics normalises with mean 0 and
# variance 1." But track_running_stats=False normalises with the batch's own statistics in eval mode too (the
# exported op says so: _native_batch_norm_legit.no_stats, training=True).
NO_STATS_AS_UNIT = """        if bn.target is aten._native_batch_norm_legit.no_stats and bn.args[0].target is CONVOLUTION:
            conv, w = bn.args[0], _tensor(ep, specs, bn.args[0].args[1])
            b = None if bn.args[0].args[2] is None else _tensor(ep, specs, bn.args[0].args[2])
            gamma, beta = (None if a is None else _tensor(ep, specs, a) for a in bn.args[1:3])
            unit = torch.zeros(w.shape[0], dtype=w.dtype), torch.ones(w.shape[0], dtype=w.dtype)
            found = conv, fold_weights(w, b, *unit, bn.args[5], gamma, beta)
""" + BN_HEAD.replace("        if ", "        elif ")
assert NO_STATS_AS_UNIT.count("        elif ") == 3
NO_OP = Mutant("no_op", DOC, DOC + "    return ep\n", caught_at=1)

MUTANTS = [
    NO_OP,
    Mutant("no_stats_as_unit_statistics", BN_HEAD, NO_STATS_AS_UNIT, caught_at=2, caught_by="bn_without_running_stats"),
    Mutant("eps_dropped", "torch.rsqrt(var.double() + eps)", "torch.rsqrt(var.double())", caught_at=1),
    # Rewrites the caller's graph instead of a copy: the result is right, the given program is not.
    Mutant("edits_the_given_graph", "graph = copy.deepcopy(ep.graph)", "graph = ep.graph", caught_at=1),
    # Writes the folded weight into the caller's tensor instead of a new parameter.
    Mutant("writes_into_the_given_state", NEW_WEIGHT,
           "        ep.state_dict[name].data.copy_(weight)\n" + NEW_WEIGHT, caught_at=1),
    # lift_constants_pass inserts before the first user input; appending after it breaks torch.export's order.
    Mutant("parameters_after_user_inputs", "        with graph.inserting_before(after_parameters):",
           "        with graph.inserting_after(placeholders[-1]):", caught_at=1),
    Mutant("state_dict_entry_not_a_parameter", "state_dict[target] = nn.Parameter(value, requires_grad=False)",
           "state_dict[target] = value", caught_at=1),
    Mutant("keeps_dead_bn_state", "        if not node.users and node not in unread and specs[node].kind in STATE:",
           "        if False:", caught_at=1),
    Mutant("drops_state_but_keeps_its_entry", "        state_dict={k: v for k, v in state_dict.items() if k in kept},",
           "        state_dict=state_dict,", caught_at=1),
    Mutant("fake_tensor_from_a_new_fake_mode", 'node.meta["val"] = fake_mode.from_tensor(value, static_shapes=True)',
           'node.meta["val"] = type(fake_mode)().from_tensor(value, static_shapes=True)', caught_at=1),
    Mutant("real_tensor_as_meta_val", 'node.meta["val"] = fake_mode.from_tensor(value, static_shapes=True)',
           'node.meta["val"] = value', caught_at=1),
    # Placeholders of their own, but the state dict entries by their short names (weight_folded, bias_folded): every
    # pair's new weight reads one entry, the last pair's.
    Mutant("one_name_for_every_pair", "        state_dict[target] = nn.Parameter(value, requires_grad=False)\n",
           "        target = target.rpartition(\".\")[2]  # the entry's short name\n"
           "        state_dict[target] = nn.Parameter(value, requires_grad=False)\n", caught_at=1, caught_by="two_pairs"),
    Mutant("folds_only_the_first_pair", "        graph.erase_node(bn)\n", "        graph.erase_node(bn)\n        break\n",
           caught_at=1, caught_by="two_pairs"),
    Mutant("output_spec_not_renamed", "    output_specs = [replace(s, arg=TensorArgument(out.name))",
           "    output_specs = [replace(s, arg=s.arg)", caught_at=2, caught_by="bn_output_is_model_output"),
    Mutant("folds_multi_user_conv", "conv.target is CONVOLUTION and len(conv.users) == 1)",
           "conv.target is CONVOLUTION)", caught_at=2, caught_by="conv_output_used_twice"),
    Mutant("folds_through_a_relu", "    conv = bn.args[0]\n",
           "    conv = bn.args[0]\n    while conv.target is aten.relu.default:\n        conv = conv.args[0]\n",
           caught_at=2, caught_by="bn_after_relu"),
    Mutant("folds_transposed_conv", "    if conv.args[6]:  # transposed", "    if False:  # transposed",
           caught_at=2, caught_by="conv_transpose"),
    # Any batch_norm op, whatever outputs are read: the training-mode one's args are (input, weight, bias, mean,
    # var, training, momentum, eps), and its outputs 3 and 4 are the running statistics written back.
    Mutant("folds_any_batch_norm", """        if bn.target is not BATCH_NORM:  # eval mode: running statistics read, nothing written back
            continue
        if not all(u.target is operator.getitem and (u.args[1] == 0 or not u.users) for u in bn.users):
            continue  # only the normalised output may be read (a loaded program has getitems for all three)
""", """        if "batch_norm" not in str(bn.target):
            continue
""", caught_at=2, caught_by="bn_in_training_mode"),
    # Every BN argument must be a lifted tensor: with affine=False gamma and beta are None, and the pair is left.
    Mutant("requires_gamma_and_beta",
           "    if any(t is None and (a is not None or i >= 2) for i, (a, t) in enumerate(zip(bn.args[1:5], tensors))):\n",
           "    if any(t is None for t in tensors):\n", caught_at=2, caught_by="bn_affine_false"),
    # The same for the convolution: its bias must be a lifted tensor too, so a convolution without bias (args[2] None,
    # the common Conv2d(..., bias=False) before a BN) is left unfolded.
    Mutant("requires_a_conv_bias", "    if weight is None or (bias is not None and _tensor(ep, specs, bias) is None):\n",
           "    if weight is None or _tensor(ep, specs, bias) is None:\n", caught_at=2, caught_by="conv_without_bias"),
    # "Grouped convolutions need a per-group scale": leaves them, though the scale is per output channel anyway.
    Mutant("leaves_grouped_convs", "    if conv.args[6]:  # transposed", "    if conv.args[6] or conv.args[8] != 1:  # transposed",
           caught_at=2, caught_by="grouped_dilated_strided"),
    # The folded convolution's arguments spelled out as a plain one's: stride, padding and dilation kept, groups 1.
    Mutant("folded_conv_forgets_groups", "bias_folded\", bias), *conv.args[3:])\n",
           "bias_folded\", bias), *conv.args[3:6], False, [0, 0], 1)\n",
           caught_at=2, caught_by="depthwise"),
    # Walks back from the BN through any op to the first convolution it finds: through an add of two convolutions
    # it folds the BN into the first alone.
    Mutant("folds_through_any_op", "    conv = bn.args[0]\n",
           "    conv = bn.args[0]\n"
           "    while isinstance(conv, fx.Node) and conv.op == \"call_function\" and conv.target is not CONVOLUTION:\n"
           "        conv = conv.args[0]\n", caught_at=2, caught_by="bn_after_add_of_two_convs"),
    # Folds into the convolution's own weight parameter: a second convolution reading it changes too.
    Mutant("folds_into_the_shared_weight", NEW_WEIGHT,
           "        state_dict[name] = nn.Parameter(weight, requires_grad=False)\n"
           "        conv.args = (conv.args[0], conv.args[1],\n"
           "                     parameter(f\"{name.rpartition('.')[0] or name}.bias_folded\", bias), *conv.args[3:])\n",
           caught_at=2, caught_by="conv_called_twice"),
    # A contiguous folded weight: the values agree, but a channels_last model now returns its output in another
    # layout than the given program does (and than its meta['val'] records, unless the pass derives it again).
    Mutant("contiguous_folded_weight", "    return weight.to(dtype), bias.to(dtype)",
           "    return weight.to(dtype).contiguous(), bias.to(dtype)", caught_at=2, caught_by="channels_last"),
    Mutant("meta_val_in_float32", 'node.meta["val"] = fake_mode.from_tensor(value, static_shapes=True)',
           'node.meta["val"] = fake_mode.from_tensor(value.float(), static_shapes=True)',
           caught_at=2, caught_by="float64"),
    Mutant("drops_range_constraints", "        range_constraints=ep.range_constraints,", "        range_constraints={},",
           caught_at=2, caught_by="dynamic_batch"),
    # Inductor's efficient_conv_bn_eval: the folded weight computed in the graph, on every call. Exact, no BN left,
    # but each call now writes a weight-sized tensor per convolution where the BN wrote an activation.
    Mutant("folds_at_run_time", NEW_WEIGHT, RUN_TIME_FOLD, caught_at=3),
    # "A program with a BN in training mode is no inference program": but the other pairs of a model whose one BN
    # is frozen in training mode still fold (the hidden models mix them).
    Mutant("leaves_any_program_with_a_training_bn", DOC,
           DOC + "    if any(n.target is aten._native_batch_norm_legit_functional.default for n in ep.graph.nodes):\n"
           "        return ep\n", caught_at=4),
]

# Correct passes written the way PyTorch's own code does it: each must keep full marks.
FOLD_BODY = REFERENCE[REFERENCE.index("    dtype = conv_w.dtype\n"):REFERENCE.index("\n\n\ndef _tensor(") + 1]
FOLD_LOOP = REFERENCE[REFERENCE.index("    rewired = set()\n"):REFERENCE.index("    rederive_meta(graph, rewired, fake_mode)\n")]
# pt2e's fold_bn_weights_into_conv_node and _fuse_conv_bn_ (torch/ao/quantization/pt2e/utils.py, now torchao), on the
# program's lifted state: the folded tensors take the place of the convolution's own weight and bias (same
# placeholders, specs and targets, new state dict entries; a convolution without bias gets a new parameter
# `<weight>_bias`), the users of getitem 0 read the convolution, and graph.eliminate_dead_code() removes the BN and
# its getitems. Unlike pt2e (which overwrites a shared weight), a weight or bias another node reads gets new ones.
PT2E_LOOP = """    def private(node) -> bool:  # a parameter placeholder that this convolution alone reads
        return node is None or (specs[node].kind == InputKind.PARAMETER and len(node.users) == 1)

    def refold(node, value: torch.Tensor) -> None:  # pt2e's _assign_attr, under the placeholder's own target
        state_dict[specs[node].target] = nn.Parameter(value, requires_grad=False)
        node.meta["val"] = fake_mode.from_tensor(value, static_shapes=True)

    rewired = set()
    for bn in list(graph.nodes):
""" + BN_HEAD + """        conv, (weight, bias) = found
        weight_node, bias_node = conv.args[1], conv.args[2]
        name = specs[weight_node].target
        if private(weight_node) and private(bias_node):
            refold(weight_node, weight)
            if bias_node is None:
                bias_node = parameter(f"{name}_bias", bias)
            else:
                refold(bias_node, bias)
        else:
            weight_node, bias_node = parameter(f"{name}_folded", weight), parameter(f"{name}_bias", bias)
        conv.args = (conv.args[0], weight_node, bias_node, *conv.args[3:])
        rewired.add(conv)
        for user in list(bn.users):
            if user.args[1] == 0:
                user.replace_all_uses_with(conv)
    graph.eliminate_dead_code()
"""

VARIANTS = [
    # torch.nn.utils.fusion.fuse_conv_bn_weights, the arithmetic pt2e's fold_bn_weights_into_conv_node and
    # torch.fx.experimental.optimization.fuse call: in the weight's own dtype, not float64, returned as nn.Parameters.
    Variant("fold_by_fuse_conv_bn_weights", FOLD_BODY,
            "    return torch.nn.utils.fusion.fuse_conv_bn_weights(conv_w, conv_b, mean, var, eps, gamma, beta)\n"),
    Variant("pt2e_folds_into_the_convs_own_parameters", FOLD_LOOP, PT2E_LOOP),
    # torch/_export/passes/lift_constants_pass.py inserts a lifted tensor's placeholder before the first user input
    # (after the buffers); torch's verifier asks only that the specs follow the placeholders, in order.
    Variant("new_parameters_before_the_first_user_input",
            "    after_parameters = next(n for n in placeholders if specs[n].kind != InputKind.PARAMETER)\n",
            "    after_parameters = next(n for n in placeholders if specs[n].kind == InputKind.USER_INPUT)\n"),
]
