"""Chapter 2's graded objects: torch.export programs, made once per model structure and loaded from its bytes
for later models of it, and the run path's checks of a program a pass returned.

- `exporter(...)` makes a `Case.trace` that exports a model (graders/isolation/torch_private.py, `export`):
  the first model of a structure (`structure`: its wiring as symbolic_trace's code, its modules' configuration
  and modes, the shapes of its state and of the example inputs, the dynamic shapes) is exported and saved as
  bytes; every later model of that structure is a copy loaded from the bytes with the new model's parameters,
  buffers and BatchNorm eps put in (an export costs 0.1-0.6 s of CPU; a load, about a third of that); a model
  symbolic_trace cannot trace is exported every time. In a grading whose solution code runs in this process,
  the bytes are also kept in a folder (`cache_folder`, $FX_KATAS_EXPORT_CACHE) for later processes: a warm
  grading of kata 11 exports only its hidden models. `copy_program` copies a program in memory (copy.deepcopy,
  names kept); `round_trip` saves and loads one;
- `settle(...)` is what `apply` does with a pass's program: the given program's guards code put on it (the
  judge's own text: a worker's never reaches it) and its module built. Whether the pass added a guard is
  measured where it ran, around its call (graders/run/harness.py, `added_guards_sentence`; `GUARD_HINT`);
- `assert_program_sound(...)` is a verdict's check that the program validates, keeps its signature's
  promises and carries `meta['val']` on every node; `assert_fake_propagation(...)`, that those are fake tensors
  of the graph's own fake mode and what each node's op computes on its arguments' (strides excepted for an op
  whose strides torch's own program records otherwise than its kernels, `unfaithful_strides`);
  `assert_program_unchanged(...)`, that the program a pass was given is as it was.

May import: graders.frame, graders.isolation (torch_private).
"""
from __future__ import annotations

import contextlib
import contextvars
import copy
import hashlib
import operator
import os
import sys
from pathlib import Path
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn as nn

from graders.frame.levels import CheckFailed
from graders.frame.lifetimes import FIRST_TRACE, long_lived
from graders.frame.scratch import write_whole
from graders.isolation import torch_private

ExportedProgram = torch.export.ExportedProgram
_SAVED: dict[tuple, bytes] = {}  # per process: a model structure's program, as torch.export.save bytes


def _described_tensors(tree) -> str:
    """The shape, dtype and strides of each tensor in `tree`: what an export records of its inputs."""
    return repr(torch.utils._pytree.tree_map(
        lambda t: (tuple(t.shape), t.dtype, t.stride()) if isinstance(t, torch.Tensor) else t, tree))


# BatchNorms' eps is drawn at random in the zoos (graders/run/models.py, `bn2d`), and a program takes it only as
# the `eps` argument of its batch-norm op: a structure leaves it out, and a copy gets its model's (`_set_eps`).
BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def _configuration(module: nn.Module) -> str:
    text = module.extra_repr()
    return text.replace(f"eps={module.eps}", "eps=?") if isinstance(module, BATCH_NORMS) else text


def structure(model: nn.Module, args: tuple, dynamic_shapes: Any = None) -> tuple | None:
    """What decides the program torch.export makes of `model` on `args`, but the values of its parameters and
    buffers and its BatchNorms' eps: its wiring (the code symbolic_trace writes of its forward), each module's
    class, configuration (extra_repr) and mode, its state's and the inputs' shapes, dtypes, strides and devices,
    the dynamic shapes. None where symbolic_trace cannot trace the model (its wiring unknown: the caller exports
    afresh)."""
    try:
        wiring = fx.symbolic_trace(model).code
    except Exception:  # noqa: BLE001 - control flow on tensors, an untraceable call: no key, no sharing
        return None
    modules = tuple((path, f"{type(m).__module__}.{type(m).__qualname__}", _configuration(m), m.training)
                    for path, m in model.named_modules(remove_duplicate=False))
    state = tuple((name, tuple(t.shape), t.dtype, t.stride(), str(t.device), isinstance(t, nn.Parameter),
                   t.requires_grad) for name, t in model.state_dict(keep_vars=True).items())
    return modules, wiring, state, _described_tensors(args), repr(dynamic_shapes)


