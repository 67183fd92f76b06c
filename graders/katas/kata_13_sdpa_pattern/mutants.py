"""Kata 13: plausible wrong solutions, each caught at the level that should catch it."""
from graders.run import Mutant, Variant

NO_OP = Mutant("no_op", "    replaced = build_pass().apply(gm.graph)\n", "    replaced = 0\n", caught_at=1)
DIV_PATTERNS = ("    for search, replace, with_mask in [(attention_div, sdpa_div, False), (attention_mul, sdpa_mul, False),\n"
                "                                       (attention_div_mask, sdpa_div_mask, True),\n"
                "                                       (attention_mul_mask, sdpa_mul_mask, True)]:\n")

# The reference's registration of its four patterns, which the hand-written patterns below replace.
LAYOUTS = "        for heads_last in (False, True):\n"
REGISTERED = (DIV_PATTERNS + LAYOUTS + "            register_replacement(search, replace, _examples(with_mask, heads_last), fwd_only, "
                                       "patterns,\n"
                                       "                                 extra_check=attention_extra_check)\n")

MUTANTS = [
    NO_OP,
    Mutant("forgets_recompile", "    gm.graph.lint()\n    gm.recompile()\n", "    gm.graph.lint()\n", caught_at=1),
    Mutant("returns_whether_changed", "    return replaced\n", "    return int(replaced > 0)\n",
           caught_at=2, caught_by="two_blocks"),
    # Only the division: scores * (1/sqrt(d)) is another ATen graph (aten.mul), and so is a masked one.
    Mutant("division_pattern_only", DIV_PATTERNS, "    for search, replace, with_mask in [(attention_div, sdpa_div, False)]:\n",
           caught_at=2),
    Mutant("no_mask_patterns", DIV_PATTERNS,
           "    for search, replace, with_mask in [(attention_div, sdpa_div, False), (attention_mul, sdpa_mul, False)]:\n",
           caught_at=2, caught_by="additive_mask"),
    # SDPA's default scale is 1/sqrt(head dim): right for the usual model, wrong for any other scale.
    Mutant("replacement_keeps_default_scale",
           "    return aten.scaled_dot_product_attention(query, key, value, scale=1.0 / inv_scale)\n",
           "    return aten.scaled_dot_product_attention(query, key, value)\n",
           caught_at=2, caught_by="non_default_scale_div"),
    Mutant("no_extra_check", "                                 extra_check=attention_extra_check)\n", "                                 )\n",
           caught_at=2, caught_by="scale_in_a_tensor_parameter"),
    Mutant("dtypes_not_checked", "    return len(dtypes) == 1\n", "    return True\n",
           caught_at=2, caught_by="query_and_value_dtypes_differ"),
    # Reads meta of whatever the mask matched: a number added to the scores has none (the pass raises).
    Mutant("takes_a_number_for_a_mask", "    if \"mask\" in match.kwargs and not isinstance(match.kwargs[\"mask\"], fx.Node):\n"
           "        return False  # a number added to the scores matched the mask: SDPA's attn_mask is a tensor\n", "",
           caught_at=2, caught_by="number_added_to_the_scores"),
    # Branches on a size symbol in extra_check: the batch < 100 holds for the traced one, so the match goes on, but
    # the ShapeEnv records the guard: the graph is declared valid for batches below 100 only (divided_by_sqrt_d's
    # batch is symbolic).
    Mutant("branches_on_a_size", "    return len(dtypes) == 1\n",
           "    return len(dtypes) == 1 and match.kwargs[\"query\"].meta[\"val\"].shape[0] < 100\n", caught_at=1),
    # The mask is added after the scaling in the pattern; with the replacement's mask forgotten, outputs move.
    Mutant("mask_dropped_in_replacement",
           "    return aten.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=1.0 / inv_scale)\n",
           "    return aten.scaled_dot_product_attention(query, key, value, scale=1.0 / inv_scale)\n",
           caught_at=2, caught_by="additive_mask"),
    # Scale inverted in the multiplying replacement: right only where scale is its own inverse.
    # One replacement for all: the unmasked ones pass a mask of zeros, which computes the scores in full again.
    Mutant("zero_mask_for_unmasked_attention",
           "    return aten.scaled_dot_product_attention(query, key, value, scale=1.0 / inv_scale)\n",
           "    zeros = torch.zeros_like(query @ key.transpose(-2, -1))\n"
           "    return aten.scaled_dot_product_attention(query, key, value, attn_mask=zeros, scale=1.0 / inv_scale)\n",
           caught_at=3),
    # The visible models mask only scores divided by sqrt(d); hidden ones also mask scores multiplied by a scale.
    Mutant("mask_pattern_for_division_only", "                                       (attention_mul_mask, sdpa_mul_mask, True)]:\n",
           "                                       ]:\n", caught_at=4),
    # Patterns traced on contiguous examples only: in a model that permutes q, k and v (BERT's layout) each matmul's
    # reshape copies (aten.clone before the view), a graph no such pattern matches.
    Mutant("contiguous_examples_only", LAYOUTS, "        for heads_last in (False,):\n",
           caught_at=2, caught_by="heads_last_layout"),
    # Permuted examples only for BERT's form, scores divided (and masked): a block that multiplies them is left.
    Mutant("permuted_examples_for_division_only", LAYOUTS,
           "        for heads_last in ((False, True) if search in (attention_div, attention_div_mask) else (False,)):\n",
           caught_at=2, caught_by="heads_last_layout"),
    # The lower-level API: the search pattern (gen_pattern) registered with a handler that replaces by example.
    # register_replacement matches that coarse pattern too, its integers (dims, sizes) wildcards, then re-traces the
    # search function on the match's own inputs and compares; this handler never does, so a softmax over another
    # dim matches as well.
    Mutant("coarse_pattern_without_the_recheck", REGISTERED,
           DIV_PATTERNS + "        import inspect\n        from torch._inductor.pattern_matcher import gen_pattern, register_graph_pattern\n"
           "        names = list(inspect.signature(search).parameters)\n\n"
           "        def handler(match, *args, replace=replace, names=names, **kwargs):\n"
           "            match.replace_by_example(replace, [kwargs[name] for name in names])\n\n"
           + LAYOUTS + "            register_graph_pattern(gen_pattern(search, _examples(with_mask, heads_last), fwd_only),\n"
           "                                   pass_dict=patterns, extra_check=attention_extra_check)(handler)\n",
           caught_at=2, caught_by="softmax_over_queries"),
    Mutant("mul_replacement_inverts_scale",
           "    return aten.scaled_dot_product_attention(query, key, value, scale=scale)\n",
           "    return aten.scaled_dot_product_attention(query, key, value, scale=1.0 / scale)\n", caught_at=2),
]

