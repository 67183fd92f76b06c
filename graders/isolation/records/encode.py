"""Records, the worker's side: a rewritten GraphModule, and the values one call of a learner function
leaves behind, encoded as data (JSON records plus tensors and torch.nn modules for torch.save).

A module of a class in SAFE_MODULES travels whole; any other module (a learner's fused module) and a
learner's helper function used as a call_function target are traced by torch.fx into nested records, so
that the judge rebuilds them without their code (graders/isolation/records/decode.py).

May import: the standard library, torch, graders.isolation.records.rules and .programs.
"""
from __future__ import annotations

import io
import json
import types
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
from torch.fx.graph import CodeGen

from graders.isolation.records.programs import PROGRAM_KIND, encode as encode_program
from graders.isolation.records.rules import (
    CONTAINERS,
    FORMAT,
    LIBRARY_ROOTS,
    VALUES_FORMAT,
    RecordError,
    check_attribute,
    check_graph,
    describe_value,
    located,
    target_name,
    travels_whole,
)


# ---------------------------------------------------------------------------------------------------
# Arguments: JSON values. None, bool, int and str stand for themselves; everything else is a
# one-key object whose key says what it is. Floats travel as float.hex: exact, -0.0, inf and nan included.

def _encode(value: Any, node: fx.Node | None, payload: Payload | None) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, str)):  # an IntEnum or str subclass travels as its plain value
        return int(value) if isinstance(value, int) else str(value)
    if isinstance(value, float):
        return {"float": float(value).hex()}
    if isinstance(value, complex):
        return {"complex": [value.real.hex(), value.imag.hex()]}
    if isinstance(value, fx.Node):
        return {"node": value.name}
    if isinstance(value, torch.Size):  # before tuple: it is one
        return {"size": [int(d) for d in value]}
    if isinstance(value, (tuple, list)):
        return {"tuple" if isinstance(value, tuple) else "list": [_encode(v, node, payload) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[_encode(k, node, payload), _encode(v, node, payload)] for k, v in value.items()]}
    if isinstance(value, slice):
        return {"slice": [_encode(v, node, payload) for v in (value.start, value.stop, value.step)]}
    if value is Ellipsis:
        return {"ellipsis": None}
    for kind in (torch.dtype, torch.memory_format, torch.layout):
        if isinstance(value, kind):
            return {kind.__name__: str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.Tensor) and payload is not None:  # a tensor literal: it goes with the tensors
        return {"tensor": payload.add("tensors", value)}
    hint = " (JSON alone cannot hold a tensor: record() carries it)" if isinstance(value, torch.Tensor) else ""
    where = f"node {node.name!r} ({node.op}) has an argument" if node is not None else "a value is"
    raise RecordError(f"{where} of type {type(value).__qualname__}, which a record cannot carry{hint}")


def graph_record(gm: fx.GraphModule, payload: Payload | None = None) -> dict:
    """The graph of `gm` as JSON-serialisable data: its nodes in order, without their meta but a description of
    meta['val'] where a node carries one (an ATen graph: `describe_value`). A tensor literal in args (rare: fx's
    own codegen cannot print one) needs a `payload` to hold it."""
    nodes = []
    for node in gm.graph.nodes:
        target = node.target
        if node.op == "call_function":
            try:
                target = target_name(target)
            except RecordError as exc:
                raise RecordError(f"node {node.name!r} (call_function): {exc}") from None
        nodes.append({"op": node.op, "name": node.name, "target": target,
                      "args": [_encode(a, node, payload) for a in node.args],
                      "kwargs": {k: _encode(v, node, payload) for k, v in node.kwargs.items()},
                      **({"val": describe_value(node.meta["val"])} if "val" in node.meta else {})})
    return {"nodes": nodes}


class Payload:
    """The tensors and whole modules a record refers to by index; one entry per object, so that
    parameters shared between modules (tied weights) stay shared after torch.load."""

    def __init__(self):
        self.lists: dict[str, list] = {"modules": [], "tensors": [], "programs": []}
        self._index: dict[int, int] = {}

    def add(self, kind: str, obj) -> int:
        if id(obj) not in self._index:
            self._index[id(obj)] = len(self.lists[kind])
            self.lists[kind].append(obj)
        return self._index[id(obj)]


class _Tracer(fx.Tracer):
    """Keeps every module but a plain container as one call_module node: it travels whole, or gets a
    record of its own, so the rebuilt tree has the original's paths and class names."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return travels_whole(m) or type(m) not in CONTAINERS.values()


def _is_helper(function) -> bool:
    """A function of the learner's own (not library code): the worker traces it into the record."""
    return (isinstance(function, types.FunctionType) and isinstance(function.__module__, str)
            and function.__module__.split(".")[0] not in LIBRARY_ROOTS)