def exporter(example: Callable[[], tuple], dynamic_shapes: Any = None) -> Callable[[nn.Module], ExportedProgram]:
    """A `Case.trace` for programs: `model` exported on `example()` with `dynamic_shapes` (torch.export's
    argument, e.g. `({0: Dim("batch", min=1, max=64)},)`), from a per-process cache of its `structure`."""

    def trace(model: nn.Module) -> ExportedProgram:
        args = example()
        args = tuple(a.to(next(iter(model.parameters()), torch.empty(0)).device) if isinstance(a, torch.Tensor) else a
                     for a in args)
        key = structure(model, args, dynamic_shapes)
        entry = _entry(key) if key is not None else None
        data = _SAVED.get(key) if key is not None else None
        if data is None and entry is not None:
            data = _read(entry)
        if data is not None:
            program = _loaded_for(data, model)
            if program is not None:
                _SAVED[key] = data
                return program
        with long_lived(FIRST_TRACE):  # a process's first imports Dynamo and sympy
            program = torch_private.export(model, args, dynamic_shapes)
        if key is not None:  # bytes only for a structure a later model can share
            _SAVED[key] = data = torch_private.save_program(program)
            if entry is not None:
                _write(entry, data)
        return program

    return trace


def _loaded_for(data: bytes, model: nn.Module) -> ExportedProgram | None:
    """The program in `data` (a model of `model`'s structure, exported and saved) with `model`'s parameters,
    buffers and BatchNorm eps put in; None where the bytes do not load or the program does not fit `model`."""
    try:
        program = torch_private.load_program(data)
    except Exception:  # noqa: BLE001 - a damaged cache file: export afresh (and write it again)
        return None
    return program if _refill(program, model.state_dict(keep_vars=True)) and _set_eps(program, model) else None


def _eps_ops(program: ExportedProgram):
    """Each node of `program` whose op takes an `eps`, with that argument's position."""
    for node in program.graph.nodes:
        if node.op == "call_function" and torch_private.is_op_overload(node.target):
            names = torch_private.argument_names(node.target)
            if "eps" in names:
                yield node, names.index("eps")


def _put_eps(node: fx.Node, position: int, eps) -> None:
    if position < len(node.args):
        node.args = (*node.args[:position], eps, *node.args[position + 1:])
    else:
        node.kwargs = {**node.kwargs, "eps": eps}


def _set_eps(program: ExportedProgram, model: nn.Module) -> bool:
    """Each op's `eps` argument set to the eps of the BatchNorm of `model` that made it (its node's innermost
    nn_module_stack entry); an op made by another module keeps its eps (`structure` holds it). False where an
    op that takes an eps names no module of `model`."""
    for node, position in _eps_ops(program):
        stack = list((node.meta.get("nn_module_stack") or {}).values())
        try:
            module = model.get_submodule(stack[-1][0]) if stack else None
        except AttributeError:
            module = None
        if module is None:
            return False
        if isinstance(module, BATCH_NORMS):
            _put_eps(node, position, module.eps)
    return True


# ----------------------------------------------------------------------------------------------------------
# Programs kept across processes: in a grading that runs solution code in this process (a learner's), never in
# one whose solution code runs in a worker (the worker could write into the cache folder what a later grading
# loads: torch.export.load unpickles). The harness says which (`kept_on_disk`).

CACHE_VARIABLE = "FX_KATAS_EXPORT_CACHE"  # a folder, or "off"; unset: $XDG_CACHE_HOME (or ~/.cache)/fx-katas/exports
_FORMAT = 1  # what an entry holds and a key means: a change here starts a new set of entries
KEPT = 256  # entries in the folder at most (some 40 KB each): the least recently used go (hidden models' first)
_ON_DISK = contextvars.ContextVar("fx_katas_exports_on_disk", default=False)


