"""Records, the judge's side: a GraphModule (or the values of one call) rebuilt from the data a worker
sent, without any of the learner's code. Every call_function target resolves through the allow-list of
tensor operations and every call_method name against the Tensor methods on it (graders/isolation/records/
rules.py); anything else is refused with a sentence naming the node and the target.

May import: the standard library, torch, graders.isolation.records.rules and .programs.
"""
from __future__ import annotations

import io
import json
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn as nn

from graders.isolation.records.programs import PROGRAM_KIND, rebuild as rebuild_program
from graders.isolation.records.rules import (
    CONTAINERS,
    FORMAT,
    LIBRARY_ROOTS,
    PATH,
    QUALNAME_PART,
    SAFE_MODULES,
    VALUES_FORMAT,
    RecordError,
    allowed_function,
    check_attribute,
    check_node,
    located,
    travels_whole,
)


def _decode(value: Any, nodes: dict[str, fx.Node], tensors: list, where: str) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if not (isinstance(value, dict) and len(value) == 1):
        raise RecordError(f"{where} has a malformed argument: {value!r:.80}")
    (kind, body), = value.items()
    if kind == "node":
        if body not in nodes:
            raise RecordError(f"{where} refers to node {body!r}, which is not defined before it")
        return nodes[body]
    if kind == "tensor" and isinstance(tensors[body], torch.Tensor):
        return tensors[body]
    if kind == "float":
        return float.fromhex(body)
    if kind == "complex":
        return complex(float.fromhex(body[0]), float.fromhex(body[1]))
    if kind == "size":
        return torch.Size([int(d) for d in body])
    if kind in ("tuple", "list"):
        items = [_decode(v, nodes, tensors, where) for v in body]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict":
        return {_decode(k, nodes, tensors, where): _decode(v, nodes, tensors, where) for k, v in body}
    if kind == "slice":
        return slice(*(_decode(v, nodes, tensors, where) for v in body))
    if kind == "ellipsis":
        return Ellipsis
    if kind == "device":
        return torch.device(body)
    for cls in (torch.dtype, torch.memory_format, torch.layout):
        if kind == cls.__name__ and isinstance(getattr(torch, str(body), None), cls):
            return getattr(torch, body)
    raise RecordError(f"{where} has an argument of unknown kind {kind!r}")


def _load(data: bytes):
    """torch.load with weights_only=True: tensors, plain containers and SAFE_MODULES classes only; a
    pickled class or function of any other kind is refused by the unpickler before anything runs."""
    try:
        with torch.serialization.safe_globals(list(SAFE_MODULES)):
            return torch.load(io.BytesIO(data), weights_only=True)
    except Exception as exc:  # noqa: BLE001 - whatever the unpickler refuses
        # torch's message is a page of advice on loading untrusted files anyway; keep only the reason.
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
        reason = next((line for line in lines if "WeightsUnpickler error:" in line), lines[0])
        reason = reason.split("WeightsUnpickler error:")[-1].split(" Please use")[0].strip()
        raise RecordError(f"the record does not load with torch.load(weights_only=True): {reason}") from None


def rebuild(data: bytes) -> fx.GraphModule:
    """The GraphModule a `record` blob describes, built without any of the learner's code."""
    blob = _load(data)
    if not (isinstance(blob, dict) and blob.get("format") == FORMAT):
        raise RecordError(f"the data is not a graph record (format {FORMAT!r})")
    try:
        return _rebuild_graph_module(json.loads(blob["tree"]), blob, "")
    except RecordError:
        raise
    except Exception as exc:  # noqa: BLE001 - a malformed record: say so rather than crash the judge
        raise RecordError(f"the record is malformed: {type(exc).__name__}: {exc}") from None


def _rebuild_graph(record: dict, helpers: dict[str, Callable], tensors: list, where: str) -> fx.Graph:
    graph, nodes = fx.Graph(), {}
    for n in record["nodes"]:
        op, name, target = n["op"], n["name"], n["target"]
        check_node(op, name, target, n["args"], set(helpers), where)
        at = f"{where}node {name!r} ({op})"
        args = tuple(_decode(a, nodes, tensors, at) for a in n["args"])
        if not all(isinstance(k, str) and k.isidentifier() for k in n["kwargs"]):
            raise RecordError(f"{at} has a keyword argument whose name is not a Python identifier")
        kwargs = {k: _decode(v, nodes, tensors, at) for k, v in n["kwargs"].items()}
        if op == "call_function":
            target = helpers.get(target) or allowed_function(target)
        node = graph.create_node(op, target, args, kwargs, name=name)
        if node.name != name:  # fx renamed it: not an identifier, or a duplicate
            raise RecordError(f"{at}: {name!r} is not a valid, unique node name")
        if "val" in n:  # the worker's description of meta['val'] (text only: graders/run/aten.py reads it)
            if not isinstance(n["val"], str):
                raise RecordError(f"{at} describes its meta['val'] with something other than text")
            node.meta["recorded_val"] = n["val"]
        nodes[name] = node
    return graph


