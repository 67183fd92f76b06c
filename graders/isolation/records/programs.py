"""Records of torch.export programs (chapter 2): what a worker sends for an ExportedProgram, and the judge's
checked rebuild of it.

torch.export.load is no way to read a worker's program: on the way it unpickles with weights_only=False,
resolves any dotted `torch.*` name as a call target (`torch.os.system` included), hands symbolic-shape
strings to sympy (which evaluates them), and `ExportedProgram.module()` compiles the program's guards code.
So a program travels as torch's own JSON schema plus tensors (graders/isolation/torch_private.py,
`program_parts`), and the judge, before torch builds anything from it:

- resolves every call target through `aten_target`: an operator overload of the aten or prims namespace,
  `operator.getitem`, or an arithmetic operator on symbolic sizes; refuses nested graphs, script objects and
  any other target, naming the node;
- lets a symbolic expression hold only size symbols, integers, arithmetic and torch's own sizing functions;
- loads the tensors with torch.load(weights_only=True) and accepts only tensors;
- keeps of each node's metadata only its stack trace (the rest is provenance the judge does not need), and
  drops the program's guards code (code `ExportedProgram.module()` would compile): the run path puts the given
  program's own on it (graders/run/exported.py, `settle`). The guards a pass added travel apart, as text
  measured in the worker (graders/isolation/serve.py).

May import: the standard library, torch, and graders.isolation.torch_private.
"""
from __future__ import annotations

import io
import json
import re
from typing import Any

import torch

from graders.isolation import torch_private
from graders.isolation.records.rules import RecordError, op_overload

PROGRAM_KIND = "program"

SYMBOLIC_OPERATORS = frozenset(f"_operator.{name}" for name in (
    "getitem", "add", "sub", "mul", "floordiv", "truediv", "mod", "neg", "pow", "eq", "ne", "lt", "le", "gt", "ge",
    "and_", "or_", "not_"))
SYMBOLIC_TORCH = frozenset(f"torch.{name}" for name in ("sym_max", "sym_min", "sym_not", "sym_float", "sym_int",
                                                        "sym_ite", "sym_sqrt"))
# sympy evaluates what it parses, and torch writes expressions as sympy's srepr ("Add(Symbol('s77', positive=True,
# integer=True), Integer(1))"): an expression may name size symbols, sympy's number and arithmetic classes with
# their assumptions, and torch's sizing functions, nothing else.
EXPRESSION = re.compile(r"[\w\s+\-*/%(),.<>=!&|~']*")
EXPRESSION_NAMES = frozenset({
    "Symbol", "Integer", "Rational", "Float", "Add", "Mul", "Pow", "Max", "Min", "Mod", "PythonMod", "FloorDiv",
    "CleanDiv", "CeilDiv", "CeilToInt", "FloorToInt", "IntTrueDiv", "FloatTrueDiv", "TruncToInt", "TruncToFloat",
    "ToFloat", "Abs", "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "StrictLessThan", "StrictGreaterThan", "LessThan",
    "GreaterThan", "Equality", "Unequality", "And", "Or", "Not", "ModularIndexing", "Identity", "True", "False",
    "oo", "zoo", "nan", "Infinity", "NegativeInfinity", "One", "Zero", "NegativeOne", "Half", "sqrt", "pow",
    "OpaqueUnaryFn_sqrt", "BooleanTrue", "BooleanFalse", "positive", "negative", "nonnegative", "nonpositive",
    "integer", "real", "finite", "infinite", "zero", "nonzero", "even", "odd", "prime", "commutative"})
SYMBOL = re.compile(r"[sudqc]\d+|zuf\d+|zf\d+")
QUOTED = re.compile(r"'([^']*)'")
NUMBER = re.compile(r"\d+(\.\d*)?(e[+-]?\d+)?")


def aten_target(name: str) -> bool:
    """May a recorded program call this target? An aten or prims operator overload, getitem, or sizes' arithmetic."""
    if name in SYMBOLIC_OPERATORS or name in SYMBOLIC_TORCH:
        return True
    return op_overload(name) is not None


