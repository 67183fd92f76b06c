"""Kata 10: plausible wrong verifiers, each caught at its level by the case built to expose it.

In this kata the learner writes the verifier, so a mutant is a verifier with one blind spot.
tests/test_mutants.py proves each is caught first at its level, and by the check of that level named in its
`caught_by`, the case built for that blind spot (so each battery pass's claimed subtlety is itself tested).
The two that time the wrong thing, times_the_original_against_itself and speedup_always_one, are caught first
at level 2, by a pass whose model cannot run (the speedup must be nan); tests/test_kata_10_verify_harness.py
proves the speed check built for them, dead_code_speedup, fails them too.

There is no NO_OP here: the learner's function is a verifier, not a pass, so "changes nothing" has no
meaning; the nearest, a verifier that never times anything (SPEEDUP_ALWAYS_ONE), is an ordinary mutant
(caught at level 2 now: it reports 1.0 for a pass whose model cannot run, where the speedup is nan), and what
bench/speed_fidelity.py grades as this kata's no-op (SPEED_NO_OP).
"""
from graders.run import Mutant, Variant

BACK_TO_BACK_OLD = """            ratios = []
            for round_index in range(TIMING_ROUNDS):
                # Alternate who goes first, so both see the same machine state on average.
                if round_index % 2 == 0:
                    base, cand = chunk(baseline), chunk(candidate)
                else:
                    cand, base = chunk(candidate), chunk(baseline)
                ratios.append(base / cand)
"""
BACK_TO_BACK_NEW = """            bases = [chunk(baseline) for _ in range(TIMING_ROUNDS)]  # all of one model, then all of the other
            cands = [chunk(candidate) for _ in range(TIMING_ROUNDS)]
            ratios = [base / cand for base, cand in zip(bases, cands)]
"""
SAMPLES = "    samples = [example_inputs, *draw_samples(example_inputs, n_samples)]\n"
COMPARE_OUTPUTS = """            want, got = as_tuple(original(*inputs)), as_tuple(transformed(*inputs))
            # assert_close also compares shapes; torch.allclose would broadcast (16,) against (1, 16).
            torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
    return True
"""
# A tally of failing samples per batch size, to say which sizes fail, where each sample sets its size's count
# instead of adding to it (= for +=): the last sample at a size decides it, and the example, the first sample at
# its batch size, is outvoted by the fresh draws at that size that follow it.
TALLY_PER_BATCH_SIZE = """            want, got = as_tuple(original(*inputs)), as_tuple(transformed(*inputs))
            try:
                torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
                failed = 0
            except AssertionError:
                failed = 1
            failures[len(inputs[0])] = failed  # failing samples at this batch size
    return not any(failures.values())
"""
SPEEDUP_ALWAYS_ONE = Mutant("speedup_always_one",
                            'report["speedup"] = time_ratio(baseline, transformed, example_inputs)',
                            'report["speedup"] = 1.0', caught_at=2, caught_by="breaks_node_order")

