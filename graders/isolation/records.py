"""Records: a rewritten torch.fx GraphModule as data, and the judge's rebuild of it from that data.

In a competition the learner's pass runs in a worker process, and the judging process must never import
or run learner code. So the worker sends back DATA (`record`), and the judge rebuilds a GraphModule from
it (`rebuild`) and runs every check on the rebuilt module:

- the graph travels as a JSON record: per node its op, name, target by name, args and kwargs
  (`graph_record`); never pickled code;
- modules of the torch.nn classes in SAFE_MODULES, and every tensor, travel through torch.save and come
  back through torch.load(weights_only=True) with only those classes allowed (`module_record`);
- a module of any other class (a learner's fused module) and a learner's helper function used as a
  call_function target are traced by torch.fx in the worker into a nested graph record, so the judge
  rebuilds them as GraphModules without their code;
- the judge resolves every call_function target through an allow-list of tensor operations
  (`allowed_function`) and every call_method name against the Tensor methods on it (`allowed_method`),
  and refuses anything else with a sentence naming the node and the target.

The checks that guard the judge are the ones in `rebuild`; the worker runs the same ones early so that
a learner reads the same sentence before a competition does.
"""
from __future__ import annotations

import functools
import io
import json
import keyword
import math
import operator
import re
import sys
import types
import warnings
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from torch.fx.graph import CodeGen

FORMAT = "fx-katas graph record 1"


class RecordError(Exception):
    """A GraphModule that cannot travel as a record, or a record that the judge refuses."""


# torch.nn classes whose instances travel whole (torch.save / torch.load(weights_only=True)): their
# forward is torch's own code. Matched by exact type: a subclass may override forward.
SAFE_MODULES: tuple[type[nn.Module], ...] = (
    nn.Module, nn.Sequential, nn.ModuleList, nn.ModuleDict, nn.Identity, nn.Flatten, nn.Unflatten,
    nn.Linear, nn.Bilinear, nn.Conv1d, nn.Conv2d, nn.Conv3d,
    nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d,
    nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm, nn.GroupNorm,
    nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d, nn.Embedding,
    nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU, nn.Mish,
    nn.Hardswish, nn.Hardsigmoid, nn.Hardtanh, nn.Sigmoid, nn.LogSigmoid, nn.Tanh, nn.Softplus,
    nn.Softmax, nn.LogSoftmax,
    nn.MaxPool1d, nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d,
    nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d,
)
# Plain containers: rebuilt empty and refilled when a child cannot travel whole (it was traced).
_CONTAINERS = {cls.__name__: cls for cls in (nn.Module, nn.Sequential, nn.ModuleList, nn.ModuleDict)}

# Overridable, yet no plain tensor operation: they take Python callables (apply_, map_, hooks), reach
# storage, shared memory, numpy, DLPack or the autograd engine, or are pickling entry points.
_DENIED = {f"torch.Tensor.{name}" for name in (
    "apply_", "map_", "map2_", "register_hook", "register_post_accumulate_grad_hook", "module_load",
    "backward", "storage", "untyped_storage", "storage_type", "share_memory_", "numpy",
    "__array__", "__array_wrap__", "__dlpack__", "__dlpack_device__",
    "__reduce_ex__", "__setstate__", "__deepcopy__")} | {
    "operator.call",                                               # calls anything
    "torch.from_file", "torch.frombuffer", "torch.from_numpy"}     # files and foreign memory

# builtins.getattr reads only a tensor's public data attributes (x.shape, x.dtype, ...): reaching
# __class__, __globals__ or a bound method would reopen everything the allow-list closes.
_TENSOR_ATTRIBUTES = frozenset(
    name for name in dir(torch.Tensor)
    if not name.startswith("_") and not callable(getattr(torch.Tensor, name, None))) - {"grad_fn"}

# Functions from these packages are library code: on the allow-list or refused, never traced as helpers.
_LIBRARY_ROOTS = frozenset(sys.stdlib_module_names) | {"torch", "numpy", "builtins"}

_OPS = ("placeholder", "get_attr", "call_function", "call_method", "call_module", "output")
_PATH = re.compile(r"[A-Za-z_]\w*|\d+")                            # one step of a dotted module path
_PLACEHOLDER = re.compile(r"\*{0,2}[A-Za-z_]\w*")                  # `x`, `*args`, `**kwargs`
_QUALNAME_PART = re.compile(r"[A-Za-z_]\w*|<locals>|<lambda>")
# Attribute names a record may not install: nn.Module's and GraphModule's own machinery.
_RESERVED = frozenset(dir(fx.GraphModule)) | frozenset(vars(nn.Module()))


