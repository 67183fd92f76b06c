"""Numerics: does the rewritten module compute what a pristine copy of the original computes?

May import: graders.frame, graders.run.structure.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Sequence

import torch
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map

from graders.frame.levels import CheckFailed
from graders.frame.solution import describe_exception
from graders.run.structure import before_after

# fp32 tolerances. A rewrite that reassociates arithmetic (folding a scale into a weight) moves results
# by a few ulps of the *intermediate* values, so the absolute tolerance scales with the output's
# magnitude; every missing term the graders look for moves results by far more.
RTOL = 1e-4
ATOL = 1e-5


def _magnitude(output) -> float:
    """The largest finite magnitude of `output`'s values (at least 1): what the absolute tolerance scales with. An
    infinity would make every difference tolerable and a NaN none; neither is a magnitude."""
    finite = [t.detach()[t.detach().isfinite()] for t in tree_leaves(output)
              if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()]
    return max([1.0] + [t.abs().max().item() for t in finite if t.numel()])


def input_sets(make_inputs: Callable[[int], tuple], batch_sizes: Sequence[int] = (1, 3), samples: int = 2) -> list[tuple]:
    """Several fresh random draws at several batch sizes: one sample can hide a bug."""
    return [make_inputs(batch) for batch in batch_sizes for _ in range(samples)]


def cloned(inputs: tuple) -> tuple:
    """Private copies of the tensors in `inputs`: a wrong rewrite may mutate an input."""
    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, inputs)


def _cuda_devices() -> list[int]:
    """The CUDA devices whose generators a seed reaches: every one once this process has initialised CUDA
    (a CUDA grading does, as its first model moves to the device), none before. Asking
    torch.cuda.device_count() opens NVML through ctypes on every call: a grading on a CPU would pay it
    tens of thousands of times."""
    return list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []


def manual_seed(seed: int, device: torch.device | None = None) -> None:
    """torch.manual_seed for the generators a grading on `device` uses. On a CPU, with CUDA never started,
    only the CPU's: torch.manual_seed also queues a lazy seed, with a formatted stack, for each device kind
    (CUDA, XPU, MTIA), which costs more than the seeding itself."""
    if (device is not None and device.type == "cuda") or _cuda_devices():
        torch.manual_seed(seed)  # reaches CUDA's generators, as CUDA starts if it has not yet
    else:
        torch.default_generator.manual_seed(seed)


def seeded(seed: int | None):
    """Run from a fixed generator state (restored afterwards), so random ops draw the same numbers on
    both sides; `None` changes nothing."""
    if seed is None:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(torch.random.fork_rng(devices=_cuda_devices()))
    manual_seed(seed)
    return stack


def run_module(module: Callable, inputs: tuple, what: str, *, seed: int | None = None):
    try:
        with torch.no_grad(), seeded(seed):
            return module(*inputs)
    except Exception as exc:
        raise CheckFailed(f"running {what} raised {describe_exception(exc)}.") from None


def _shapes(inputs: tuple) -> str:
    return ", ".join(str(tuple(t.shape)) if isinstance(t, torch.Tensor) else repr(t) for t in inputs)


def assert_same_outputs(expected: Callable, candidate: Callable, inputs_list: list[tuple], *,
                        what: str = "the rewritten module", rtol: float = RTOL, atol: float = ATOL,
                        hint: str = "", graphs: tuple | None = None, seed: int | None = None) -> None:
    """Outputs must match in structure, shape, dtype, device and value on every input set; what a call
    returned must stay as it was through the calls after it, as the original's does; and no output may share
    storage with the module's parameters, buffers or tensor attributes where the original's does not.

    `graphs`, a (before, after) pair of GraphModules, are shown after the sentence when outputs differ.
    `seed`: both sides run from this generator state (models that draw random numbers).
    """
    earlier: list[tuple[tuple, list, list]] = []  # (inputs, the original's outputs, the candidate's), with copies
    for inputs in inputs_list:
        # The same tensors, not copies: the speed level's recheck relies on the timed input's own storage.
        want = run_module(expected, inputs, "the original model", seed=seed)
        got = run_module(candidate, inputs, what, seed=seed)
        try:
            # NaN where the original gives NaN is the same result (as describe_difference holds it, and PyTorch's own
            # accuracy checks: torch._dynamo.utils.same); anywhere else it differs
            torch.testing.assert_close(got, want, rtol=rtol, atol=atol * _magnitude(want), equal_nan=True)
        except AssertionError as exc:
            detail = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
            raise CheckFailed(
                f"{what} does not compute what the original does on inputs of shape {_shapes(inputs)}: {detail}"
                + _ending(hint, graphs)
            ) from None
        _assert_earlier_outputs_kept(earlier, what, hint, graphs)
        earlier.append((inputs, _kept(want), _kept(got)))
    _assert_no_state_shared(expected, candidate, earlier, what, hint, graphs)


def _ending(hint: str, graphs: tuple | None) -> str:
    """What every sentence of these checks ends with: the hint, then the graphs before and after the pass."""
    return (f" Hint: {hint}" if hint else "") + (before_after(*graphs) if graphs else "")


def _kept(outputs) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each tensor an output holds, with a copy of its values as returned."""
    return [(t, t.detach().clone()) for t in tree_leaves(outputs) if isinstance(t, torch.Tensor)]