@contextlib.contextmanager
def kept_on_disk(allowed: bool = True):
    """Within the block, the exporter reads and writes the cache folder (`cache_folder`), where `allowed`."""
    token = _ON_DISK.set(allowed)
    try:
        yield
    finally:
        _ON_DISK.reset(token)


def cache_folder() -> Path | None:
    """Where exported programs are kept across processes: $FX_KATAS_EXPORT_CACHE ("off", "0" or empty: nowhere),
    else fx-katas/exports under $XDG_CACHE_HOME or ~/.cache."""
    setting = os.environ.get(CACHE_VARIABLE)
    if setting is not None:
        return None if setting.strip().lower() in ("", "0", "off", "no", "false") else Path(setting).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".cache") / "fx-katas" / "exports"


def _entry(key: tuple) -> Path | None:
    folder = cache_folder() if _ON_DISK.get() else None
    if folder is None:
        return None
    text = repr((_FORMAT, torch.__version__, sys.version, key))
    return folder / f"{hashlib.sha256(text.encode()).hexdigest()}.pt2"


def _read(entry: Path) -> bytes | None:
    try:
        data = entry.read_bytes()
        os.utime(entry)  # used now: the last to go
        return data
    except OSError:
        return None


def _write(entry: Path, data: bytes) -> None:
    """`data` into `entry` whole or not at all (a temporary file renamed over it); a folder that cannot be
    written is no cache, and no failure."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        write_whole(entry, data)
        entries = sorted(entry.parent.glob("*.pt2"), key=lambda path: path.stat().st_mtime)
        for old in entries[:max(0, len(entries) - KEPT)]:
            old.unlink(missing_ok=True)
    except OSError:
        pass


def _refill(program: ExportedProgram, state: dict[str, torch.Tensor]) -> bool:
    """Put copies of `state`'s tensors (a model's parameters and buffers) into a program loaded from bytes of
    its structure; False where the two do not line up (the caller exports afresh)."""
    if set(program.state_dict) - set(state) or program.constants:
        return False
    for name, old in program.state_dict.items():
        new = state[name]
        if new.shape != old.shape or new.dtype != old.dtype or new.stride() != old.stride():
            return False
        program.state_dict[name] = new.detach().clone() if not isinstance(old, nn.Parameter) else \
            nn.Parameter(new.detach().clone(), requires_grad=old.requires_grad)
    return True


def copy_program(program: ExportedProgram) -> ExportedProgram:
    """An independent copy of a program the judge holds: a graph of its own (its nodes' meta shared, as fx's
    graph copies share it), its own signature, ranges and module call graph, and copies of its state dict's and
    constants' tensors; copy.deepcopy's, with each node's name as it was (fx's copy renames a node called after
    a Python builtin, such as the user input `input`; torch.export names nodes directly, as this does). A
    hundredth of a save and a load (0.005 s against 0.1-0.3 s a check). A program the copy would not reproduce
    is saved and loaded (`round_trip`)."""
    twin = copy.deepcopy(program)
    for new, old in zip(twin.graph.nodes, program.graph.nodes):
        if new.name != old.name:
            new.name = old.name
    twin.graph_module.recompile()
    return twin if program_text(twin) == program_text(program) else round_trip(program)


def round_trip(program: ExportedProgram) -> ExportedProgram:
    """`program` through torch.export.save and torch.export.load: what a program must survive."""
    return torch_private.load_program(torch_private.save_program(program))


GUARD_HINT = ("a rewrite keeps the program's shapes general: derive new shapes from meta['val'] (symbolic sizes) "
              "instead of reading concrete sizes, and keep range_constraints.")


def settle(result: ExportedProgram, given_before: ExportedProgram, function: str) -> fx.GraphModule:
    """The program `function` returned, made runnable: the given program's guards code put on it (what
    `ExportedProgram.module()` compiles into its guards function: the judge's own text, never a pass's, nor a
    worker's, whose records drop it), then its module. A guard the pass added shows in the ShapeEnv, not here:
    torch writes guards code only for symbols with sources, which a program loaded from bytes has none of."""
    torch_private.set_guards_code(result, torch_private.guards_code(given_before))
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


def program_text(program: ExportedProgram) -> list[str]:
    """A program as comparable text: each node (but a getitem nobody reads: a saved and loaded copy adds them for
    the unused outputs of a multi-output op), the signature and the range constraints."""
    nodes = [f"{n.name} = {n.op}[{n.target}]{n.args}{n.kwargs}" for n in program.graph.nodes
             if not (n.target is operator.getitem and not n.users)]
    return nodes + str(program.graph_signature).strip().splitlines() + [f"ranges {program.range_constraints}"]


def assert_program_unchanged(given: ExportedProgram, before: ExportedProgram, function: str, hint: str = "") -> None:
    """The program a pass was given, after the call (`given`), is what it was before (`before`, a copy): its graph,
    signature, range constraints, state dict and constants. A pass returns a new program; its caller keeps the old."""
    suffix = f" Hint: {hint}" if hint else ""
    now, then = program_text(given), program_text(before)
    if now != then:
        changed = next((f"`{b}` now reads `{a}`" for a, b in zip(now, then) if a != b),
                       f"it has {len(now)} lines of graph and signature where it had {len(then)}")
        raise CheckFailed(f"{function} changed the program it was given: {changed}. A pass over an ExportedProgram "
                          f"returns a new program and leaves the caller's as it was.{suffix}")
    for what, old, new in (("state dict", before.state_dict, given.state_dict),
                           ("constants", before.constants, given.constants)):
        if set(old) != set(new):
            raise CheckFailed(f"{function} changed the {what} of the program it was given: it holds "
                              f"{sorted(new)}, before the call {sorted(old)}.{suffix}")
        for name, tensor in old.items():
            if not (isinstance(new[name], torch.Tensor) and type(new[name]) is type(tensor)
                    and new[name].dtype == tensor.dtype and new[name].shape == tensor.shape
                    and torch.equal(new[name], tensor)):
                raise CheckFailed(f"{function} changed `{name}` in the {what} of the program it was given (its "
                                  "values, shape, dtype or class): the caller's program computes something else "
                                  f"now.{suffix}")


def _described(value) -> str:
    """A meta['val'] as text: shape, dtype and strides of each tensor (symbolic sizes as their expressions)."""
    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)} {value.dtype} strides {tuple(value.stride())}"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_described(v) for v in value) + ")"
    return repr(value)


def _tensors(value) -> list:
    return [t for t in torch.utils._pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def _own_mode(program: ExportedProgram):
    """The graph's own fake mode: its user inputs' (None where they have no fake tensor)."""
    user_inputs = set(program.graph_signature.user_inputs)
    return next((m for n in program.graph.nodes if n.name in user_inputs for t in _tensors(n.meta.get("val"))
                 if (m := torch_private.fake_mode_of(t)) is not None), None)


def _recomputed(node: fx.Node, mode) -> Any:
    """What `node`'s op computes, in `mode`, on its arguments' recorded `meta['val']`: one step of FakeTensorProp,
    on the graph's own record instead of values propagated from the placeholders, so that a node's verdict is its
    own and no earlier node's carries down."""
    args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda a: a.meta.get("val"))
    with torch_private.in_fake_mode(mode):  # no guard recorded: the program's ShapeEnv stays as the pass left it
        return node.target(*args, **kwargs)