# ---------------------------------------------------------------------------------------------------
# The allow-list of call targets.

@functools.cache
def _allow_list() -> dict[str, Callable]:
    """{qualified name: function}: what torch.overrides covers in public torch namespaces (torch
    functions, torch.nn.functional, Tensor methods, linalg/fft/special), torch's other ATen functions,
    operator, math and builtins.getattr; less _DENIED."""
    overridable = set()
    for function in torch.overrides.get_testing_overrides():
        try:
            overridable.add(function)
        except TypeError:
            pass
    allowed: dict[str, Callable] = {}
    namespaces = [("torch", torch), ("torch.nn.functional", F), ("torch.Tensor", torch.Tensor),
                  ("torch.linalg", torch.linalg), ("torch.fft", torch.fft), ("torch.special", torch.special)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # some torch attributes warn when read
        for prefix, namespace in namespaces:
            for name in dir(namespace):
                dunder = prefix == "torch.Tensor" and name.startswith("__") and name.endswith("__")
                if name.startswith("_") and not dunder:
                    continue  # private: torch._C, torch._foreach_*, Tensor._indices ...
                function = getattr(namespace, name, None)
                try:
                    if function in overridable:
                        allowed.setdefault(f"{prefix}.{name}", function)
                except TypeError:
                    pass
        # torch's ATen functions that torch.overrides leaves out: factories (torch.zeros, torch.arange),
        # random ones (torch.rand_like) and in-place forms (torch.relu_). Tensor operations all the same.
        for name in dir(torch):
            function = getattr(torch, name, None)
            if (not name.startswith("_") and isinstance(function, types.BuiltinFunctionType)
                    and function.__qualname__.startswith("_VariableFunctionsClass.")):
                allowed.setdefault(f"torch.{name}", function)
    allowed["torch._assert"] = torch._assert  # what fx records for an assert: it raises, nothing else
    for prefix, namespace in (("operator", operator), ("math", math)):
        for name in dir(namespace):
            function = getattr(namespace, name)
            if not name.startswith("_") and isinstance(function, types.BuiltinFunctionType):
                allowed[f"{prefix}.{name}"] = function
    allowed["builtins.getattr"] = getattr
    return {name: function for name, function in allowed.items() if name not in _DENIED}


@functools.cache
def _names() -> dict[Any, str]:
    """{function: its name on the allow-list}: the first name wins (torch.conv2d is F.conv2d)."""
    names: dict[Any, str] = {}
    for name, function in _allow_list().items():
        names.setdefault(function, name)
    return names


def allowed_function(qualified_name: str) -> Callable | None:
    """The function a call_function target names, or None when the judge must refuse it."""
    return _allow_list().get(qualified_name)


def allowed_method(name: str) -> bool:
    """May a call_method node call this method (a Tensor method on the allow-list)?"""
    return f"torch.Tensor.{name}" in _allow_list()


def target_name(function: Callable) -> str:
    """The name a record gives a call_function target: its allow-list name ("torch.relu",
    "torch.nn.functional.relu", "operator.add", "math.sqrt", "builtins.getattr"), else module.qualname."""
    try:
        name = _names().get(function)
    except TypeError:  # unhashable
        name = None
    if name is not None:
        return name
    module, qualname = getattr(function, "__module__", None), getattr(function, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str):
        return f"{module}.{qualname}"
    raise RecordError(f"the call target {function!r} has no qualified name; a call_function target must "
                      "be a function")


# ---------------------------------------------------------------------------------------------------
# Arguments: JSON values. None, bool, int and str stand for themselves; everything else is a
# one-key object whose key says what it is. Floats travel as float.hex: exact, -0.0, inf and nan included.

def _encode(value: Any, node: fx.Node | None, payload: _Payload | None) -> Any:
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


# ---------------------------------------------------------------------------------------------------
# The worker's side.

def graph_record(gm: fx.GraphModule, payload: _Payload | None = None) -> dict:
    """The graph of `gm` as JSON-serialisable data: its nodes in order, without their meta. A tensor
    literal in args (rare: fx's own codegen cannot print one) needs a `payload` to hold it."""
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
                      "kwargs": {k: _encode(v, node, payload) for k, v in node.kwargs.items()}})
    return {"nodes": nodes}