def _install(module: nn.Module, name: str, kind: str, tensor, where: str) -> None:
    """Put `tensor` on `module` the way the original held it."""
    if name in module._parameters or name in module._buffers or name in vars(module):
        delattr(module, name)  # GraphModule's copy turns plain tensor attributes into buffers
    if kind == "parameter" and (tensor is None or isinstance(tensor, nn.Parameter)):
        module.register_parameter(name, tensor)
    elif kind in ("buffer", "nonpersistent_buffer") and isinstance(tensor, torch.Tensor):
        module.register_buffer(name, tensor, persistent=kind == "buffer")
    elif kind == "attribute" and isinstance(tensor, torch.Tensor):
        setattr(module, name, tensor)
    else:
        raise RecordError(f"{where}tensor {name!r}: {kind!r} does not fit a {type(tensor).__name__}")


def _rebuild_tensors(record: dict, blob, owner: type[nn.Module], where: str) -> list:
    out = []
    for name, entry in record["tensors"].items():
        tensor = None if entry["ref"] is None else blob["tensors"][entry["ref"]]
        if tensor is not None and not isinstance(tensor, torch.Tensor):
            raise RecordError(f"{where}tensor {name!r} is a {type(tensor).__name__}, not a tensor")
        out.append((check_attribute(name, owner, where), entry["kind"], tensor))
    return out


def _rebuild_children(record: dict, blob, owner: type[nn.Module], path: str) -> dict[str, nn.Module]:
    return {check_attribute(name, owner, located(path)): _rebuild_module(child, blob, f"{path}.{name}" if path else name)
            for name, child in record["children"].items()}


def _rebuild_module(record: dict, blob, path: str) -> nn.Module:
    kind = record["kind"]
    if kind == "saved":
        module = blob["modules"][record["ref"]]
        if not (isinstance(module, nn.Module) and travels_whole(module)):
            raise RecordError(f"module {path} is a {type(module).__name__}, not one of SAFE_MODULES")
        return module
    if kind == "graph":
        return _rebuild_graph_module(record, blob, path)
    if kind == "container" and record["class"] in CONTAINERS:
        module = CONTAINERS[record["class"]]()
        module.training = bool(record["training"])
        for name, tensor_kind, tensor in _rebuild_tensors(record, blob, type(module), located(path)):
            _install(module, name, tensor_kind, tensor, located(path))
        for name, child in _rebuild_children(record, blob, type(module), path).items():
            module.add_module(name, child)
        return module
    raise RecordError(f"module {path} has an unknown kind {kind!r} or class {record.get('class')!r}")


def _helper(name: str, record: dict, blob, path: str) -> Callable:
    """A learner's helper, rebuilt from its trace, as a function fx can name in generated code."""
    module, qualname = record["module"], record["qualname"]
    if not (isinstance(module, str) and isinstance(qualname, str) and name == f"{module}.{qualname}"
            and all(PATH.fullmatch(p) and not p.isdigit() for p in module.split("."))
            and all(QUALNAME_PART.fullmatch(p) for p in qualname.split("."))
            and module.split(".")[0] not in LIBRARY_ROOTS):
        raise RecordError(f"{located(path)}the helper {name!r:.80} does not name a function outside the "
                          "standard library and torch")
    gm = _rebuild_graph_module(record, blob, path, f"{located(path)}in helper {name}, ")

    def helper(*args, **kwargs):
        return gm(*args, **kwargs)

    last = qualname.rpartition(".")[2]
    helper.__module__, helper.__qualname__ = module, qualname
    helper.__name__ = last if last.isidentifier() else "helper"  # fx names a "<lambda>" from its source
    return helper