def _trace(root, what: str, hint: str) -> fx.GraphModule:
    tracer = _Tracer()
    try:
        graph = tracer.trace(root)
    except Exception as exc:  # noqa: BLE001 - any failure of learner code under tracing
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        raise RecordError(f"{what} cannot be traced by torch.fx: {reason}; {hint}") from exc
    name = type(root).__name__ if isinstance(root, nn.Module) else root.__name__
    traced = fx.GraphModule(tracer.root, graph, name if name.isidentifier() else "GraphModule")
    if isinstance(root, nn.Module):  # GraphModule keeps only what the graph uses: keep the original tree
        for child_name, child in root._modules.items():
            if child is not None:
                traced._modules[child_name] = child  # the original child, not fx's plain stand-in for a path
        for tensor_name, tensor in root._parameters.items():
            if tensor_name not in traced._parameters and not hasattr(traced, tensor_name):
                traced.register_parameter(tensor_name, tensor)
        for tensor_name, tensor in root._buffers.items():
            if tensor is not None and not hasattr(traced, tensor_name):
                traced.register_buffer(tensor_name, tensor, persistent=tensor_name not in root._non_persistent_buffers_set)
    traced.training = root.training if isinstance(root, nn.Module) else traced.training
    return traced


def _tensors(module: nn.Module, payload: Payload, owner: type[nn.Module], path: str) -> dict:
    """A module's own tensors with how it holds them: parameter, (non-persistent) buffer, attribute. Their names
    pass the judge's rule here already (`owner`: the class the judge rebuilds the module as)."""
    out = {}
    for name, tensor in module._parameters.items():
        out[name] = {"kind": "parameter", "ref": None if tensor is None else payload.add("tensors", tensor)}
    for name, tensor in module._buffers.items():
        if tensor is not None:
            kind = "nonpersistent_buffer" if name in module._non_persistent_buffers_set else "buffer"
            out[name] = {"kind": kind, "ref": payload.add("tensors", tensor)}
    for name, value in vars(module).items():
        if isinstance(value, torch.Tensor):
            out[name] = {"kind": "attribute", "ref": payload.add("tensors", value)}
    for name in out:
        check_attribute(name, owner, located(path))
    return out


def _describe_module(module: nn.Module, path: str, payload: Payload, tracing: tuple) -> dict:
    if travels_whole(module):
        return {"kind": "saved", "ref": payload.add("modules", module)}
    if isinstance(module, fx.GraphModule):
        return {"kind": "graph", **_describe_graph_module(module, path, payload, tracing)}
    if type(module) in CONTAINERS.values():
        return {"kind": "container", "class": type(module).__name__, "training": module.training,
                "tensors": _tensors(module, payload, type(module), path),
                "children": _children(module, path, payload, tracing, type(module))}
    traced = _trace(module, f"The module {path} ({type(module).__qualname__})",
                    "a fused module must be traceable")
    return {"kind": "graph", **_describe_graph_module(traced, path, payload, tracing)}


def _children(module: nn.Module, path: str, payload: Payload, tracing: tuple, owner: type[nn.Module]) -> dict:
    return {check_attribute(name, owner, located(path)): _describe_module(child, f"{path}.{name}" if path else name,
                                                                          payload, tracing)
            for name, child in module._modules.items() if child is not None}


def _describe_graph_module(gm: fx.GraphModule, path: str, payload: Payload, tracing: tuple) -> dict:
    if type(gm.graph._codegen) is not CodeGen:
        raise RecordError(f"{located(path)}the graph uses {type(gm.graph._codegen).__name__} (pytree inputs or "
                          "outputs); a record carries graphs with the default code generation only")
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = _resolve(gm, node.target)
            if not isinstance(value, (torch.Tensor, nn.Module)):
                raise RecordError(f"{located(path)}node {node.name!r} (get_attr) reads {node.target}, a "
                                  f"{type(value).__qualname__}; a record carries tensors and modules only")
    helpers: dict[str, Any] = {}
    for node in gm.graph.nodes:
        function = node.target
        if node.op != "call_function" or not _is_helper(function):
            continue
        name = target_name(function)
        if name in helpers:
            if helpers[name][0] is not function:
                raise RecordError(f"{located(path)}two different helper functions are both named {name}; "
                                  "give each helper its own name")
            continue
        if function in tracing:
            raise RecordError(f"{located(path)}the helper {name} calls itself; a record cannot carry recursion")
        traced = _trace(function, f"{located(path)}node {node.name!r} calls {name}, a helper function that",
                        "inline it into the graph, or make it traceable")
        helpers[name] = (function, traced)
    graph = graph_record(gm, payload)
    check_graph(graph, set(helpers), located(path))  # the judge's own checks, early: a node's sentence first
    record = {
        "graph": graph, "class": type(gm).__name__, "training": gm.training,
        "stale": gm.code != gm.graph.python_code(root_module="self").src,  # graph edited, no recompile()
        "tensors": _tensors(gm, payload, fx.GraphModule, path),
        "children": _children(gm, path, payload, tracing, fx.GraphModule),
        "helpers": {name: {"module": function.__module__, "qualname": function.__qualname__,
                           **_describe_graph_module(traced, path, payload, (*tracing, function))}
                    for name, (function, traced) in helpers.items()},
    }
    return record