class _Payload:
    """The tensors and whole modules a record refers to by index; one entry per object, so that
    parameters shared between modules (tied weights) stay shared after torch.load."""

    def __init__(self):
        self.lists: dict[str, list] = {"modules": [], "tensors": []}
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
        return _travels_whole(m) or type(m) not in _CONTAINERS.values()


def _travels_whole(module: nn.Module) -> bool:
    return all(type(m) in SAFE_MODULES for m in module.modules())


def _is_helper(function) -> bool:
    """A function of the learner's own (not library code): the worker traces it into the record."""
    return (isinstance(function, types.FunctionType) and isinstance(function.__module__, str)
            and function.__module__.split(".")[0] not in _LIBRARY_ROOTS)


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


def _at(path: str) -> str:
    return f"in module {path}, " if path else ""


def _tensors(module: nn.Module, payload: _Payload) -> dict:
    """A module's own tensors with how it holds them: parameter, (non-persistent) buffer, attribute."""
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
    return out


def _describe_module(module: nn.Module, path: str, payload: _Payload, tracing: tuple) -> dict:
    if _travels_whole(module):
        return {"kind": "saved", "ref": payload.add("modules", module)}
    if isinstance(module, fx.GraphModule):
        return {"kind": "graph", **_describe_graph_module(module, path, payload, tracing)}
    if type(module) in _CONTAINERS.values():
        return {"kind": "container", "class": type(module).__name__, "training": module.training,
                "tensors": _tensors(module, payload), "children": _children(module, path, payload, tracing)}
    traced = _trace(module, f"The module {path} ({type(module).__qualname__})",
                    "a fused module must be traceable")
    return {"kind": "graph", **_describe_graph_module(traced, path, payload, tracing)}


def _children(module: nn.Module, path: str, payload: _Payload, tracing: tuple) -> dict:
    return {name: _describe_module(child, f"{path}.{name}" if path else name, payload, tracing)
            for name, child in module._modules.items() if child is not None}


def _describe_graph_module(gm: fx.GraphModule, path: str, payload: _Payload, tracing: tuple) -> dict:
    if type(gm.graph._codegen) is not CodeGen:
        raise RecordError(f"{_at(path)}the graph uses {type(gm.graph._codegen).__name__} (pytree inputs or "
                          "outputs); a record carries graphs with the default code generation only")
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = _resolve(gm, node.target)
            if not isinstance(value, (torch.Tensor, nn.Module)):
                raise RecordError(f"{_at(path)}node {node.name!r} (get_attr) reads {node.target}, a "
                                  f"{type(value).__qualname__}; a record carries tensors and modules only")
    helpers: dict[str, Any] = {}
    for node in gm.graph.nodes:
        function = node.target
        if node.op != "call_function" or not _is_helper(function):
            continue
        name = target_name(function)
        if name in helpers:
            if helpers[name][0] is not function:
                raise RecordError(f"{_at(path)}two different helper functions are both named {name}; "
                                  "give each helper its own name")
            continue
        if function in tracing:
            raise RecordError(f"{_at(path)}the helper {name} calls itself; a record cannot carry recursion")
        traced = _trace(function, f"{_at(path)}node {node.name!r} calls {name}, a helper function that",
                        "inline it into the graph, or make it traceable")
        helpers[name] = (function, traced)
    record = {
        "graph": graph_record(gm, payload), "class": type(gm).__name__, "training": gm.training,
        "stale": gm.code != gm.graph.python_code(root_module="self").src,  # graph edited, no recompile()
        "tensors": _tensors(gm, payload), "children": _children(gm, path, payload, tracing),
        "helpers": {name: {"module": function.__module__, "qualname": function.__qualname__,
                           **_describe_graph_module(traced, path, payload, (*tracing, function))}
                    for name, (function, traced) in helpers.items()},
    }
    _check_graph(record["graph"], set(record["helpers"]), _at(path))  # the judge's own checks, early
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
    payload = _Payload()
    tree = _describe_graph_module(gm, "", payload, ())
    return tree, _save(payload.lists)


