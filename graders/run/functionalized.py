"""Chapter 2's functionalized ATen graphs (kata 12): the trace a case hands the pass, and what the judge measures
on the result.

- `functionalizer(example, symbolic)` makes a `Case.trace`: the model functionalized with its mutations removed
  and traced by make_fx (graders/isolation/torch_private.py, `functionalized_graph`), every node carrying
  `meta['val']`. Fake tensors cannot be pickled, so the graph is a `TravellingGraph`: sent to a worker it drops
  them and, on arrival, propagates them again from its inputs' sizes, strides and dtypes (every dimension a size
  symbol where the trace was symbolic), so a pass reads `meta['val']` isolated as in process.
- `fresh_tensors(gm, inputs)`: the nodes that allocate a fresh tensor, with its bytes, when `gm` runs on `inputs`
  (an op in place or a view writes none): the exact count a reinplacing pass lowers.
- `aliased_inputs(outputs, inputs)`: which outputs share storage with which inputs.
- `torch_reinplaced(gm, inputs)`: torch's own pass (torch.fx.passes.reinplace) on a copy of `gm`.
- `self_read_twice(gm, inputs)`: the first in-place op that reads memory it overwrites through another argument
  (`overlaps`: shared elements, not merely a shared storage).

The guards a pass added to the ShapeEnv of a symbolic trace are measured around its call, in process or in the
worker after the graph's arrival (`Run.added_guards`: graders/run/harness.py).

May import: graders.frame, graders.isolation (torch_private).
"""
from __future__ import annotations

import copy
from typing import Callable

import torch
import torch.fx as fx
import torch.nn as nn
from torch.utils._pytree import tree_leaves

from graders.isolation import torch_private

DROPPED = ("val", "tensor_meta")  # the meta that holds fake tensors: propagated again on arrival


class OpName(str):
    """An operator overload's name ("aten.add.Tensor") standing for it in a pickled graph: overloads cannot be
    pickled."""

    def resolve(self):
        namespace, name, overload = self.split(".")
        return getattr(getattr(getattr(torch.ops, namespace), name), overload)

    def __call__(self, *args, **kwargs):  # fx asks a call_function target to be callable
        return self.resolve()(*args, **kwargs)


class TravellingGraph(fx.Graph):
    """A graph whose nodes' `meta['val']` survives pickling to a worker: dropped on the way, propagated again on
    arrival from `arrival` = (one (sizes, strides, dtype) per placeholder, symbolic or not). Its operator
    overloads travel by name."""

    arrival: tuple = ((), False)

    def __reduce__(self):
        plain, copies = fx.Graph(), {}
        for node in self.nodes:  # a plain Graph of the same nodes, names and order; overloads by name, no fake values
            target = OpName(node.target) if torch_private.is_op_overload(node.target) else node.target
            args, kwargs = fx.map_arg((node.args, node.kwargs), copies.__getitem__)
            copies[node] = plain.create_node(node.op, target, args, kwargs, name=node.name, type_expr=node.type)
            copies[node].meta = {key: value for key, value in node.meta.items() if key not in DROPPED}
        return _arrive, (plain, self.arrival)


def _arrive(graph: fx.Graph, arrival: tuple) -> TravellingGraph:
    graph.__class__ = TravellingGraph
    graph.arrival = arrival
    for node in graph.nodes:
        if isinstance(node.target, OpName):
            node.target = node.target.resolve()
    specs, symbolic = arrival
    mode, fakes = torch_private.fake_inputs(list(specs), symbolic)
    holder = fx.GraphModule(nn.Module(), graph)  # FakeTensorProp runs a module; the judge's GraphModule owns it next
    torch_private.propagate_fake(holder, fakes, mode)
    graph.owning_module = None
    return graph


def functionalizer(example: Callable[[], tuple], symbolic: bool = False) -> Callable[[nn.Module], fx.GraphModule]:
    """A `Case.trace`: make_fx of torch.func.functionalize(model, remove="mutations") on `example()`'s inputs
    ("symbolic" tracing where `symbolic`: every dimension a size symbol; else fake tensors of these sizes)."""

    def trace(model: nn.Module) -> fx.GraphModule:
        args = example()
        gm = torch_private.functionalized_graph(model, args, tracing_mode="symbolic" if symbolic else "fake")
        gm.graph.__class__ = TravellingGraph
        gm.graph.arrival = (tuple((tuple(a.shape), tuple(a.stride()), a.dtype) for a in args), symbolic)
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