def _checkable(node: fx.Node) -> bool:
    """A node whose op can be run again on its arguments' meta['val']: a call of a function, no mutating op (a
    validated program has none) and no nested graph (a get_attr argument has no fake value)."""
    return (node.op == "call_function" and not torch_private.is_mutating(node.target)
            and not any(a.op == "get_attr" for a in node.all_input_nodes))


def unfaithful_strides(program: ExportedProgram) -> set:
    """The ops whose strides torch's own `program` records otherwise than its fake kernels compute them on this
    device. On an NVIDIA H200 with torch 2.11 (2026-11-27), torch.export recorded a convolution with a
    channels_last weight as contiguous, where the fake kernel and cuDNN itself give channels_last: a pass that
    keeps such a node's meta['val'] as torch wrote it cannot also match the kernel."""
    mode, found = _own_mode(program), set()
    if mode is None:
        return found
    for node in filter(_checkable, program.graph.nodes):
        try:
            value = _recomputed(node, mode)
        except Exception:  # noqa: BLE001 - torch's own program: not this check's business
            continue
        if _described(value) != _described(node.meta.get("val")):
            found.add(node.target)
    return found


def _op_name(target) -> str:
    return str(target) if torch_private.is_op_overload(target) else getattr(target, "__name__", repr(target))