def record(gm: fx.GraphModule) -> bytes:
    """Everything the judge needs to rebuild `gm`, as one blob that loads with weights_only=True."""
    payload = _Payload()
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
# The judge's side.

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


def _check_node(op: str, name: str, target, args: list, helpers: set, where: str) -> None:
    """The judge's rules for one node (on recorded data: names, not objects)."""
    node = f"{where}node {name!r} ({op})"
    if op not in _OPS or not isinstance(target, str):
        raise RecordError(f"{node} has an unknown op or target: {op!r}, {target!r:.80}")
    if op == "call_function" and target not in helpers:
        if allowed_function(target) is None:
            raise RecordError(
                f"{node} calls {target}, which is not an allowed tensor operation: the judge runs only torch "
                "functions, torch.nn.functional, Tensor methods, operator, math and builtins.getattr. A helper "
                "function of your own is traced by torch.fx, or must be inlined into the graph.")
        if target == "builtins.getattr" and not (len(args) in (2, 3) and isinstance(args[1], str)
                                                    and args[1] in _TENSOR_ATTRIBUTES):
            raise RecordError(f"{node} reads attribute {args[1:2]!r} with getattr; only a tensor's public "
                              "data attributes (shape, dtype, device, ...) may be read")
    elif op == "call_method" and not allowed_method(target):
        raise RecordError(f"{node} calls method {target!r}, which is not an allowed Tensor method")
    elif op in ("call_module", "get_attr") and not all(_PATH.fullmatch(p) for p in target.split(".")):
        raise RecordError(f"{node} names {target!r:.80}, which is not a dotted attribute path")
    elif op == "placeholder" and not (_PLACEHOLDER.fullmatch(target)
                                      and not keyword.iskeyword(target.lstrip("*"))):
        raise RecordError(f"{node} has the argument name {target!r:.80}, which is not a Python identifier")
    elif op == "output" and target != "output":
        raise RecordError(f"{node} has target {target!r:.80}; an output node's target is 'output'")


def _check_graph(graph: dict, helpers: set, where: str) -> None:
    for n in graph["nodes"]:
        _check_node(n["op"], n["name"], n["target"], n["args"], helpers, where)


def _rebuild_graph(record: dict, helpers: dict[str, Callable], tensors: list, where: str) -> fx.Graph:
    graph, nodes = fx.Graph(), {}
    for n in record["nodes"]:
        op, name, target = n["op"], n["name"], n["target"]
        _check_node(op, name, target, n["args"], set(helpers), where)
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
        nodes[name] = node
    return graph


def _attribute_name(name, where: str) -> str:
    if not (isinstance(name, str) and _PATH.fullmatch(name) and name not in _RESERVED):
        raise RecordError(f"{where}the record names an attribute {name!r:.80}, which a module cannot hold")
    return name


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


def _rebuild_tensors(record: dict, blob, where: str) -> list:
    out = []
    for name, entry in record["tensors"].items():
        tensor = None if entry["ref"] is None else blob["tensors"][entry["ref"]]
        if tensor is not None and not isinstance(tensor, torch.Tensor):
            raise RecordError(f"{where}tensor {name!r} is a {type(tensor).__name__}, not a tensor")
        out.append((_attribute_name(name, where), entry["kind"], tensor))
    return out


def _rebuild_children(record: dict, blob, path: str) -> dict[str, nn.Module]:
    return {_attribute_name(name, _at(path)): _rebuild_module(child, blob, f"{path}.{name}" if path else name)
            for name, child in record["children"].items()}


def _rebuild_module(record: dict, blob, path: str) -> nn.Module:
    kind = record["kind"]
    if kind == "saved":
        module = blob["modules"][record["ref"]]
        if not (isinstance(module, nn.Module) and _travels_whole(module)):
            raise RecordError(f"module {path} is a {type(module).__name__}, not one of SAFE_MODULES")
        return module
    if kind == "graph":
        return _rebuild_graph_module(record, blob, path)
    if kind == "container" and record["class"] in _CONTAINERS:
        module = _CONTAINERS[record["class"]]()
        module.training = bool(record["training"])
        for name, tensor_kind, tensor in _rebuild_tensors(record, blob, _at(path)):
            _install(module, name, tensor_kind, tensor, _at(path))
        for name, child in _rebuild_children(record, blob, path).items():
            module.add_module(name, child)
        return module
    raise RecordError(f"module {path} has an unknown kind {kind!r} or class {record.get('class')!r}")