def _check_expression(text: Any, where: str) -> None:
    if not isinstance(text, str) or not EXPRESSION.fullmatch(text) or "__" in text:
        raise RecordError(f"{where}: the symbolic expression {str(text)[:80]!r} holds characters no size expression has")
    for quoted in QUOTED.findall(text):
        if not SYMBOL.fullmatch(quoted):
            raise RecordError(f"{where}: the symbolic expression {text[:80]!r} quotes {quoted[:40]!r}, which is no "
                              "size symbol")
    for token in re.findall(r"[A-Za-z_][\w.]*|\d[\w.]*", QUOTED.sub("", text)):
        if not (token in EXPRESSION_NAMES or SYMBOL.fullmatch(token) or NUMBER.fullmatch(token)):
            raise RecordError(f"{where}: the symbolic expression {text[:80]!r} names {token!r}, which is no size "
                              "symbol or sizing function")


def _walk(value: Any, where: str) -> None:
    """Every expression in `value` checked; nested graphs, script objects and operators as arguments refused."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key in ("as_graph", "as_custom_obj", "as_custom_objs", "as_operator", "as_sym_float") and item is not None:
                raise RecordError(f"{where}: an argument of kind {key!r}: a program may hold tensors, numbers, "
                                  "sizes and lists of them, no nested graph, script object or operator")
            if key == "expr_str":
                _check_expression(item, where)
            else:
                _walk(item, where)
    elif isinstance(value, list):
        for item in value:
            _walk(item, where)


def checked_program_json(data: bytes) -> bytes:
    """The program's JSON, checked and cleaned (metadata but stack traces dropped, guards code dropped)."""
    try:
        program = json.loads(data)
        graph = program["graph_module"]["graph"]
        nodes = graph["nodes"]
    except (ValueError, KeyError, TypeError) as exc:
        raise RecordError(f"the program is not torch.export's JSON schema ({type(exc).__name__}: {exc})") from None
    if graph.get("custom_obj_values"):
        raise RecordError("the program holds script objects; a graded program holds tensors only")
    for node in nodes:
        name = str(node.get("name", "?"))[:60]
        target = node.get("target")
        if not (isinstance(target, str) and aten_target(target)):
            raise RecordError(f"node {name!r} calls {str(target)[:100]!r}; a recorded program may call aten and prims "
                              "operator overloads, operator.getitem and arithmetic on sizes only")
        node["metadata"] = {key: value for key, value in (node.get("metadata") or {}).items()
                            if key == "stack_trace" and isinstance(value, str)}
    for symbol in program.get("range_constraints", {}):
        _check_expression(symbol, "a range constraint")
    _walk(program, "the program")
    program["guards_code"] = []  # code, never compiled here: the given program's goes on it (run/exported.py)
    return json.dumps(program).encode()


def _tensors(data: Any, what: str) -> dict:
    if not isinstance(data, bytes):
        raise RecordError(f"the program's {what} is not bytes")
    if not data:
        return {}
    try:
        loaded = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as exc:  # noqa: BLE001 - whatever the unpickler refuses
        raise RecordError(f"the program's {what} does not load with torch.load(weights_only=True) "
                          f"({type(exc).__name__})") from None
    if not (isinstance(loaded, dict) and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in loaded.items())):
        raise RecordError(f"the program's {what} holds something other than named tensors")
    return loaded


def encode(program) -> dict[str, bytes]:
    """The worker's side: a program as its parts (graders/isolation/torch_private.py, `program_parts`)."""
    try:
        return torch_private.program_parts(program)
    except Exception as exc:  # noqa: BLE001 - torch's serializer refuses what it cannot write
        raise RecordError(f"the ExportedProgram cannot be serialized by torch.export ({type(exc).__name__}: "
                          f"{str(exc)[:300]})") from None


def rebuild(parts: Any):
    """The judge's side: the program, rebuilt by torch's deserializer from checked parts, without guards code."""
    if not (isinstance(parts, dict) and isinstance(parts.get("program"), bytes)):
        raise RecordError("a program record must hold the program's JSON as bytes")
    program_json = checked_program_json(parts["program"])
    state_dict, constants = _tensors(parts.get("state_dict"), "state dict"), _tensors(parts.get("constants"), "constants")
    try:
        program = torch_private.program_from_parts(program_json, state_dict, constants)
    except Exception as exc:  # noqa: BLE001 - torch's deserializer refuses a malformed program
        raise RecordError(f"torch.export cannot rebuild the program ({type(exc).__name__}: {str(exc)[:300]})") from None
    return program