MUTANTS = [
    Mutant("one_sample_only", SAMPLES, "    samples = [example_inputs]\n",
           caught_at=2, caught_by="caches_first_result"),
    Mutant("never_runs_the_example", SAMPLES, "    samples = draw_samples(example_inputs, n_samples)\n",
           caught_at=2, caught_by="wrong_only_on_the_example_itself"),
    Mutant("same_batch_size_always", "batch = sizes[index % len(sizes)]", "batch = example_batch",
           caught_at=2, caught_by="wrong_only_at_batch_size_1"),
    Mutant("tries_only_batch_1_and_the_example", "sizes = list(dict.fromkeys((1, example_batch, *EXTRA_BATCH_SIZES)))",
           "sizes = list(dict.fromkeys((1, example_batch)))",
           caught_at=2, caught_by="right_only_at_the_example_batch_size"),
    Mutant("draws_nonnegative_inputs", "torch.randn(batch, *t.shape[1:]", "torch.rand(batch, *t.shape[1:]",
           caught_at=2, caught_by="example_in_0_1_wrong_on_negatives"),
    # A fuzzer: n_samples fresh tensors "like the example" (torch.rand_like: its shape, dtype, device), never the
    # example itself. Each blind spot alone has its own case; together, no value it compares on is negative, so an
    # abs(x) -> x is invisible even on a model whose example (torch.randn) holds negative values.
    Mutant("fuzzes_with_rand_like", SAMPLES,
           "    samples = [tuple(torch.rand_like(t) for t in example_inputs) for _ in range(n_samples)]\n",
           caught_at=2, caught_by="wrong_only_on_negative_inputs"),
    Mutant("allclose_broadcasts_shapes",
           "            torch.testing.assert_close(got, want, atol=atol, rtol=rtol)\n    return True\n\n\ndef gradients(",
           "            if not all(torch.allclose(g, w, atol=atol, rtol=rtol) for g, w in zip(got, want)):\n"
           "                return False\n    return True\n\n\ndef gradients(",
           caught_at=2, caught_by="wrong_only_at_batch_size_1"),
    Mutant("tallies_failures_per_batch_size",
           "    with torch.no_grad():\n        for inputs in samples:\n" + COMPARE_OUTPUTS,
           "    failures = {}\n    with torch.no_grad():\n        for inputs in samples:\n" + TALLY_PER_BATCH_SIZE,
           caught_at=2, caught_by="wrong_values_only_on_the_example_layout"),
    Mutant("compares_only_the_first_output",
           "want, got = as_tuple(original(*inputs)), as_tuple(transformed(*inputs))",
           "want, got = as_tuple(original(*inputs))[:1], as_tuple(transformed(*inputs))[:1]",
           caught_at=2, caught_by="wrong_only_in_the_second_output"),
    Mutant("no_deep_copy_before_the_pass",
           "    original, baseline = copy.deepcopy(model), fx.symbolic_trace(copy.deepcopy(model))\n"
           "    transformed = pass_fn(fx.symbolic_trace(copy.deepcopy(model)))",
           "    original, baseline = model, fx.symbolic_trace(model)\n"
           "    transformed = pass_fn(fx.symbolic_trace(model))", caught_at=2, caught_by="mutates_shared_weights"),
    Mutant("no_gradient_comparison",
           "passes(gradients_match, original, transformed, samples[:GRADIENT_SAMPLES], atol, rtol)", "True",
           caught_at=2, caught_by="straight_through_relu"),
    Mutant("input_gradients_only", "    params = untouched_parameters(original, transformed)\n",
           "    params = []\n", caught_at=2, caught_by="detaches_weight"),
    Mutant("lint_without_freshness", '    return gm.code == gm.graph.python_code(root_module="self").src',
           "    return True", caught_at=2, caught_by="forgets_recompile"),
    Mutant("freshness_without_lint", "    gm.graph.lint()\n", "", caught_at=2, caught_by="breaks_node_order"),
    Mutant("params_compares_names",
           '"params": parameter_count(transformed) <= parameter_count(original),',
           '"params": set(dict(transformed.named_parameters())) <= set(dict(original.named_parameters())),',
           caught_at=2, caught_by="pads_linear_adds_parameters"),
    Mutant("params_requires_equal_count", "parameter_count(transformed) <= parameter_count(original)",
           "parameter_count(transformed) == parameter_count(original)", caught_at=1, caught_by="conv_bn_fold"),
    Mutant("speedup_inverted", "ratios.append(base / cand)", "ratios.append(cand / base)",
           caught_at=3, caught_by="dead_code_speedup"),
    Mutant("times_the_original_against_itself", "time_ratio(baseline, transformed, example_inputs)",
           "time_ratio(baseline, original, example_inputs)", caught_at=2, caught_by="breaks_node_order"),
    SPEEDUP_ALWAYS_ONE,
    Mutant("times_back_to_back", BACK_TO_BACK_OLD, BACK_TO_BACK_NEW, caught_at=3, caught_by="interleaved_timing"),
    # Sets one thread for the timing and leaves it so: the caller's setting is lost.
    Mutant("leaves_one_thread", "    finally:\n        torch.set_num_threads(threads)\n    return statistics.median(ratios)",
           "    finally:\n        pass\n    return statistics.median(ratios)",
           caught_at=3, caught_by="interleaved_timing"),
    Mutant("draws_only_the_first_input", "for t in example_inputs))", "for t in example_inputs[:1]))", caught_at=4),
    # Gradients of sum(outputs): a backward that permutes the incoming gradient sees a permuted all-ones, all-ones.
    Mutant("cotangent_of_ones", "cotangents = [torch.randn_like(o) for o", "cotangents = [torch.ones_like(o) for o",
           caught_at=2, caught_by="backward_permutes_the_gradient"),
    Mutant("none_gradient_is_a_mismatch",
           "    return [torch.zeros_like(w) if g is None else g for g, w in zip(grads, wrt)]",
           "    return list(grads)  # None against a zero tensor: assert_close raises",
           caught_at=2, caught_by="removes_a_term_times_zero"),
    Mutant("draws_float32_inputs", "dtype=t.dtype, device=t.device", "device=t.device",
           caught_at=2, caught_by="float64_model"),
    # Draws in float32 and casts to the example's dtype: float64 inputs that hold only float32 values.
    Mutant("draws_in_float32_precision", "dtype=t.dtype, device=t.device) for t", "device=t.device).to(t.dtype) for t",
           caught_at=2, caught_by="float64_input_rounded_through_float32"),
    Mutant("speedup_zero_when_it_cannot_run", 'report["speedup"] = float("nan")', 'report["speedup"] = 0.0',
           caught_at=2, caught_by="breaks_node_order"),
    # Gradients compared at a fixed loose tolerance, the outputs at the caller's.
    Mutant("fixed_gradient_tolerance",
           "        torch.testing.assert_close(got, want, atol=atol, rtol=rtol)\n    return True\n\n\ndef graph_is_valid(",
           "        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)  # gradients are noisier\n"
           "    return True\n\n\ndef graph_is_valid(", caught_at=2, caught_by="tighter_tolerance_float64"),
    # Effects: what the model does to the world besides its outputs (in-place writes, random draws).
    Mutant("never_checks_effects",
           '"effects": passes(effects_match, original, transformed, samples[:EFFECT_SAMPLES], atol, rtol),',
           '"effects": True,', caught_at=2, caught_by="dce_drops_a_buffer_update"),
    Mutant("effects_ignores_buffers",
           "            torch.testing.assert_close([got_buffers[n] for n in shared], [want_buffers[n] for n in shared],\n"
           "                                       atol=atol, rtol=rtol)\n", "",
           caught_at=2, caught_by="dce_drops_a_buffer_update"),
    Mutant("effects_ignores_the_rng",
           "            if not all(torch.equal(g, w) for g, w in zip(got_rng, want_rng)):\n                return False\n",
           "", caught_at=2, caught_by="drops_a_dead_random_draw"),
    # Holds the model to "inputs stay as they were": a model that writes its input is taken for a wrong pass.
    Mutant("effects_forbids_writing_inputs",
           "            torch.testing.assert_close(got_inputs, want_inputs, atol=atol, rtol=rtol)\n",
           "            torch.testing.assert_close((got_inputs, want_inputs), (inputs, inputs), atol=atol, rtol=rtol)\n",
           caught_at=2, caught_by="correct_pass_on_a_model_that_writes_its_input"),
    Mutant("effects_ignores_inputs",
           "            torch.testing.assert_close(got_inputs, want_inputs, atol=atol, rtol=rtol)\n", "",
           caught_at=2, caught_by="dce_drops_a_write_to_an_input"),
    # The second model runs from the RNG state the first left: a model that draws looks like one that changed.
    Mutant("effects_without_resetting_the_rng",
           "                set_rng_state(start)\n", "", caught_at=2, caught_by="pure_rewrite_keeps_every_effect"),
    # torch.allclose used as if it asserted: it returns a bool, which nobody reads, so every sample "matches".
    Mutant("allclose_result_ignored",
           "            torch.testing.assert_close(got, want, atol=atol, rtol=rtol)\n    return True\n\n\ndef gradients(",
           "            for g, w in zip(got, want):\n                torch.allclose(g, w, atol=atol, rtol=rtol)\n"
           "    return True\n\n\ndef gradients(", caught_at=1, caught_by="obviously_wrong_pass"),
    # A random cotangent drawn inside the gradient function, so each model gets its own: even the identity differs.
    Mutant("cotangent_per_model", "    loss = sum((o * c).sum() for o, c in zip(outputs, cotangents))\n",
           "    loss = sum((o * torch.randn_like(o)).sum() for o in outputs)\n", caught_at=1, caught_by="identity_pass"),
    # Gradients without allow_unused=True: a parameter the output does not depend on (a dead branch's Linear, in
    # the original as much as after the pass) makes autograd.grad raise, and the gradient check fails.
    Mutant("grad_without_allow_unused", "torch.autograd.grad(loss, wrt, allow_unused=True)",
           "torch.autograd.grad(loss, wrt)", caught_at=2, caught_by="dead_code_elimination"),
    Mutant("fixed_tolerances",
           '    """Run `pass_fn` on a traced copy of `model` and say what it preserved (README, "Your task")."""\n',
           '    """Run `pass_fn` on a traced copy of `model` and say what it preserved (README, "Your task")."""\n'
           "    atol = rtol = 1e-5  # whatever the caller asked\n",
           caught_at=2, caught_by="looser_tolerance_tanh_gelu"),
]