def _resolve(gm: nn.Module, target: str):
    value = gm
    for part in target.split("."):
        if not hasattr(value, part):
            raise RecordError(f"the graph reads {target}, which the GraphModule does not have")
        value = getattr(value, part)
    return value


def module_record(gm: fx.GraphModule) -> tuple[dict, bytes]:
    """The module tree of `gm` as (JSON-serialisable record, torch.save'd payload).

    The record holds `gm`'s graph record and, per submodule: "saved" (a SAFE_MODULES module in the
    payload), "container" (a plain container rebuilt around traced children) or "graph" (a GraphModule,
    or a learner's module traced by torch.fx: a nested record). Every tensor of a GraphModule or container
    is in the payload with how it was held; learner helper functions are nested records under "helpers".
    Raises RecordError for what cannot travel.
    """
    payload = Payload()
    tree = _describe_graph_module(gm, "", payload, ())
    return tree, _save(payload.lists)


def record(gm: fx.GraphModule) -> bytes:
    """Everything the judge needs to rebuild `gm`, as one blob that loads with weights_only=True."""
    payload = Payload()
    tree = _describe_graph_module(gm, "", payload, ())
    return _save({"format": FORMAT, "tree": json.dumps(tree), **payload.lists})


def _save(obj) -> bytes:
    buffer = io.BytesIO()
    try:
        torch.save(obj, buffer)
    except Exception as exc:  # noqa: BLE001 - e.g. a hook on a module: a function torch.save cannot pickle
        raise RecordError(f"the modules cannot be saved with torch.save: {type(exc).__name__}: {exc}") from exc
    return buffer.getvalue()


# ---------------------------------------------------------------------------------------------------
# Several values in one blob: what a worker sends back for one call of a learner's function.

def _value(value: Any, payload: Payload, where: str) -> Any:
    """One value as JSON: a module as its module record (sharing the payload, so a GraphModule and the
    model it was traced from still share their submodules and tensors), a tensor by reference, a node
    by name, plain data as itself."""
    if isinstance(value, nn.Module):
        return {"module": _describe_module(value, "", payload, ())}
    if isinstance(value, torch.export.ExportedProgram):
        return {PROGRAM_KIND: payload.add("programs", encode_program(value))}
    if isinstance(value, torch.Tensor):
        return {"tensor": payload.add("tensors", value)}
    if isinstance(value, fx.Node):
        return {"node": value.name}
    if isinstance(value, (tuple, list)) and not isinstance(value, torch.Size):
        return {"tuple" if isinstance(value, tuple) else "list": [_value(v, payload, where) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[_value(k, payload, where), _value(v, payload, where)] for k, v in value.items()]}
    try:
        return _encode(value, None, None)
    except RecordError:
        raise RecordError(f"{where} is a {type(value).__qualname__}, which cannot travel back to the judge as "
                          "data: return modules, tensors, numbers, strings, bools, nodes, or lists, tuples "
                          "and dicts of them") from None


def _structure(module: nn.Module, payload: Payload) -> dict:
    """A module's state without its behaviour: class name, mode, configuration (extra_repr), tensors and
    children. For objects the judge inspects but never runs (the caller's model after a pass): tracing
    runs forward, which can change buffers a model updates in place."""
    if travels_whole(module):
        return {"kind": "saved", "ref": payload.add("modules", module)}
    try:
        extra = str(module.extra_repr())
    except Exception as exc:  # noqa: BLE001 - the module's own code
        extra = f"<extra_repr raised {type(exc).__name__}>"
    return {"kind": "structure", "class": type(module).__name__, "training": module.training, "extra": extra,
            "tensors": _tensors(module, payload, nn.Module, ""),
            "children": {check_attribute(name, nn.Module, ""): _structure(child, payload)
                         for name, child in module._modules.items() if child is not None}}


def record_values(values: dict[str, Any], structure: tuple[str, ...] = ()) -> bytes:
    """{name: value} as one blob that loads with weights_only=True; nn.Modules become module records, the
    modules named in `structure` state-only records (`_structure`). One payload: objects shared between
    the values (a GraphModule and the model it was traced from) stay shared when rebuilt."""
    payload = Payload()
    tree = {name: {"structure": _structure(value, payload)} if name in structure and isinstance(value, nn.Module)
            else _value(value, payload, name) for name, value in values.items()}
    return _save({"format": VALUES_FORMAT, "tree": json.dumps(tree), **payload.lists})