# The patterns written by hand in the pattern matcher's DSL, as Inductor writes many of its own (joint_graph.py's
# _partial_softmax_pattern: amax and sub of one scaled node; post_grad.py's reciprocal_sqrt_to_rsqrt:
# register_graph_pattern with a handler calling match.replace_by_example). Nothing is traced at registration and there
# is no recheck by re-tracing: the softmax's dim and keepdim are literals of the pattern, the sizes of the views and
# expands Ignored(), and each node's user count is stated (_users=2 where amax and sub, or div and sum, both read it),
# so a softmax over dim -2 or a softmax whose weights are also an output matches nothing.
DSL_PATTERNS = (
    "    import itertools\n"
    "    from torch._inductor.pattern_matcher import CallFunction, Ignored, KeywordArg, register_graph_pattern\n\n"
    "    def operand(x, permuted):  # expanded, viewed as 3-d; a permuted tensor is copied first (clone) to be viewed\n"
    "        x = CallFunction(aten.expand.default, x, Ignored())\n"
    "        if permuted:\n"
    "            x = CallFunction(aten.clone.default, x, memory_format=torch.contiguous_format)\n"
    "        return CallFunction(aten.view.default, x, Ignored())\n\n"
    "    def matmul(a, b, permuted_a, permuted_b):  # a @ b of 4-d tensors as decomposed: expand, view, bmm, view back\n"
    "        bmm = CallFunction(aten.bmm.default, operand(a, permuted_a), operand(b, permuted_b))\n"
    "        return CallFunction(aten.view.default, bmm, Ignored())\n\n"
    "    def softmax(x):  # softmax(x, dim=-1) as decomposed: exp(x - amax(x)) / sum(exp(x - amax(x)))\n"
    "        exp = CallFunction(aten.exp.default,\n"
    "                           CallFunction(aten.sub.Tensor, x, CallFunction(aten.amax.default, x, [-1], True)), _users=2)\n"
    "        return CallFunction(aten.div.Tensor, exp, CallFunction(aten.sum.dim_IntList, exp, [-1], True))\n\n"
    "    key_t = CallFunction(aten.permute.default, KeywordArg(\"key\"), [0, 1, 3, 2])\n"
    "    for (op, scale, replace, with_mask), heads_last in itertools.product(\n"
    "            [(aten.div.Tensor, \"inv_scale\", sdpa_div, False), (aten.mul.Tensor, \"scale\", sdpa_mul, False),\n"
    "             (aten.div.Tensor, \"inv_scale\", sdpa_div_mask, True), (aten.mul.Tensor, \"scale\", sdpa_mul_mask, True)],\n"
    "            (False, True)):  # heads last: query, key and value permuted, copied before each view\n"
    "        scores = matmul(KeywordArg(\"query\"), key_t, heads_last, heads_last)\n"
    "        scaled = CallFunction(op, scores, KeywordArg(scale), _users=1 if with_mask else 2)\n"
    "        if with_mask:\n"
    "            scaled = CallFunction(aten.add.Tensor, scaled, KeywordArg(\"mask\"), _users=2)\n"
    "        names = [\"query\", \"key\", \"value\", scale, *([\"mask\"] if with_mask else [])]\n\n"
    "        def handler(match, replace=replace, names=names, **kwargs):\n"
    "            match.replace_by_example(replace, [kwargs[name] for name in names])\n\n"
    "        register_graph_pattern(matmul(softmax(scaled), KeywordArg(\"value\"), False, heads_last),\n"
    "                               attention_extra_check, pass_dict=patterns)(handler)\n")

