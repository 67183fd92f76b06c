"""Numerics: does the rewritten module compute what a pristine copy of the original computes?"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch.utils._pytree import tree_leaves

from graders.core import CheckFailed, describe_exception
from graders.structure import before_after

# fp32 tolerances. A rewrite that reassociates arithmetic (folding a scale into a weight) moves results
# by a few ulps of the *intermediate* values, so the absolute tolerance scales with the output's
# magnitude; every missing term the graders look for moves results by far more.
RTOL = 1e-4
ATOL = 1e-5


def _magnitude(output) -> float:
    leaves = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()]
    return max([1.0] + [t.detach().abs().max().item() for t in leaves])


def input_sets(make_inputs: Callable[[int], tuple], batch_sizes: Sequence[int] = (1, 3), samples: int = 2) -> list[tuple]:
    """Several fresh random draws at several batch sizes: one sample can hide a bug."""
    return [make_inputs(batch) for batch in batch_sizes for _ in range(samples)]


def run_module(module: Callable, inputs: tuple, what: str):
    try:
        with torch.no_grad():
            return module(*inputs)
    except Exception as exc:
        raise CheckFailed(f"running {what} raised {describe_exception(exc)}.") from None


def _shapes(inputs: tuple) -> str:
    return ", ".join(str(tuple(t.shape)) if isinstance(t, torch.Tensor) else repr(t) for t in inputs)


def assert_same_outputs(expected: Callable, candidate: Callable, inputs_list: list[tuple], *,
                        what: str = "the rewritten module", rtol: float = RTOL, atol: float = ATOL,
                        hint: str = "", graphs: tuple | None = None) -> None:
    """Outputs must match in structure, shape, dtype, device and value on every input set.

    `graphs`, a (before, after) pair of GraphModules, are shown after the sentence when outputs differ.
    """
    for inputs in inputs_list:
        want = run_module(expected, inputs, "the original model")
        got = run_module(candidate, inputs, what)
        try:
            torch.testing.assert_close(got, want, rtol=rtol, atol=atol * _magnitude(want))
        except AssertionError as exc:
            detail = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
            raise CheckFailed(
                f"{what} does not compute what the original does on inputs of shape {_shapes(inputs)}: {detail}"
                + (f" Hint: {hint}" if hint else "")
                + (before_after(*graphs) if graphs else "")
            ) from None
