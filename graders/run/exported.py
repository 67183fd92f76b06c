"""Chapter 2's graded objects: torch.export programs, made once per model structure and copied from bytes, and
the run path's checks of a program a pass returned.

- `exporter(...)` makes a `Case.trace` that exports a model (graders/isolation/torch_private.py, `export`):
  the first model of a structure (its repr, the example inputs' shapes, the dynamic shapes) is exported and
  saved as bytes; every later model of that structure is a copy loaded from the bytes with the new model's
  parameters and buffers put in (an export costs a second or more; a copy, a tenth of that);
- `settle(...)` is what `apply` does with a pass's program: the guards compared with the given program's
  (a pass may not add or change one; a worker's are only text until then), the program's module built;
- `assert_program_sound(...)` is a verdict's check that the program validates, keeps its signature's
  promises and carries `meta['val']` on every node.

May import: graders.frame, graders.isolation (torch_private, records.programs).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn as nn

from graders.frame.levels import CheckFailed
from graders.isolation import torch_private
from graders.isolation.records import programs

ExportedProgram = torch.export.ExportedProgram
_SAVED: dict[tuple, bytes] = {}  # per process: a model structure's program, as torch.export.save bytes


def _shapes(tree) -> str:
    return repr(torch.utils._pytree.tree_map(lambda t: (tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else t, tree))


def exporter(example: Callable[[], tuple], dynamic_shapes: Any = None) -> Callable[[nn.Module], ExportedProgram]:
    """A `Case.trace` for programs: `model` exported on `example()` with `dynamic_shapes` (torch.export's
    argument, e.g. `({0: Dim("batch", min=1, max=64)},)`), from a per-process cache of its structure."""

    def trace(model: nn.Module) -> ExportedProgram:
        args = example()
        args = tuple(a.to(next(iter(model.parameters()), torch.empty(0)).device) if isinstance(a, torch.Tensor) else a
                     for a in args)
        key = (type(model).__qualname__, repr(model), model.training, _shapes(args), repr(dynamic_shapes),
               str(next(iter(model.state_dict().values()), torch.empty(0)).device))
        if key in _SAVED:
            program = torch_private.load_program(_SAVED[key])
            if _refill(program, model):
                return program
        program = torch_private.export(model, args, dynamic_shapes)
        _SAVED[key] = torch_private.save_program(program)
        return program

    return trace


def _refill(program: ExportedProgram, model: nn.Module) -> bool:
    """Put `model`'s parameters and buffers into a copy of a program exported from a model of its structure;
    False where the two do not line up (the caller exports afresh)."""
    state = model.state_dict(keep_vars=True)
    if set(program.state_dict) - set(state) or program.constants:
        return False
    for name, old in program.state_dict.items():
        new = state[name]
        if new.shape != old.shape or new.dtype != old.dtype:
            return False
        program.state_dict[name] = new.detach().clone() if not isinstance(old, nn.Parameter) else \
            nn.Parameter(new.detach().clone(), requires_grad=old.requires_grad)
    return True


def copy_program(program: ExportedProgram) -> ExportedProgram:
    """An independent copy of a program the judge holds (saved and loaded: its own bytes)."""
    return torch_private.load_program(torch_private.save_program(program))


def settle(result: ExportedProgram, given_before: ExportedProgram, function: str) -> fx.GraphModule:
    """The program `function` returned, made runnable: its guards must be the given program's (a pass rewrites
    the graph; it may not add, drop or change a guard), then its module (`ExportedProgram.module()`)."""
    before, after = torch_private.guards_code(given_before), programs.guards_code(result)
    if before != after:
        added, dropped = [g for g in after if g not in before], [g for g in before if g not in after]
        raise CheckFailed(f"the program {function} returned has other guards than the program it was given"
                          + (f"; added: {'; '.join(added[:3])}" if added else "")
                          + (f"; dropped: {'; '.join(dropped[:3])}" if dropped else "")
                          + ". Hint: a rewrite keeps the program's shapes general: derive new shapes from "
                            "meta['val'] (symbolic sizes) instead of reading concrete sizes, and keep range_constraints.")
    torch_private.set_guards_code(result, before)  # the judge's own text: a worker's guards are never compiled
    try:
        return result.module()
    except Exception as exc:  # noqa: BLE001 - torch refuses a program it cannot unlift
        raise CheckFailed(f"the program {function} returned cannot be turned into a module "
                          f"(ExportedProgram.module() raised {type(exc).__name__}: {str(exc)[:300]}).") from None


def assert_program_sound(program: ExportedProgram, function: str, hint: str = "") -> None:
    """`program.validate()` passes (torch's verifier: ATen ops only, the signature matches the placeholders and
    the state dict), and every node but the output carries `meta['val']`."""
    suffix = f" Hint: {hint}" if hint else ""
    try:
        program.validate()
    except Exception as exc:  # noqa: BLE001 - the verifier's sentence is the failure
        raise CheckFailed(f"the program {function} returned does not validate (ExportedProgram.validate(): "
                          f"{type(exc).__name__}: {str(exc)[:400]}).{suffix}") from None
    missing = [n.name for n in program.graph.nodes if n.op != "output" and "val" not in n.meta]
    if missing:
        raise CheckFailed(f"in the program {function} returned, node(s) {', '.join(missing[:5])} carry no "
                          "meta['val']: every node of an exported program records the fake tensor it computes, "
                          f"and later passes read it.{suffix}")