# The same patterns with no user counted: told "multiple_users" where a node feeds two (the scaled scores: amax and
# sub; exp: sum and div), the pass gives every node _users=MULTIPLE ("any number"). The softmax's output then matches
# with users outside the pattern too: a block whose weights are also returned is fused, SDPA running beside the
# softmax that the output still needs (Match.erase_nodes keeps a node with users): attention computed twice.
USERS_NOT_COUNTED = (DSL_PATTERNS
                     .replace("    from torch._inductor.pattern_matcher import CallFunction, Ignored, KeywordArg, "
                              "register_graph_pattern\n\n",
                              "    from torch._inductor import pattern_matcher as pm\n"
                              "    from torch._inductor.pattern_matcher import Ignored, KeywordArg, register_graph_pattern\n"
                              "    CallFunction = functools.partial(pm.CallFunction, _users=pm.MULTIPLE)  # any users\n\n")
                     .replace(", _users=2)", ")").replace(", _users=1 if with_mask else 2)", ")"))
assert USERS_NOT_COUNTED.count("_users") == 1, USERS_NOT_COUNTED
MUTANTS.append(Mutant("users_not_counted", REGISTERED, USERS_NOT_COUNTED,
                      caught_at=2, caught_by="weights_also_returned"))

VARIANTS = [
    # Inductor's own attention patterns: fuse_attention.py's _sfdp_init registers what _get_sfdp_patterns yields with
    # gen_register_replacement (the pre-traced patterns of fx_passes/serialized_patterns); here its inference ones go
    # into this pass instead of joint_graph.patterns. They fuse the division (_sfdp_pattern_1), the multiplication
    # (_sfdp_pattern_2) and the masked division (_sfdp_pattern_5), refusing a tensor scale (_is_supported_scale) and
    # mixed dtypes (_sfdp_params_check); Inductor has no pattern for masked scores multiplied by a scale, so the
    # reference's stays for that one.
    Variant("inductor_sfdp_patterns", DIV_PATTERNS,
            "    from torch._inductor.fx_passes.fuse_attention import _get_sfdp_patterns\n"
            "    from torch._inductor.pattern_matcher import gen_register_replacement\n"
            "    for name, kwargs in _get_sfdp_patterns(torch.device(\"cpu\")):\n"
            "        if name.endswith(\"_inference\"):\n"
            "            gen_register_replacement(name, **{**kwargs, \"pass_dicts\": patterns})\n"
            "    for search, replace, with_mask in [(attention_mul_mask, sdpa_mul_mask, True)]:\n"),
    Variant("hand_written_dsl_patterns", REGISTERED, DSL_PATTERNS),
]