def _helper(name: str, record: dict, blob, path: str) -> Callable:
    """A learner's helper, rebuilt from its trace, as a function fx can name in generated code."""
    module, qualname = record["module"], record["qualname"]
    if not (isinstance(module, str) and isinstance(qualname, str) and name == f"{module}.{qualname}"
            and all(_PATH.fullmatch(p) and not p.isdigit() for p in module.split("."))
            and all(_QUALNAME_PART.fullmatch(p) for p in qualname.split("."))
            and module.split(".")[0] not in _LIBRARY_ROOTS):
        raise RecordError(f"{_at(path)}the helper {name!r:.80} does not name a function outside the "
                          "standard library and torch")
    gm = _rebuild_graph_module(record, blob, path, f"{_at(path)}in helper {name}, ")

    def helper(*args, **kwargs):
        return gm(*args, **kwargs)

    last = qualname.rpartition(".")[2]
    helper.__module__, helper.__qualname__ = module, qualname
    helper.__name__ = last if last.isidentifier() else "helper"  # fx names a "<lambda>" from its source
    return helper


def _rebuild_graph_module(record: dict, blob, path: str, where: str | None = None) -> fx.GraphModule:
    where = _at(path) if where is None else where
    helpers = {name: _helper(name, entry, blob, path) for name, entry in record["helpers"].items()}
    children = _rebuild_children(record, blob, path)
    tensors = _rebuild_tensors(record, blob, where)
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


# ---------------------------------------------------------------------------------------------------
# Several values in one blob: what a worker sends back for one call of a learner's function.

VALUES_FORMAT = "fx-katas values record 1"


def _value(value: Any, payload: _Payload, where: str) -> Any:
    """One value as JSON: a module as its module record (sharing the payload, so a GraphModule and the
    model it was traced from still share their submodules and tensors), a tensor by reference, a node
    by name, plain data as itself."""
    if isinstance(value, nn.Module):
        return {"module": _describe_module(value, "", payload, ())}
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


def _structure(module: nn.Module, payload: _Payload) -> dict:
    """A module's state without its behaviour: class name, mode, configuration (extra_repr), tensors and
    children. For objects the judge inspects but never runs (the caller's model after a pass): tracing
    runs forward, which can change buffers a model updates in place."""
    if _travels_whole(module):
        return {"kind": "saved", "ref": payload.add("modules", module)}
    try:
        extra = str(module.extra_repr())
    except Exception as exc:  # noqa: BLE001 - the module's own code
        extra = f"<extra_repr raised {type(exc).__name__}>"
    return {"kind": "structure", "class": type(module).__name__, "training": module.training, "extra": extra,
            "tensors": _tensors(module, payload),
            "children": {name: _structure(child, payload) for name, child in module._modules.items()
                         if child is not None}}


class RecordedStructure(nn.Module):
    """A module the judge holds as state only (class name, configuration, tensors, children)."""

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
    for tensor_name, kind, tensor in _rebuild_tensors(record, blob, _at(path)):
        _install(module, tensor_name, kind, tensor, _at(path))
    for child_name, child in record["children"].items():
        module.add_module(_attribute_name(child_name, _at(path)),
                          _rebuild_structure(child, blob, f"{path}.{child_name}" if path else child_name))
    return module


def record_values(values: dict[str, Any], structure: tuple[str, ...] = ()) -> bytes:
    """{name: value} as one blob that loads with weights_only=True; nn.Modules become module records, the
    modules named in `structure` state-only records (`_structure`). One payload: objects shared between
    the values (a GraphModule and the model it was traced from) stay shared when rebuilt."""
    payload = _Payload()
    tree = {name: {"structure": _structure(value, payload)} if name in structure and isinstance(value, nn.Module)
            else _value(value, payload, name) for name, value in values.items()}
    return _save({"format": VALUES_FORMAT, "tree": json.dumps(tree), **payload.lists})


def _rebuild_value(value: Any, blob, nodes: dict[str, fx.Node]) -> Any:
    if isinstance(value, dict) and len(value) == 1:
        (kind, body), = value.items()
        if kind == "module":
            return _rebuild_module(body, blob, "")
        if kind == "structure":
            return _rebuild_structure(body, blob, "")
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