SPEED_NO_OP = SPEEDUP_ALWAYS_ONE

# Each check built for a mutant fails it on the verifier's report, with the case's hint (graders/dev/mutation.py).
CAUGHT_WITH_A_HINT = True

VARIANTS = [
    # Fresh inputs drawn as PyTorch's OpInfo sample inputs are: torch.testing.make_tensor (torch/testing/_creation.py),
    # uniform in [-9, 9) for floating dtypes, in the tensor's own dtype and on its device: both signs, float64 precision.
    Variant("draws_with_make_tensor",
            "        samples.append(tuple(torch.randn(batch, *t.shape[1:], dtype=t.dtype, device=t.device) for t in "
            "example_inputs))\n",
            "        samples.append(tuple(torch.testing.make_tensor((batch, *t.shape[1:]), dtype=t.dtype, device=t.device)\n"
            "                             for t in example_inputs))\n"),
    # The vector-Jacobian product as torch.autograd.gradcheck computes it (gradcheck.py, _get_analytical_vJu_backward_mode
    # and its vjp_fn): torch.autograd.grad(outputs, inputs, grad_outputs=v, allow_unused=True) over the differentiable
    # outputs only (gradcheck's _differentiable_outputs), with materialize_grads=True: an unused input's None comes
    # back as zeros, autograd's own spelling of "None counts as zeros".
    Variant("vjp_with_materialize_grads",
            "    loss = sum((o * c).sum() for o, c in zip(outputs, cotangents))\n"
            "    wrt = [*inputs, *(named[name] for name in params)]\n"
            "    grads = torch.autograd.grad(loss, wrt, allow_unused=True)\n",
            "    wrt = [*inputs, *(named[name] for name in params)]\n"
            "    pairs = [(o, c) for o, c in zip(outputs, cotangents) if o.requires_grad]\n"
            "    if not pairs:  # nothing differentiable: every gradient is zero\n"
            "        return [torch.zeros_like(w) for w in wrt]\n"
            "    grads = torch.autograd.grad([o for o, _ in pairs], wrt, grad_outputs=[c for _, c in pairs],\n"
            "                                allow_unused=True, materialize_grads=True)\n"),
]