def _assert_earlier_outputs_kept(earlier: list, what: str, hint: str, graphs: tuple | None) -> None:
    """A module that computes into storage of its own (a buffer, an `out=` tensor it keeps) and returns it hands
    every caller the same tensor: the next call overwrites the result the caller holds. Each call is compared
    right after it, so only a look back shows it."""
    for inputs, want, got in earlier:
        for index, ((tensor, copy), (original, original_copy)) in enumerate(zip(got, want)):
            if not torch.equal(tensor.detach(), copy) and torch.equal(original.detach(), original_copy):
                raise CheckFailed(
                    f"{what} returned on inputs of shape {_shapes(inputs)} an output (tensor {index}) that a later "
                    "call overwrote: it returns storage it keeps and writes again (a buffer of its own, an out= "
                    "tensor), so the result a caller holds changes under it; the original's stays as returned. "
                    "Return a fresh tensor (one the call allocates, or a view of its inputs)."
                    + _ending(hint, graphs))


def _storage(t: torch.Tensor) -> tuple | None:
    """Where `t`'s values live, (device, address of its storage), shared by every view of that storage; None for a
    tensor without memory of its own (no elements, meta, sparse)."""
    try:
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None
    return (t.device, storage.data_ptr()) if storage.nbytes() and storage.data_ptr() else None


def _state_storages(module) -> dict[tuple, str]:
    """The storages of `module`'s parameters, buffers and plain tensor attributes (a constant a graph reads with
    get_attr), each with how a sentence names it; empty for a callable that is no module."""
    if not isinstance(module, torch.nn.Module):
        return {}
    found: dict[tuple, str] = {}
    for path, sub in module.named_modules(remove_duplicate=False):
        held = [*(("parameter", name, t) for name, t in sub._parameters.items()),
                *(("buffer", name, t) for name, t in sub._buffers.items()),
                *(("tensor attribute", name, t) for name, t in vars(sub).items() if isinstance(t, torch.Tensor))]
        for kind, name, tensor in held:
            if isinstance(tensor, torch.Tensor) and (key := _storage(tensor)):
                found.setdefault(key, f"{kind} `{f'{path}.' if path else ''}{name}`")
    return found


