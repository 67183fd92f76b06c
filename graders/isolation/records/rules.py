"""Records, the rules both sides keep: the formats, the classes that travel whole, the allow-list of call
targets and the judge's checks of one recorded node. The worker runs the same checks early
(graders/isolation/records/encode.py), so that a learner reads the same sentence before a competition does.

May import: the standard library, torch and graders.isolation.torch_private (what an operator overload is).
"""
from __future__ import annotations

import functools
import keyword
import math
import operator
import re
import sys
import types
import unicodedata
import warnings
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from graders.isolation import torch_private

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
    nn.RNN, nn.GRU, nn.LSTM,
)
# Plain containers: rebuilt empty and refilled when a child cannot travel whole (it was traced).
CONTAINERS = {cls.__name__: cls for cls in (nn.Module, nn.Sequential, nn.ModuleList, nn.ModuleDict)}

# Overridable, yet no plain tensor operation: they take Python callables (apply_, map_, hooks), reach
# storage, shared memory, numpy, DLPack or the autograd engine, or are pickling entry points.
DENIED = {f"torch.Tensor.{name}" for name in (
    "apply_", "map_", "map2_", "register_hook", "register_post_accumulate_grad_hook", "module_load",
    "backward", "storage", "untyped_storage", "storage_type", "share_memory_", "numpy",
    "__array__", "__array_wrap__", "__dlpack__", "__dlpack_device__",
    "__reduce_ex__", "__setstate__", "__deepcopy__")} | {
    "operator.call",                                               # calls anything
    "torch.from_file", "torch.frombuffer", "torch.from_numpy"}     # files and foreign memory

# builtins.getattr reads only a tensor's public data attributes (x.shape, x.dtype, ...): reaching
# __class__, __globals__ or a bound method would reopen everything the allow-list closes.
TENSOR_ATTRIBUTES = frozenset(
    name for name in dir(torch.Tensor)
    if not name.startswith("_") and not callable(getattr(torch.Tensor, name, None))) - {"grad_fn"}

# Functions from these packages are library code: on the allow-list or refused, never traced as helpers.
LIBRARY_ROOTS = frozenset(sys.stdlib_module_names) | {"torch", "numpy", "builtins"}

OPS = ("placeholder", "get_attr", "call_function", "call_method", "call_module", "output")
PATH = re.compile(r"[A-Za-z_]\w*|\d+")                            # one step of a dotted Python module path
PLACEHOLDER = re.compile(r"\*{0,2}[A-Za-z_]\w*")                  # `x`, `*args`, `**kwargs`
QUALNAME_PART = re.compile(r"[A-Za-z_]\w*|<locals>|<lambda>")
NAME_RULE = ("a submodule's or attribute's name may be anything add_module takes (a string, not empty, no '.', "
             "none of the names the module already answers to) but a double quote, a backslash or a control, "
             "format or line-separator character (Unicode categories Cc, Cf, Cs, Zl, Zp: a newline, an escape, a "
             "bidirectional override): torch.fx writes a name that is no identifier into the code it generates as "
             "getattr(self, \"NAME\"), unescaped, and the judge shows that code")
# Where fx's getattr(self, "NAME") would not name NAME ('"' ends the string, '\\' starts an escape, a newline or
# NUL ends the line or the source, a surrogate cannot be encoded), or would garble the terminal or page that shows
# the code (control characters, invisible and bidirectional formatting marks, line and paragraph separators).
UNWRITABLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def attribute_name(step) -> bool:
    """Whether `step` may name a submodule, parameter or buffer (one step of a call_module or get_attr target):
    every name nn.Module.add_module takes, as PyTorch's passes may install (`0_relu`, `layer 1`, `fc1'`), less
    those that would break the code torch.fx generates (it writes getattr(self, "NAME") unescaped) or the
    messages that show it (NAME_RULE). Which names a module of a given class already answers to, and so
    cannot hold (add_module refuses them too), is `taken_names`."""
    return (isinstance(step, str) and bool(step) and "." not in step and '"' not in step and "\\" not in step
            and not any(unicodedata.category(c) in UNWRITABLE_CATEGORIES for c in step))


@functools.cache
def taken_names(cls: type[nn.Module]) -> frozenset[str]:
    """The names a fresh module of class `cls` already answers to: its methods and properties, nn.Module's own
    state (`training`, `_modules`, ...) and, for a GraphModule, fx's (`graph`, `code`, `meta`, `_graph`, ...).
    add_module, register_buffer and register_parameter refuse these ("attribute already exists"); so does
    the judge, so that a record cannot replace what a module needs to run. A plain container's child may be
    named `code` or `graph`, as in PyTorch; a GraphModule's may not."""
    if issubclass(cls, fx.GraphModule):
        instance = fx.GraphModule(nn.Module(), fx.Graph(), cls.__name__)
    else:
        instance = cls.__new__(cls)
        nn.Module.__init__(instance)  # the state every module has; a class's own __init__ may need arguments
    return frozenset(dir(instance)) | frozenset(dir(cls))


def check_attribute(name, owner: type[nn.Module], where: str) -> str:
    """`name`, where a module of class `owner` may hold a submodule or tensor under it: the judge's rule for the
    names in a record's module tree (a module traced into a record is rebuilt as a GraphModule)."""
    if not attribute_name(name):
        raise RecordError(f"{where}the record names an attribute {name!r:.80}, which cannot be sent: {NAME_RULE}")
    if name in taken_names(owner):
        raise RecordError(f"{where}the record names an attribute {name!r:.80}, which a {owner.__name__} cannot "
                          "hold: the module already answers to that name (add_module refuses it too)")
    return name


