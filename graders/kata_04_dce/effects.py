"""Kata 04's comparison: everything a model can change, not only what it returns. Removing a node with a
side effect often leaves the outputs right; what changes is an input mutated in place, a parameter or
buffer the model updates, or the generator's state. Both sides run on private copies of the same inputs."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from graders.harness import Run
from graders.numerics import ATOL, RTOL, cloned, run_module, seeded


@dataclass
class Effects:
    output: object
    inputs: tuple                   # the private copies of the inputs, after the call
    state: dict[str, torch.Tensor]  # parameters and buffers after the call
    generators: list[torch.Tensor]  # the CPU generator's state, and the GPU's where the model runs on one


def run_recording(module, owner: nn.Module, inputs: tuple, seed: int, device: torch.device, what: str) -> Effects:
    """One call of `module` from generator state `seed`; `owner` holds the state the call may change."""
    inputs = cloned(inputs)
    with seeded(seed):
        output = run_module(module, inputs, what)
        generators = [torch.get_rng_state()] + ([torch.cuda.get_rng_state(device)] if device.type == "cuda" else [])
    return Effects(output, inputs, {k: v.detach().clone() for k, v in owner.state_dict().items()}, generators)


def output_difference(got, want) -> str | None:
    try:
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
    except AssertionError as exc:
        return " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return None


def same_effects(run: Run) -> None:
    """Outputs, inputs after the call, parameters and buffers, generator state: all as the original's."""
    label = run.via.label
    for index, inputs in enumerate(run.input_sets()):
        want = run_recording(run.pristine, run.pristine, inputs, 1000 + index, run.ctx.device, "the original model")
        # The GraphModule shares its submodules and tensors with the model that was traced: its state is there.
        got = run_recording(run.gm, run.model, inputs, 1000 + index, run.ctx.device, label)
        if difference := output_difference(got.output, want.output):
            run.fail(f"{label} returns something else than the original: {difference}")
        for position, (g, w, given) in enumerate(zip(got.inputs, want.inputs, inputs)):
            if isinstance(w, torch.Tensor) and not torch.equal(g, w):
                did = lambda t: "leaves it unchanged" if torch.equal(t, given) else "changes it in place"  # noqa: E731
                run.fail(f"after one call, input #{position} differs: the original model {did(w)}, {label} "
                         f"{did(g)}{' to other values' if did(g) == did(w) else ''}. A node that mutates a tensor "
                         "the caller can see must stay.")
        for name, w in want.state.items():
            if not torch.equal(got.state[name], w):
                run.fail(f"after one forward call, the model's {name!r} differs from the original's: the original "
                         "updates it, the node that did so was removed.")
        if not all(map(torch.equal, got.generators, want.generators)):
            run.fail("after one forward call, the random-number generator is in a different state than after the "
                     "original: a node that draws random numbers was removed, so every later random draw shifts.")