def _rebuild_graph_module(record: dict, blob, path: str, where: str | None = None) -> fx.GraphModule:
    where = located(path) if where is None else where
    helpers = {name: _helper(name, entry, blob, path) for name, entry in record["helpers"].items()}
    children = _rebuild_children(record, blob, fx.GraphModule, path)
    tensors = _rebuild_tensors(record, blob, fx.GraphModule, where)
    root = nn.Module()
    for name, child in children.items():
        root.add_module(name, child)
    for name, kind, tensor in tensors:
        _install(root, name, kind, tensor, where)
    graph = _rebuild_graph(record["graph"], helpers, blob["tensors"], where)
    class_name = record["class"] if isinstance(record["class"], str) and record["class"].isidentifier() \
        else "GraphModule"
    try:
        gm = fx.GraphModule(root, graph, class_name)
        gm.graph.lint()
    except Exception as exc:  # noqa: BLE001 - a target the record does not carry, a malformed graph
        raise RecordError(f"{where}the graph does not rebuild: {type(exc).__name__}: {exc}") from None
    # GraphModule copies only what the graph names, in graph order, and holds plain tensors as buffers:
    # restore the recorded tree, in its order (named_parameters() and state_dict() follow it).
    for name, child in children.items():
        gm._modules.pop(name, None)
        gm.add_module(name, child)
    for name, kind, tensor in tensors:
        _install(gm, name, kind, tensor, where)
    gm.training = bool(record["training"])
    gm.recorded_stale_code = bool(record.get("stale"))  # the worker's module ran older code than its graph
    return gm


class RecordedStructure(nn.Module):
    """A module the judge holds as state only (class name, configuration, tensors, children)."""

    recorded_extra_repr = ""  # a class attribute too: taken_names sees it, so no recorded tensor replaces it

    def __init__(self, extra: str):
        super().__init__()
        self.recorded_extra_repr = extra

    def extra_repr(self) -> str:
        return self.recorded_extra_repr

    def forward(self, *args, **kwargs):
        raise RuntimeError(f"{type(self).__name__} came back from the worker as its state only; it cannot run")


def _rebuild_structure(record: dict, blob, path: str) -> nn.Module:
    if record["kind"] == "saved":
        return _rebuild_module(record, blob, path)
    if record["kind"] != "structure":
        raise RecordError(f"module {path} has an unknown kind {record['kind']!r}")
    name = record["class"] if isinstance(record["class"], str) and record["class"].isidentifier() else "Module"
    module = type(name, (RecordedStructure,), {})(str(record["extra"]))
    module.training = bool(record["training"])
    for tensor_name, kind, tensor in _rebuild_tensors(record, blob, RecordedStructure, located(path)):
        _install(module, tensor_name, kind, tensor, located(path))
    for child_name, child in record["children"].items():
        module.add_module(check_attribute(child_name, RecordedStructure, located(path)),
                          _rebuild_structure(child, blob, f"{path}.{child_name}" if path else child_name))
    return module


def _rebuild_value(value: Any, blob, nodes: dict[str, fx.Node]) -> Any:
    if isinstance(value, dict) and len(value) == 1:
        (kind, body), = value.items()
        if kind == "module":
            return _rebuild_module(body, blob, "")
        if kind == "structure":
            return _rebuild_structure(body, blob, "")
        if kind == PROGRAM_KIND and isinstance(body, int) and 0 <= body < len(blob.get("programs", [])):
            return rebuild_program(blob["programs"][body])
        if kind in ("tuple", "list"):
            items = [_rebuild_value(v, blob, nodes) for v in body]
            return tuple(items) if kind == "tuple" else items
        if kind == "dict":
            return {_rebuild_value(k, blob, nodes): _rebuild_value(v, blob, nodes) for k, v in body}
    return _decode(value, nodes, blob["tensors"], "a returned value")


def rebuild_values(data: bytes, nodes_of: str | None = None) -> dict[str, Any]:
    """The values a `record_values` blob holds, modules rebuilt without learner code. A node refers to
    the graph of the GraphModule under `nodes_of` (the module a pass was given)."""
    blob = _load(data)
    if not (isinstance(blob, dict) and blob.get("format") == VALUES_FORMAT):
        raise RecordError(f"the data is not a values record (format {VALUES_FORMAT!r})")
    try:
        tree = json.loads(blob["tree"])
        values: dict[str, Any] = {}
        if nodes_of in tree:
            values[nodes_of] = _rebuild_value(tree[nodes_of], blob, {})
        graph_owner = values.get(nodes_of)
        nodes = {n.name: n for n in graph_owner.graph.nodes} if isinstance(graph_owner, fx.GraphModule) else {}
        for name, value in tree.items():
            if name not in values:
                values[name] = _rebuild_value(value, blob, nodes)
        return values
    except RecordError:
        raise
    except Exception as exc:  # noqa: BLE001 - a malformed record: say so rather than crash the judge
        raise RecordError(f"the record is malformed: {type(exc).__name__}: {exc}") from None
