"""Kata 03: plausible wrong solutions, each caught at the level that should catch it."""
from graders.run import Mutant, Variant, reference_source

SAFE_TO_FOLD = """        and len(conv_node.users) == 1                 # another user would see the BN folded in
        and calls[conv_node.target] == 1              # a shared conv is also used elsewhere
        and conv_node.target not in attr_reads        # nor may its weight be read directly
        and not bn.training                           # training mode normalises with batch statistics
"""
NO_OP = Mutant("no_op", "    modules = dict(gm.named_modules())\n    calls",
               "    return gm\n    modules = dict(gm.named_modules())\n    calls", caught_at=1)
EPS_DROPPED = Mutant("eps_dropped", "torch.rsqrt(bn_rv + bn_eps)", "torch.rsqrt(bn_rv)", caught_at=1)

MUTANTS = [
    EPS_DROPPED,
    Mutant("conv_bias_dropped", "fused_b = (conv_b - bn_rm) * scale", "fused_b = (0 - bn_rm) * scale", caught_at=1),
    Mutant("mean_dropped", "fused_b = (conv_b - bn_rm) * scale", "fused_b = conv_b * scale", caught_at=1),
    Mutant("scale_on_input_channels", "scale.reshape(-1, *([1] * (conv_w.dim() - 1)))",
           "scale.reshape(1, -1, *([1] * (conv_w.dim() - 2)))[:, : conv_w.shape[1]]", caught_at=1),
    Mutant("forgets_recompile", "    gm.recompile()\n    return gm", "    return gm", caught_at=1),
    NO_OP,
    Mutant("deletes_bn_without_folding", "        gm.set_submodule(conv_node.target, fused)\n", "", caught_at=1),
    Mutant("folds_in_training_mode", SAFE_TO_FOLD,
           SAFE_TO_FOLD.replace("        and not bn.training", "        and True"),
           caught_at=2, caught_by="bn_in_training_mode"),
    Mutant("folds_without_running_stats", "        and bn.track_running_stats", "        and True",
           caught_at=2, caught_by="bn_without_running_stats"),
    Mutant("folds_multi_user_conv", SAFE_TO_FOLD,
           SAFE_TO_FOLD.replace("        and len(conv_node.users) == 1", "        and True"),
           caught_at=2, caught_by="conv_output_used_twice"),
    Mutant("folds_at_shared_conv_module", SAFE_TO_FOLD,
           SAFE_TO_FOLD.replace("        and calls[conv_node.target] == 1", "        and True"),
           caught_at=2, caught_by="conv_module_shared"),
    # A Conv2d computes the same in either mode, so the outputs match: but its training is cut off.
    Mutant("folds_a_training_conv", "        and not conv.training                         # being trained",
           "        and True                                      # being trained", caught_at=2),
    Mutant("folds_conv_whose_weight_is_read", "        and conv_node.target not in attr_reads        # nor may its weight be read directly\n",
           "", caught_at=2),
    Mutant("refuses_a_shared_bn", "        if not _foldable(conv_node, bn_node, modules, calls, attr_reads):",
           "        if calls[bn_node.target] != 1 or not _foldable(conv_node, bn_node, modules, calls, attr_reads):",
           caught_at=2, caught_by="bn_shared_by_two_convs"),
    # torch's fuse_conv_bn_eval folds eval-mode pairs only: so this pass puts the caller's conv into eval mode.
    Mutant("puts_the_conv_in_eval_mode", "        if not _foldable(conv_node, bn_node, modules, calls, attr_reads):\n",
           "        if isinstance(modules.get(conv_node.target), nn.Conv2d) and not modules[bn_node.target].training:\n"
           "            modules[conv_node.target].eval()\n"
           "        if not _foldable(conv_node, bn_node, modules, calls, attr_reads):\n", caught_at=2),
    Mutant("mutates_the_traced_model", "fused = copy.deepcopy(conv)", "fused = conv",
           caught_at=2, caught_by="original_model_unchanged"),
    Mutant("rebuilds_conv_forgetting_groups", "fused = copy.deepcopy(conv)",
           "fused = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding)",
           caught_at=2),
    Mutant("crashes_on_affine_false", "bn.eps, bn.weight, bn.bias)", "bn.eps, bn.weight.detach(), bn.bias.detach())",
           caught_at=2),
    Mutant("folds_any_bn_after_any_conv", "        conv_node = bn_node.args[0]\n",
           "        conv_node = bn_node.args[0]\n        while conv_node.op == 'call_function':\n"
           "            conv_node = conv_node.args[0]\n", caught_at=2, caught_by="bn_after_relu"),
    # Any module with a weight is not a Conv2d: a ConvTranspose2d keeps its output channels in dim 1.
    Mutant("folds_into_any_module_with_a_weight", "and type(conv) is nn.Conv2d", "and hasattr(conv, 'weight')",
           caught_at=2, caught_by="conv_transpose"),
    # "Keep the conv as it was: a bias where it had one." A conv without bias then loses the BN's shift.
    Mutant("bias_only_where_the_conv_had_one",
           "        fused.bias = nn.Parameter(bias.detach(), requires_grad=conv.weight.requires_grad)\n",
           "        if conv.bias is not None:\n"
           "            fused.bias = nn.Parameter(bias.detach(), requires_grad=conv.weight.requires_grad)\n",
           caught_at=2, caught_by="conv_without_bias"),
    # setattr(gm, 'features.stage_1.unit0.conv', fused) makes an attribute of that literal name: the graph's
    # call_module still finds the old conv by its path, and the BN is gone.
    Mutant("setattr_with_a_dotted_path", "        gm.set_submodule(conv_node.target, fused)\n",
           "        setattr(gm, conv_node.target, fused)\n", caught_at=2, caught_by="nested_dotted_names"),
    # A new Conv2d with every hyperparameter of the old one, the fused values copied in: in the default dtype.
    Mutant("rebuilds_the_conv_in_the_default_dtype",
           """        fused = copy.deepcopy(conv)
        weight, bias = fuse_conv_bn_weights(conv.weight, conv.bias, bn.running_mean, bn.running_var,
                                            bn.eps, bn.weight, bn.bias)
        fused.weight = nn.Parameter(weight.detach(), requires_grad=conv.weight.requires_grad)
        fused.bias = nn.Parameter(bias.detach(), requires_grad=conv.weight.requires_grad)
""",
           """        fused = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                          conv.dilation, conv.groups, True, conv.padding_mode).train(conv.training)
        weight, bias = fuse_conv_bn_weights(conv.weight, conv.bias, bn.running_mean, bn.running_var,
                                            bn.eps, bn.weight, bn.bias)
        with torch.no_grad():
            fused.weight.copy_(weight)
            fused.bias.copy_(bias)
""", caught_at=2, caught_by="float64_model"),
    # "The graph changed under the loop: stop there." One pair folded per call.
    Mutant("folds_only_the_first_pair", "        gm.graph.erase_node(bn_node)\n",
           "        gm.graph.erase_node(bn_node)\n        break  # the graph changed under the loop\n",
           caught_at=2, caught_by="several_blocks_relu"),
    # "Another reader would see the BN folded in", checked on the conv's input: a skip connection (x + bn(conv(x)))
    # reads x, which folding never changes.
    Mutant("refuses_a_conv_whose_input_is_shared", "        and len(conv_node.users) == 1 ",
           "        and len(conv_node.users) == 1 and len(conv_node.args[0].users) == 1 ",
           caught_at=2, caught_by="residual"),
    Mutant("only_names_seen_in_visible_models",
           "        conv_node = bn_node.args[0]\n",
           "        conv_node = bn_node.args[0]\n        if 'bn' not in bn_node.target:\n            continue\n",
           caught_at=4),
]

