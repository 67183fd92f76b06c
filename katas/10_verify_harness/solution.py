"""Kata 10: a harness that tells whether a graph pass is safe to ship.

Read README.md beside this file first. Grade your work with:  uv run pytest katas/10_verify_harness
"""
from __future__ import annotations

import copy
import statistics
import time

import torch
import torch.fx as fx


def verify_pass(model, pass_fn, example_inputs, *, atol=1e-5, rtol=1e-5, n_samples=10) -> dict:
    """Run `pass_fn` on a traced copy of `model` and report what the pass preserved.

    model: an nn.Module (leave it as you found it). pass_fn: GraphModule -> GraphModule; it may edit,
    and even corrupt, what it is given. example_inputs: a tuple of floating tensors, batch on dim 0.

    Returns {"numerical": bool, "gradient": bool, "lint": bool, "params": bool, "effects": bool,
    "speedup": float},
    each defined exactly in README.md ("Your task"). verify_pass itself must not raise because the
    transformed model crashes or returns the wrong shape: that is a failed check, not an error.
    """
    # TODO(human): take the copies you compare and time against *before* pass_fn runs (why? README,
    #   "Why the deep copy"), then run pass_fn on fx.symbolic_trace of yet another copy.
    # TODO(human): numerical: example_inputs themselves, then n_samples fresh inputs shaped like them,
    #   new torch.randn values (negative ones too, whatever the example's range) in the example's dtype and
    #   on its device, and varying batch sizes, 1, the example's and at least one other among them; every
    #   output must match in number, shape and value (torch.testing.assert_close at the caller's atol and
    #   rtol; torch.allclose broadcasts).
    # TODO(human): gradient: with a random cotangent per output (not ones), compare gradients w.r.t. every input and every
    #   parameter the pass left unchanged (torch.autograd.grad, allow_unused=True: None means zero).
    # TODO(human): lint: a GraphModule whose graph lints and whose code was regenerated from it.
    # TODO(human): params: the pass added no parameter elements.
    # TODO(human): effects: run both models from the same RNG state and the same buffer values, each on its own
    #   copy of the inputs (the example and a few samples): the input copies, the buffers both models have (same
    #   name and shape) and torch.get_rng_state() (torch.cuda's too on CUDA) must end up alike. Do it before the
    #   other checks run the models, and restore the caller's RNG state afterwards (torch.random.fork_rng).
    # TODO(human): speedup: time(traced original) / time(transformed) on example_inputs: warm up,
    #   one thread, alternate the two round by round (at least 5 rounds), median of the per-round ratios;
    #   on CUDA, torch.cuda.synchronize() before each clock reading.
    # TODO(human): any check whose computation raises has failed (False); do it last for speedup (nan).
    raise NotImplementedError("TODO(human): verify_pass")
