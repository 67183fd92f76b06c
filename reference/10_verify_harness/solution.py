"""Kata 10, reference solution: a harness that tells whether a graph pass is safe to ship."""
from __future__ import annotations

import copy
import statistics
import time

import torch
import torch.fx as fx

# The batch sizes numerics are checked at, besides the example's own: a pass can be right at the size
# it was tried on and wrong at batch 1 (a squeeze()) or at any other size (a reshape that baked in the
# example's batch size): so sizes other than 1 and the example's too.
EXTRA_BATCH_SIZES = (1, 2, 3)
GRADIENT_SAMPLES = 3
EFFECT_SAMPLES = 3
TIMING_ROUNDS, TIMING_CHUNK_S, TIMING_WARMUP = 5, 0.01, 3


def draw_samples(example_inputs: tuple, n_samples: int) -> list[tuple]:
    """Fresh inputs shaped like the example, with new values and, sample by sample, new batch sizes."""
    example_batch = example_inputs[0].shape[0]
    sizes = list(dict.fromkeys((1, example_batch, *EXTRA_BATCH_SIZES)))
    samples = []
    for index in range(n_samples):
        batch = sizes[index % len(sizes)]
        # randn, not rand: a pass may be wrong only for negative values.
        samples.append(tuple(torch.randn(batch, *t.shape[1:], dtype=t.dtype, device=t.device) for t in example_inputs))
    return samples


def as_tuple(output) -> tuple:
    return tuple(output) if isinstance(output, (tuple, list)) else (output,)


def outputs_match(original, transformed, samples, atol, rtol) -> bool:
    with torch.no_grad():
        for inputs in samples:
            want, got = as_tuple(original(*inputs)), as_tuple(transformed(*inputs))
            # assert_close also compares shapes; torch.allclose would broadcast (16,) against (1, 16).
            torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
    return True


def gradients(module, inputs, cotangents, params: list[str]) -> list[torch.Tensor]:
    """d(sum(outputs * cotangents)) with respect to every input and to the named parameters."""
    inputs = tuple(t.detach().clone().requires_grad_(True) for t in inputs)
    named = dict(module.named_parameters())
    # The model gets clones of the leaves: a model that writes an input in place (acc.add_(...)) cannot write a
    # leaf that requires grad, and writes to a clone leave the leaf, and the gradient with respect to it, intact.
    outputs = as_tuple(module(*(t.clone() for t in inputs)))
    if len(outputs) != len(cotangents) or any(o.shape != c.shape for o, c in zip(outputs, cotangents)):
        raise ValueError("outputs differ in number or shape")
    loss = sum((o * c).sum() for o, c in zip(outputs, cotangents))
    wrt = [*inputs, *(named[name] for name in params)]
    grads = torch.autograd.grad(loss, wrt, allow_unused=True)
    # None means "does not depend on it": a zero gradient, so a detached weight shows up as a mismatch.
    return [torch.zeros_like(w) if g is None else g for g, w in zip(grads, wrt)]


def untouched_parameters(original, transformed) -> list[str]:
    """Parameters the pass kept as they were: their gradients must be the same too.

    A parameter the pass changed (a folded weight, a padded one) re-parametrises the model, so its
    gradient means something else; only the gradients with respect to the inputs are comparable there.
    """
    after = dict(transformed.named_parameters())
    return [name for name, p in original.named_parameters()
            if name in after and after[name].shape == p.shape and torch.equal(after[name].detach(), p.detach())]


def gradients_match(original, transformed, samples, atol, rtol) -> bool:
    params = untouched_parameters(original, transformed)
    for inputs in samples:
        with torch.no_grad():
            cotangents = [torch.randn_like(o) for o in as_tuple(original(*inputs))]
        want = gradients(original, inputs, cotangents, params)
        got = gradients(transformed, inputs, cotangents, params)
        torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
    return True


def graph_is_valid(gm) -> bool:
    """A GraphModule whose graph lints and whose forward was regenerated after the last graph edit."""
    if not isinstance(gm, fx.GraphModule):
        return False
    gm.graph.lint()
    return gm.code == gm.graph.python_code(root_module="self").src


def copies(inputs) -> tuple:
    return tuple(t.detach().clone() for t in inputs)  # clone keeps a dense tensor's strides: a transposed view stays one


