"""Chapter 2's functionalized ATen graphs (kata 12): the trace a case hands the pass, and what the judge measures
on the result.

- `functionalizer(example, symbolic)` makes a `Case.trace`: the model functionalized with its mutations removed
  and traced by make_fx (graders/isolation/torch_private.py, `functionalized_graph`), every node carrying
  `meta['val']`. Fake tensors cannot be pickled: the graph is traced on the channel's `travelling_fakes`, whose
  description a worker makes them again from (graders/isolation/channel.py, as for kata 13's graphs), so a pass
  reads `meta['val']` isolated as in process.
- `fresh_tensors(gm, inputs)`: the nodes that allocate a fresh tensor, with its bytes, when `gm` runs on `inputs`
  (an op in place or a view writes none): the exact count a reinplacing pass lowers.
- `aliased_inputs(outputs, inputs)`: which outputs share storage with which inputs.
- `torch_reinplaced(gm, inputs)`: torch's own pass (torch.fx.passes.reinplace) on a copy of `gm`.
- `self_read_twice(gm, inputs)`: the first in-place op that reads memory it overwrites through another argument
  (`overlaps`: shared elements, not merely a shared storage).

The guards a pass added to the ShapeEnv of a symbolic trace are measured around its call, in process or in the
worker after the graph's arrival (`Run.added_guards`: graders/run/harness.py).

May import: graders.frame, graders.isolation (torch_private, channel's `travelling_fakes`).
"""
from __future__ import annotations

import copy
from typing import Callable

import torch
import torch.fx as fx
import torch.nn as nn
from torch.utils._pytree import tree_leaves

from graders.frame.lifetimes import FIRST_TRACE, long_lived
from graders.isolation import torch_private
from graders.isolation.channel import travelling_fakes

DROPPED = ("val", "tensor_meta")  # the meta that holds fake tensors (torch_reinplaced propagates them again)


def functionalizer(example: Callable[[], tuple], symbolic: bool = False) -> Callable[[nn.Module], fx.GraphModule]:
    """A `Case.trace`: make_fx of torch.func.functionalize(model, remove="mutations") on fakes of `example()`'s
    inputs (`travelling_fakes`: where `symbolic`, every dimension a size symbol, equal sizes one; else static)."""

    def trace(model: nn.Module) -> fx.GraphModule:
        args = example()
        with long_lived(FIRST_TRACE):  # a process's first imports sympy (the fakes' ShapeEnv) and Dynamo
            fakes, gm_inputs = travelling_fakes(list(args), [set(range(a.dim())) if symbolic else set() for a in args])
            gm = torch_private.functionalized_graph(model, tuple(fakes), tracing_mode="symbolic")
        gm.meta["fake_inputs"] = gm_inputs
        # make_fx keeps a symbolic trace's ShapeEnv on the module, which cannot be pickled to a worker: its fake
        # tensors hold it too (torch_private.shape_guards).
        gm.__dict__.pop("shape_env", None)
        return gm

    return trace


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class _Fresh(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule):
        super().__init__(gm)
        self.fresh: list[tuple[str, int]] = []

    def run_node(self, node: fx.Node):
        result = super().run_node(node)
        if node.op == "call_function":
            read = {_storage(t) for t in tree_leaves([self.env.get(n) for n in node.all_input_nodes])
                    if isinstance(t, torch.Tensor)}
            made = [t for t in tree_leaves(result) if isinstance(t, torch.Tensor) and t.numel()
                    and _storage(t) not in read]
            if made:
                self.fresh.append((node.name, sum(t.numel() * t.element_size() for t in made)))
        return result


def fresh_tensors(gm: fx.GraphModule, inputs: tuple) -> list[tuple[str, int]]:
    """(node name, bytes) for each node of `gm` that writes a fresh tensor when `gm` runs on `inputs` (which it
    may change: pass copies). A view, or an op that writes one of its arguments in place, writes none."""
    interpreter = _Fresh(gm)
    with torch.no_grad():
        interpreter.run(*inputs)
    return interpreter.fresh


def aliased_inputs(outputs, inputs: tuple) -> set[tuple[int, int]]:
    """(output index, input index) for each output tensor that shares storage with an input tensor."""
    storages = {_storage(t): i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor) and t.numel()}
    return {(o, storages[_storage(t)]) for o, t in enumerate(tree_leaves(outputs))
            if isinstance(t, torch.Tensor) and t.numel() and _storage(t) in storages}


def torch_reinplaced(gm: fx.GraphModule, inputs: tuple) -> fx.GraphModule:
    """torch.fx.passes.reinplace on a copy of `gm` (a functional graph), from sample `inputs`."""
    copied = fx.GraphModule(gm, copy.deepcopy(gm.graph))
    for node in copied.graph.nodes:
        node.meta = {key: value for key, value in node.meta.items() if key not in DROPPED}
    return torch_private.torch_reinplace(copied, inputs)


def _writes_first_argument(target) -> bool:
    if not torch_private.is_op_overload(target) or not target._schema.arguments:
        return False
    alias = target._schema.arguments[0].alias_info
    return alias is not None and alias.is_write


def _elements(t: torch.Tensor) -> torch.Tensor:
    """The storage elements `t` covers, as indices into its storage (in units of its dtype)."""
    count = t.untyped_storage().nbytes() // t.element_size()
    return torch.arange(count, device=t.device).as_strided(t.shape, t.stride(), t.storage_offset())


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """`a` and `b` share an element of memory (not merely a storage: a[0] and a[1] do not)."""
    if _storage(a) != _storage(b):
        return False
    if a.element_size() != b.element_size():  # one storage read as two dtypes: counted as overlapping
        return True
    return bool(torch.isin(_elements(a).reshape(-1), _elements(b).reshape(-1)).any())


class _Clash(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule):
        super().__init__(gm)
        self.clash: str | None = None

    def run_node(self, node: fx.Node):
        if self.clash is None and node.op == "call_function" and _writes_first_argument(node.target) and node.args:
            args = [self.env.get(a) if isinstance(a, fx.Node) else a for a in node.args]
            written = args[0]
            others = [t for t in tree_leaves([args[1:], [self.env.get(n) for n in node.all_input_nodes
                                                          if n is not node.args[0]]])
                      if isinstance(t, torch.Tensor) and t.numel()]
            if isinstance(written, torch.Tensor) and written.numel() and (node.args.count(node.args[0]) > 1 or any(
                    overlaps(t, written) for t in others)):
                self.clash = node.name
        return super().run_node(node)


def self_read_twice(gm: fx.GraphModule, inputs: tuple) -> str | None:
    """The first node of `gm` that writes its first argument in place while another of its arguments overlaps the
    memory written (aten.mul_(a, a), a.add_(a.t()); a[0].add_(a[1]) reads other elements of the same storage and is
    fine), when `gm` runs on `inputs`; None if there is none. Stops at an op that raises (the comparison with eager
    tells that)."""
    interpreter = _Clash(gm)
    try:
        with torch.no_grad():
            interpreter.run(*inputs)
    except Exception:  # noqa: BLE001 - a failing op is reported by the comparison, before this check
        pass
    return interpreter.clash