def _unstrided(value) -> Any:
    """`value` with every tensor as its shape and dtype alone."""
    return torch.utils._pytree.tree_map(
        lambda t: (tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else t, value)


def assert_fake_propagation(program: ExportedProgram, given: ExportedProgram, function: str,
                            hint: str = "") -> list[str]:
    """Every tensor in a node's meta['val'] is a fake tensor of the graph's own fake mode (its user inputs'), each
    placeholder's is its tensor's fake twin, and each node's op, run on its arguments' meta['val'] (FakeTensorProp's
    step), computes the node's meta['val']: shape, dtype and strides. Later passes, and torch.export's own, read
    meta['val'] as the truth. Strides are not held to an op whose strides torch's own `given` program records
    otherwise than its kernels compute them (`unfaithful_strides`); the ops whose strides went unchecked are
    returned, by name."""
    suffix = f" Hint: {hint}" if hint else ""
    nodes = list(program.graph.nodes)
    own = _own_mode(program)
    for node in nodes:
        for t in _tensors(node.meta.get("val")):
            mode = torch_private.fake_mode_of(t)
            if mode is None or (own is not None and mode is not own):
                made = "a real tensor, not a fake one" if mode is None else \
                    "a fake tensor of another FakeTensorMode than the graph's (its user inputs')"
                raise CheckFailed(f"in the program {function} returned, node {node.name}'s meta['val'] is {made}: "
                                  "meta['val'] records what a node computes as a fake tensor of the graph's own "
                                  f"fake mode, so that shapes, symbolic sizes included, stay one system.{suffix}")
    lifted = {s.arg.name: s.target for s in program.graph_signature.input_specs
              if s.kind.name in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR")}
    for node in nodes:
        tensor = program.state_dict.get(lifted.get(node.name), program.constants.get(lifted.get(node.name)))
        if isinstance(tensor, torch.Tensor) and _described(node.meta.get("val")) != _described(tensor):
            raise CheckFailed(f"in the program {function} returned, placeholder {node.name}'s meta['val'] is "
                              f"{_described(node.meta.get('val'))}, but the tensor it stands for "
                              f"({lifted[node.name]!r}) is {_described(tensor)}: a placeholder's meta['val'] is its "
                              f"tensor's fake twin.{suffix}")
    if own is None:
        return []
    unfaithful: set | None = None  # measured on the given program at the first strides that differ
    unchecked: set[str] = set()
    for node in filter(_checkable, nodes):
        try:
            value = _recomputed(node, own)
        except Exception as exc:  # noqa: BLE001 - the node's arguments do not fit its op
            said = (str(exc).strip().splitlines() or [""])[0][:300]
            raise CheckFailed(f"in the program {function} returned, node {node.name} ({_op_name(node.target)}) "
                              f"raised {type(exc).__name__} when run on its arguments' meta['val'] ({said}): its "
                              f"arguments do not fit the op, or one of their meta['val'] is not what they compute."
                              f"{suffix}") from None
        recorded = node.meta.get("val")
        if _described(value) == _described(recorded):
            continue
        if _described(_unstrided(value)) == _described(_unstrided(recorded)):
            unfaithful = unfaithful_strides(given) if unfaithful is None else unfaithful
            if node.target in unfaithful:
                unchecked.add(_op_name(node.target))
                continue
        raise CheckFailed(f"in the program {function} returned, node {node.name}'s meta['val'] is "
                          f"{_described(recorded)}, but its op run on its arguments' meta['val'] gives "
                          f"{_described(value)}: meta['val'] must be what the node computes (shape, dtype and "
                          f"strides).{suffix}")
    return sorted(unchecked)