def _assert_no_state_shared(expected: Callable, candidate: Callable, earlier: list, what: str, hint: str,
                            graphs: tuple | None) -> None:
    """An output in the storage of the module's own state (a stored constant returned as it is, a buffer it computes
    into) hands the caller the module's memory: a caller that writes into its result (`out += 1`, an optimiser step)
    changes the module, and every later call returns the changed value. Allowed only where the original's output
    shares its module's state too (`return self.weight`). Checked once every call has run: a module that writes the
    storage again at each call has been told by the look back, with its own sentence."""
    state = _state_storages(candidate)
    if not state:
        return
    original_state = _state_storages(expected)
    for inputs, want, got in earlier:
        for index, ((tensor, _), (original, _)) in enumerate(zip(got, want)):
            owner = state.get(_storage(tensor))
            if owner is None or _storage(original) in original_state:
                continue
            raise CheckFailed(
                f"{what} returned on inputs of shape {_shapes(inputs)} an output (tensor {index}) that shares storage "
                f"with its own {owner}; the original's output {index} is a tensor of its own, sharing no storage with "
                "the original's parameters, buffers or tensor attributes. A caller that writes into that result "
                "(out += 1, out.clamp_(...)) would change the module, and every later call would return the changed "
                "values. Return a fresh tensor: a copy (.clone()) of a stored value that the output returns as it is."
                + _ending(hint, graphs))


def describe_difference(got, want) -> str | None:
    """None when `got` is bit for bit `want` (NaN equals NaN; -0.0 differs from +0.0), else a sentence."""
    if not isinstance(want, torch.Tensor) or not isinstance(got, torch.Tensor):
        return None if type(got) is type(want) and got == want else f"got {got!r}, expected {want!r}"
    if got.shape != want.shape or got.dtype != want.dtype:
        return (f"the original returns shape {tuple(want.shape)} dtype {want.dtype}, the rewritten module "
                f"shape {tuple(got.shape)} dtype {got.dtype}")
    got, want = got.detach().cpu(), want.detach().cpu()
    part = ""
    if want.is_complex():  # each part as a float: NaN equals NaN there, and the sign of a zero part counts
        got, want = torch.view_as_real(got.resolve_conj()), torch.view_as_real(want.resolve_conj())
        part = "the {} part of "
    same = got == want
    if want.is_floating_point():
        both_nan = got.isnan() & want.isnan()
        same = (same & (got.signbit() == want.signbit())) | both_nan
    if bool(same.all()):
        return None
    where = tuple(int(i) for i in (~same).nonzero()[0])
    g, w = got[where].item(), want[where].item()
    sign = " (the same value with the other sign bit: IEEE -0.0 vs +0.0)" if g == w else ""
    if part:
        part, where = part.format(("real", "imaginary")[where[-1]]), where[:-1]
        same = same.all(dim=-1)
    return (f"at index {where} {part}the original gives {w!r}, the rewritten module {g!r}{sign}; "
            f"{int((~same).sum())} of {same.numel()} elements differ")


def assert_bit_identical(expected: Callable, candidate: Callable, inputs_list: list[tuple], *, what: str,
                         hint: str = "", graphs: tuple | None = None) -> None:
    """Every output bit for bit, call after call, the generator reseeded before each call (so a frozen
    random draw or a frozen buffer shows on the second call), each side on private copies of the inputs; what a
    call returned stays as returned, and shares no storage with the module's state unless the original's does
    (as in assert_same_outputs)."""
    earlier: list[tuple[tuple, list, list]] = []
    for call, inputs in enumerate(inputs_list, 1):
        want = run_module(expected, cloned(inputs), "the original model", seed=call)
        got = run_module(candidate, cloned(inputs), what, seed=call)
        (want_leaves, want_spec), (got_leaves, got_spec) = tree_flatten(want), tree_flatten(got)
        problem = f"it returns {got_spec}, the original {want_spec}" if got_spec != want_spec else next(
            (f"output {i}: {d}" for i, (g, w) in enumerate(zip(got_leaves, want_leaves))
             if (d := describe_difference(g, w))), None)
        if problem:
            raise CheckFailed(
                f"{what} is not bit-identical to the original on call {call} of {len(inputs_list)} (inputs of "
                f"shape {_shapes(inputs)}): {problem}." + _ending(hint, graphs))
        _assert_earlier_outputs_kept(earlier, what, hint, graphs)
        earlier.append((inputs, _kept(want), _kept(got)))
    _assert_no_state_shared(expected, candidate, earlier, what, hint, graphs)