# Correct passes written the way PyTorch's own code does it: each must keep full marks.
REFERENCE = reference_source("03_conv_bn")
FOLD_BODY = REFERENCE[REFERENCE.index("    if conv_b is None:\n"):REFERENCE.index("\n\n\ndef _foldable(") + 1]
FOLD_LOOP = REFERENCE[REFERENCE.index("    for bn_node in list(gm.graph.nodes):\n"):REFERENCE.index("    gm.graph.lint()\n")]
# torch.fx.experimental.optimization.fuse's loop, with the kata's guards added (fuse itself folds into a conv called
# at two sites or whose weight is read, and raises "Fusion only for eval!" on a training-mode module): its
# matches_module_pattern((nn.Conv2d, nn.BatchNorm2d), ...), then torch.nn.utils.fusion.fuse_conv_bn_eval (a deep
# copy of the conv with torch's fused Parameters; the non-QAT path of torch.ao.quantization's fuser_method_mappings
# fuse_conv_bn calls it too), installed by replace_node_module (setattr on the parent module).
TORCH_FUSE_LOOP = """    from torch.fx.experimental.optimization import matches_module_pattern, replace_node_module
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    for node in list(gm.graph.nodes):
        if not matches_module_pattern((nn.Conv2d, nn.BatchNorm2d), node, modules):
            continue
        if len(node.args) != 1 or node.kwargs or not _foldable(node.args[0], node, modules, calls, attr_reads):
            continue
        fused = fuse_conv_bn_eval(modules[node.args[0].target], modules[node.target])
        replace_node_module(node.args[0], modules, fused)
        node.replace_all_uses_with(node.args[0])
        gm.graph.erase_node(node)
"""

VARIANTS = [
    # PyTorch's fuse_conv_bn_eval folds only when conv and BN are both in eval mode.
    Variant("declines_a_training_mode_conv", "        and not bn.training ",
            "        and not bn.training and not conv.training "),
    # torch.nn.utils.fusion.fuse_conv_bn_weights itself (what fuse_conv_bn_eval and pt2e call): cast to the conv's
    # dtype, returned as nn.Parameters (a conv without bias gets a bias that does not require grad).
    Variant("fold_by_torch_fuse_conv_bn_weights", FOLD_BODY,
            "    return torch.nn.utils.fusion.fuse_conv_bn_weights(conv_w, conv_b, bn_rm, bn_rv, bn_eps,\n"
            "                                                      bn_w, bn_b)\n"),
    Variant("torch_fx_optimization_fuse_loop", FOLD_LOOP, TORCH_FUSE_LOOP),
]