# ---------------------------------------------------------------------------------------------------
# The allow-list of call targets.

@functools.cache
def _allow_list() -> dict[str, Callable]:
    """{qualified name: function}: what torch.overrides covers in public torch namespaces (torch
    functions, torch.nn.functional, Tensor methods, linalg/fft/special), torch's other ATen functions,
    operator, math and builtins.getattr; less DENIED."""
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
    return {name: function for name, function in allowed.items() if name not in DENIED}


@functools.cache
def _names() -> dict[Any, str]:
    """{function: its name on the allow-list}: the first name wins (torch.conv2d is F.conv2d)."""
    names: dict[Any, str] = {}
    for name, function in _allow_list().items():
        names.setdefault(function, name)
    return names


OP_OVERLOAD = re.compile(r"torch\.ops\.(aten|prims)\.([A-Za-z_]\w*)\.([A-Za-z_]\w*)")
DENIED_OPS = frozenset({"from_file"})  # reads a file: no tensor computation


def op_overload(qualified_name: str):
    """The aten or prims operator overload "torch.ops.aten.add.Tensor" names (chapter 2's ATen graphs), or None."""
    match = OP_OVERLOAD.fullmatch(qualified_name)
    if not match or match.group(2) in DENIED_OPS:
        return None
    namespace = getattr(torch.ops, match.group(1))
    packet = getattr(namespace, match.group(2), None) if hasattr(namespace, match.group(2)) else None
    overload = getattr(packet, match.group(3), None) if packet is not None else None
    return overload if torch_private.is_op_overload(overload) else None


def allowed_function(qualified_name: str) -> Callable | None:
    """The function a call_function target names, or None when the judge must refuse it."""
    return _allow_list().get(qualified_name) or op_overload(qualified_name)


def allowed_method(name: str) -> bool:
    """May a call_method node call this method (a Tensor method on the allow-list)?"""
    return f"torch.Tensor.{name}" in _allow_list()


def target_name(function: Callable) -> str:
    """The name a record gives a call_function target: its allow-list name ("torch.relu",
    "torch.nn.functional.relu", "operator.add", "math.sqrt", "builtins.getattr"), else module.qualname."""
    if torch_private.is_op_overload(function):  # an ATen graph's target: torch.ops.aten.add.Tensor
        return f"torch.ops.{function}"
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


VALUES_FORMAT = "fx-katas values record 1"


def travels_whole(module: nn.Module) -> bool:
    return all(type(m) in SAFE_MODULES for m in module.modules())


def located(path: str) -> str:
    return f"in module {path}, " if path else ""


def check_node(op: str, name: str, target, args: list, helpers: set, where: str) -> None:
    """The judge's rules for one node (on recorded data: names, not objects)."""
    node = f"{where}node {name!r} ({op})"
    if op not in OPS or not isinstance(target, str):
        raise RecordError(f"{node} has an unknown op or target: {op!r}, {target!r:.80}")
    if op == "call_function" and target not in helpers:
        if allowed_function(target) is None:
            raise RecordError(
                f"{node} calls {target}, which is not an allowed tensor operation: the judge runs only torch "
                "functions, torch.nn.functional, Tensor methods, operator, math and builtins.getattr. A helper "
                "function of your own is traced by torch.fx, or must be inlined into the graph.")
        if target == "builtins.getattr" and not (len(args) in (2, 3) and isinstance(args[1], str)
                                                    and args[1] in TENSOR_ATTRIBUTES):
            raise RecordError(f"{node} reads attribute {args[1:2]!r} with getattr; only a tensor's public "
                              "data attributes (shape, dtype, device, ...) may be read")
    elif op == "call_method" and not allowed_method(target):
        raise RecordError(f"{node} calls method {target!r}, which is not an allowed Tensor method")
    elif op in ("call_module", "get_attr") and not all(map(attribute_name, target.split("."))):
        raise RecordError(f"{node} names {target!r:.80}, which cannot be sent: {NAME_RULE}")
    elif op == "placeholder" and not (PLACEHOLDER.fullmatch(target)
                                      and not keyword.iskeyword(target.lstrip("*"))):
        raise RecordError(f"{node} has the argument name {target!r:.80}, which is not a Python identifier")
    elif op == "output" and target != "output":
        raise RecordError(f"{node} has target {target!r:.80}; an output node's target is 'output'")


def describe_value(value) -> str:
    """A node's meta['val'] as text, the same in the worker and the judge: a fake tensor's dtype, shape (its size
    symbols by name) and stride, a SymInt's expression; what carries meta['val'] travels as this description."""
    if isinstance(value, torch.Tensor):
        shape, stride = ", ".join(map(str, value.shape)), ", ".join(map(str, value.stride()))
        return f"{str(value.dtype).removeprefix('torch.')}[{shape}] stride ({stride}) on {value.device}"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(describe_value(v) for v in value) + ")"
    return f"{type(value).__name__} {str(value)[:200]}"


def check_graph(graph: dict, helpers: set, where: str) -> None:
    for n in graph["nodes"]:
        check_node(n["op"], n["name"], n["target"], n["args"], helpers, where)