def effects_match(original, transformed, samples, atol, rtol) -> bool:
    """Run from the same RNG state on equal copies of each sample, from the same buffer values, the two models
    leave the inputs, the buffers they both have (same name and shape) and the RNG state alike: what a model does
    to the world (in-place writes, random draws) is part of what it does, and no output shows it."""
    cuda = sorted({t.device for t in samples[0] if t.is_cuda}, key=str)

    def rng_state() -> list[torch.Tensor]:
        return [torch.get_rng_state(), *(torch.cuda.get_rng_state(device) for device in cuda)]

    def set_rng_state(state: list[torch.Tensor]) -> None:
        torch.set_rng_state(state[0])
        for device, device_state in zip(cuda, state[1:]):
            torch.cuda.set_rng_state(device_state, device)

    before = [{name: b.detach().clone() for name, b in m.named_buffers()} for m in (original, transformed)]
    after_names = dict(transformed.named_buffers())
    shared = [name for name, b in original.named_buffers()
              if name in after_names and after_names[name].shape == b.shape]
    with torch.random.fork_rng(devices=cuda), torch.no_grad():  # the caller's RNG stream is the caller's
        start = rng_state()
        for inputs in samples:
            runs = []
            for model, buffers in zip((original, transformed), before):
                for name, b in model.named_buffers():  # each sample from the buffers the model was built with
                    b.copy_(buffers[name])
                set_rng_state(start)
                args = copies(inputs)
                model(*args)
                runs.append((args, dict(model.named_buffers()), rng_state()))
            (want_inputs, want_buffers, want_rng), (got_inputs, got_buffers, got_rng) = runs
            torch.testing.assert_close(got_inputs, want_inputs, atol=atol, rtol=rtol)
            torch.testing.assert_close([got_buffers[n] for n in shared], [want_buffers[n] for n in shared],
                                       atol=atol, rtol=rtol)
            if not all(torch.equal(g, w) for g, w in zip(got_rng, want_rng)):
                return False
    for model, buffers in zip((original, transformed), before):  # as they were, for the other checks
        for name, b in model.named_buffers():
            b.copy_(buffers[name])
    return True


def parameter_count(module) -> int:
    return sum(p.numel() for p in module.parameters())  # parameters() counts a shared tensor once


def synchronizer(inputs):
    """What to call before reading the clock: on CUDA, torch.cuda.synchronize, since a call returns once its
    kernels are queued, not run (the clock would time the launches); on the CPU, nothing."""
    return torch.cuda.synchronize if any(t.is_cuda for t in inputs) else (lambda: None)


def time_ratio(baseline, candidate, inputs) -> float:
    """Median over interleaved rounds of time(baseline) / time(candidate), single-threaded."""
    sync = synchronizer(inputs)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            for _ in range(TIMING_WARMUP):  # allocator, caches, lazy initialisation
                baseline(*inputs), candidate(*inputs)
            sync()
            start = time.perf_counter()
            baseline(*inputs)
            sync()
            # Enough calls per timed chunk that the clock's resolution and one-off hiccups do not matter.
            calls = max(1, int(TIMING_CHUNK_S / max(time.perf_counter() - start, 1e-6)))

            def chunk(fn) -> float:
                sync()  # nothing queued before the chunk is timed with it
                start = time.perf_counter()
                for _ in range(calls):
                    fn(*inputs)
                sync()  # inside the timed region: the chunk ends when its kernels have run
                return time.perf_counter() - start

            ratios = []
            for round_index in range(TIMING_ROUNDS):
                # Alternate who goes first, so both see the same machine state on average.
                if round_index % 2 == 0:
                    base, cand = chunk(baseline), chunk(candidate)
                else:
                    cand, base = chunk(candidate), chunk(baseline)
                ratios.append(base / cand)
    finally:
        torch.set_num_threads(threads)
    return statistics.median(ratios)


def passes(check, *args) -> bool:
    """A check that raises (the transformed model crashes, shapes differ) is a check that fails."""
    try:
        return bool(check(*args))
    except Exception:
        return False


def verify_pass(model, pass_fn, example_inputs, *, atol=1e-5, rtol=1e-5, n_samples=10) -> dict:
    """Run `pass_fn` on a traced copy of `model` and say what it preserved (README, "Your task")."""
    # Copies taken before the pass runs: symbolic_trace shares leaf modules with the model it traces,
    # so a pass that edits a weight in place would change the "original" we compare against.
    original, baseline = copy.deepcopy(model), fx.symbolic_trace(copy.deepcopy(model))
    transformed = pass_fn(fx.symbolic_trace(copy.deepcopy(model)))
    # The example itself first: its values and layout (a non-contiguous view, say) are what the model
    # really meets, and fresh draws reproduce neither.
    samples = [example_inputs, *draw_samples(example_inputs, n_samples)]
    report = {
        # First: the other checks run the models again, and a model with effects changes its buffers as it runs.
        "effects": passes(effects_match, original, transformed, samples[:EFFECT_SAMPLES], atol, rtol),
        "numerical": passes(outputs_match, original, transformed, samples, atol, rtol),
        "gradient": passes(gradients_match, original, transformed, samples[:GRADIENT_SAMPLES], atol, rtol),
        "lint": passes(graph_is_valid, transformed),
        "params": parameter_count(transformed) <= parameter_count(original),
    }
    try:
        report["speedup"] = time_ratio(baseline, transformed, example_inputs)
    except Exception:
        report["speedup"] = float("nan")  # the transformed model cannot even run the example
    return report
