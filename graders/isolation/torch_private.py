"""Every private or experimental PyTorch API the graders call, in one place: chapter 2's katas (11-13) grade
the ATen graphs of torch.export, make_fx/functionalization and Inductor's pattern matcher, whose APIs moved
between releases; the speed level times one block at a time through a private hook of torch.utils.benchmark's
Timer (`block_timer`). Graders, records and tests call these functions, never the torch internals behind them;
`USED` lists each internal callable with the parameters the graders pass, and tests/test_torch_private.py
checks every one against the installed torch, so an upgrade fails there, loudly, and nowhere else.
(Learners' solutions and the references import what their lesson teaches, torch._inductor.pattern_matcher
included: that is the lesson, not the graders' dependency. The correct variants of a kata's mutants.py that
follow PyTorch's own passes reach deeper, and `USED` lists what they call too.)

`CHAPTER_2` is the torch range chapter 2 was written and checked against; on an older torch its katas say
so in one sentence (`chapter_2_problem`) instead of failing with tracebacks.

May import: the standard library and torch.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import io
import inspect
import re
import warnings
from typing import Any, Callable

import torch

CHAPTER_2 = (2, 15)  # the oldest torch (major, minor) chapter 2 was checked on; pyproject.toml requires it


def torch_version() -> tuple[int, int]:
    major, minor = re.match(r"(\d+)\.(\d+)", torch.__version__).groups()
    return int(major), int(minor)


def chapter_2_problem() -> str | None:
    """Why chapter 2 cannot be graded with the installed torch, or None."""
    if torch_version() < CHAPTER_2:
        return (f"chapter 2 (katas 11-13) needs torch {CHAPTER_2[0]}.{CHAPTER_2[1]} or newer (its export, "
                f"functionalization and pattern-matcher APIs); this environment has torch {torch.__version__}")
    return None


# The torch internals a grading of katas 10-13 imports on first use: Dynamo (torch.func's transforms, torch.export,
# functionalize and symbolic make_fx import it), Inductor's decomposition table (kata 13's graphs) and its pattern
# matcher (kata 13's lesson: the solution imports it). Dynamo is 1.2 s of CPU, the three 2.9 s, in every process
# that grades one of those katas; a process that forks grading processes or workers loads them once for all its
# children (graders/batch/zygote.py, graders/isolation/nursery.py: for the katas whose grader says
# `imports_torch_internals`). tests/test_torch_private.py imports each.
FIRST_USE_MODULES = ("torch._dynamo", "torch._inductor.decomposition", "torch._inductor.pattern_matcher")

# (module, attribute path, parameters the graders pass by name or position): checked by tests/test_torch_private.py.
USED: list[tuple[str, str, tuple[str, ...]]] = [
    ("torch.export", "export", ("mod", "args", "kwargs", "dynamic_shapes", "strict")),
    ("torch.export", "ExportedProgram.run_decompositions", ("self", "decomp_table")),
    ("torch.export", "save", ("ep", "f")),
    ("torch.export", "load", ("f",)),
    ("torch._export.serde.serialize", "serialize", ("exported_program",)),
    ("torch._export.serde.serialize", "_bytes_to_dataclass", ("cls", "artifact_bytes")),
    ("torch._export.serde.serialize", "ExportedProgramDeserializer.deserialize",
     ("self", "exported_program", "state_dict", "constants", "example_inputs")),
    ("torch._guards", "detect_fake_mode", ("inputs",)),
    ("torch._ops", "OpOverload", ()),
    ("torch.fx.experimental.proxy_tensor", "make_fx", ("f", "decomposition_table", "tracing_mode")),
    ("torch.fx.passes.fake_tensor_prop", "FakeTensorProp.__init__", ("self", "module", "mode")),
    ("torch._inductor.decomposition", "select_decomp_table", ()),
    ("torch.func", "functionalize", ("func", "remove")),
    ("torch.fx.passes.reinplace", "reinplace", ("gm", "sample_args")),
    # Called by correct variants that follow PyTorch's own passes (graders/katas/kata_12_reinplace/mutants.py and
    # kata_13_sdpa_pattern's): a torch that moves them fails here too, not only in tests/test_mutants.py.
    ("torch.fx.passes.reinplace", "_maybe_get_inplace_op", ("op",)),
    ("torch._C._dynamo.guards", "compute_overlapping_tensors", ()),
    ("torch._inductor.fx_passes.fuse_attention", "_get_sfdp_patterns", ("input_device",)),
    ("torch._inductor.pattern_matcher", "gen_register_replacement",
     ("unique_name", "search_fn", "replace_fn", "example_inputs", "trace_fn", "pass_dicts", "extra_check",
      "scalar_workaround", "skip_duplicates")),
]


def resolve(module: str, path: str) -> Callable:
    target: Any = importlib.import_module(module)
    for part in path.split("."):
        target = getattr(target, part)
    return target


def signature_problems() -> list[str]:
    """Each USED callable that is missing or no longer takes the parameters the graders pass, in a sentence."""
    problems = []
    for module, path, parameters in USED:
        try:
            target = resolve(module, path)
        except (ImportError, AttributeError) as exc:
            problems.append(f"{module}.{path} is gone in torch {torch.__version__} ({type(exc).__name__}: {exc})")
            continue
        if not parameters:  # its presence is the check (a class; a C++ builtin, which has no signature to read)
            continue
        found = inspect.signature(target).parameters
        missing = [p for p in parameters if p not in found]
        if missing:
            problems.append(f"{module}.{path} in torch {torch.__version__} takes ({', '.join(found)}); the graders "
                            f"pass {', '.join(missing)}")
    return problems


# ----------------------------------------------------------------------------------------------------------
# torch.export programs

def export(model: torch.nn.Module, args: tuple, dynamic_shapes=None) -> torch.export.ExportedProgram:
    """`model` exported and decomposed to the core ATen opset, as a backend receives it: the program of
    `torch.export.export(...).run_decompositions()` (`documented_export`), where BatchNorm in eval mode appears as
    `_native_batch_norm_legit_no_training`.

    It is made in one trace where that gives the same program: torch.export's ATen mode
    (`_export(pre_dispatch=False)`, the IR `export` made before 2.6) traces below autograd, so composite ops
    arrive decomposed, and where every op it leaves is outside the core decomposition table,
    `run_decompositions()` would retrace that graph into itself. The public route exports the training IR, then
    traces it again, and each of its two traces first overrides some 700 composite operators' kernels: three
    times the one trace's CPU time (docs/grading.md, "Chapter 2's exports"). The two agree on graph, names,
    signature, state, ranges and every node's meta['val'], nn_module_stack and stack trace; only the retrace's
    provenance notes (meta['from_node'], meta['torch_fn']) are absent (tests/test_exported.py compares them on
    kata 11's kinds of model). A program with any other op is made the documented way."""
    program = aten_mode_export(model, args, dynamic_shapes)
    if program is not None:
        table = _core_table()
        if not any(node.target in table for node in program.graph.nodes):
            return program
    return documented_export(model, args, dynamic_shapes)


def aten_mode_export(model: torch.nn.Module, args: tuple, dynamic_shapes=None) -> torch.export.ExportedProgram | None:
    """`model` traced once, by torch.export's ATen mode (`_export(pre_dispatch=False)`): composite ops arrive
    decomposed, ops of the core decomposition table (hardswish, say) stay as they are. None where that trace
    refuses the model (the documented route then says why, in its own words)."""
    from torch.export._trace import _export

    try:
        return _export(model, args, dynamic_shapes=dynamic_shapes, strict=False, pre_dispatch=False)
    except Exception:  # noqa: BLE001 - whatever the one trace refuses, the documented route says in its words
        return None


def documented_export(model: torch.nn.Module, args: tuple, dynamic_shapes=None) -> torch.export.ExportedProgram:
    """`model` exported (non-strict, the default since 2.6: the training IR), then decomposed to the core ATen
    opset by `run_decompositions()` with the default table."""
    program = torch.export.export(model, args, dynamic_shapes=dynamic_shapes, strict=False)
    # Given the table: run_decompositions() materializes the default one on every call it is not, a third of its time
    return program.run_decompositions(dict(_core_table()))


def _core_table() -> dict:
    """The core ATen decomposition table (`default_decompositions()` materialized), made once and made again
    only when the process has registered operators since: importing Dynamo or Inductor registers more of them
    (c10d's functional collectives, quantized_decomposed ops), which the table then holds, so a table kept from
    before such an import would disagree with one made after it (tests/test_torch_private.py failed by the order
    its xdist worker ran tests in). Materializing costs 40-150 ms (2 s the first time after Dynamo's import);
    the count of registered operators that tells whether it is due, 5 ms. Filled in place, never rebound (the
    runtime guard, graders/isolation/guard.py, holds a rebound module global for tampering)."""
    registered = len(torch._C._dispatch_get_all_op_names())
    if _DECOMPOSITIONS_MADE.get("registered") != registered:
        _DECOMPOSITIONS.clear()
        _DECOMPOSITIONS.update(torch.export.default_decompositions().materialize())
        _DECOMPOSITIONS_MADE["registered"] = registered
    return _DECOMPOSITIONS


_DECOMPOSITIONS: dict = {}
_DECOMPOSITIONS_MADE: dict = {}  # "registered": the count of registered operators _DECOMPOSITIONS was made at
USED += [("torch.export._trace", "_export", ("mod", "args", "dynamic_shapes", "strict", "pre_dispatch")),
         ("torch._C", "_dispatch_get_all_op_names", ()),
         ("torch.export", "default_decompositions", ()),
         ("torch.export.decomp_utils", "CustomDecompTable.materialize", ("self",)),
         ("torch._export.serde.serialize", "_dict_to_dataclass", ("cls", "data"))]


def save_program(program: torch.export.ExportedProgram) -> bytes:
    """The judge's own program as bytes (torch.export.save): for copies of what the judge exported itself.
    Never load a worker's bytes with `load_program`: torch.export.load unpickles (see `program_parts`)."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        if all(t.device.type == "cpu" for t in [*program.state_dict.values(), *program.constants.values()]
               if isinstance(t, torch.Tensor)):
            # torch's archive writer warns for every weight that is not contiguous (a channels_last convolution's:
            # kata 11's `channels_last` case), and then writes the weight's whole storage with its strides and
            # offset. On the CPU that storage is the weight's own, so the copy is exact (tests/test_exported.py);
            # the warning's "not on CPU" caveat is a weight copied to the CPU first. Here it would only reach a
            # learner's grading output as a warning about the judge's own copy.
            warnings.filterwarnings("ignore", message="No complete tensor found in the group", category=UserWarning)
        torch.export.save(program, buffer)
    return buffer.getvalue()


def load_program(data: bytes) -> torch.export.ExportedProgram:
    """A copy of a program the judge saved itself (`save_program`)."""
    _hints_kept()
    return torch.export.load(io.BytesIO(data))


class _TypingWithHintsKept:
    """The `typing` module as torch.export's deserializer sees it (`_hints_kept`): get_type_hints kept per class."""

    def __init__(self, typing_module):
        self._typing, self.hints = typing_module, {}

    def __getattr__(self, name: str):
        return getattr(self._typing, name)

    def get_type_hints(self, obj, globalns=None, localns=None, include_extras=False):
        key = (obj, id(globalns), id(localns), include_extras)  # the deserializer passes its schema's own globals
        if key not in self.hints:
            self.hints[key] = self._typing.get_type_hints(obj, globalns, localns, include_extras)
        return self.hints[key]


@functools.cache
def _hints_kept() -> None:
    """torch.export's deserializer (`_dict_to_dataclass`) asks typing.get_type_hints for the schema dataclass of every
    object it reads, which evaluates that class's string annotations again each time: a third of loading one of kata
    11's hidden programs (0.128 s to 0.083 s a load, 2026-11-29). A class's hints never change, so the deserializer's
    module is given a `typing` that keeps them; no other module sees it."""
    serialize = importlib.import_module("torch._export.serde.serialize")
    serialize.typing = _TypingWithHintsKept(serialize.typing)  # once a process (functools.cache)


def program_parts(program: torch.export.ExportedProgram) -> dict[str, bytes]:
    """A worker's program as data the judge can check before anything is built from it: the graph, signature
    and ranges as torch's JSON schema ("program"), the tensors as torch.save bytes ("state_dict", "constants").
    torch.export.load itself would unpickle with weights_only=False on the way, and resolve any dotted
    `torch.*` name as a call target."""
    from torch._export.serde.serialize import serialize

    artifact = serialize(program, serialize_example_inputs=False)
    return {"program": artifact.exported_program, "state_dict": artifact.state_dict, "constants": artifact.constants}


def program_from_parts(program_json: bytes, state_dict: dict, constants: dict) -> torch.export.ExportedProgram:
    """A program rebuilt from checked parts: `program_json` already validated (records/programs.py), the tensors
    already loaded with weights_only=True (torch's deserializer takes loaded dicts as they are)."""
    from torch._export.serde import schema
    from torch._export.serde.serialize import ExportedProgramDeserializer, _bytes_to_dataclass

    _hints_kept()
    serialized = _bytes_to_dataclass(schema.ExportedProgram, program_json)
    return ExportedProgramDeserializer().deserialize(serialized, state_dict, constants, None)


def is_op_overload(target) -> bool:
    """Is `target` one overload of a registered operator (torch.ops.aten.add.Tensor)?"""
    return isinstance(target, torch._ops.OpOverload)


def is_mutating(target) -> bool:
    """Is `target` an operator overload that writes to an argument (its schema's `is_mutable`: add_, copy_)?"""
    return is_op_overload(target) and target._schema.is_mutable


def argument_names(op) -> list[str]:
    """The names of an operator overload's arguments, in order (its schema's: `op._schema.arguments`)."""
    return [argument.name for argument in op._schema.arguments]


def guards_code(program: torch.export.ExportedProgram) -> list[str]:
    """The Python source of the program's guards, which `program.module()` compiles into `_guards_fn`."""
    return list(getattr(program, "_guards_code", None) or [])


def set_guards_code(program: torch.export.ExportedProgram, code: list[str]) -> None:
    program._guards_code = list(code)


def fake_mode(values) -> Any:
    """The FakeTensorMode of fake tensors in `values` (a program's `meta['val']`s), or None."""
    from torch._guards import detect_fake_mode

    return detect_fake_mode(values)


def propagate_fake(gm: torch.fx.GraphModule, fake_inputs: list, mode) -> None:
    """Run `gm` on fake inputs in `mode`, writing each node's `meta['val']` (FakeTensorProp)."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    FakeTensorProp(gm, mode=mode).propagate_dont_convert_inputs(*fake_inputs)


# ----------------------------------------------------------------------------------------------------------
# make_fx graphs (katas 12 and 13)

def aten_graph(fn: Callable, args: tuple, *, decompositions: dict | None = None,
               tracing_mode: str = "real") -> torch.fx.GraphModule:
    """`fn` traced by make_fx to an ATen graph ("real", "fake" or "symbolic" tracing), with `decompositions`."""
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, decomposition_table=decompositions, tracing_mode=tracing_mode)(*args)


def inductor_decompositions() -> dict:
    """The decomposition table Inductor traces with: what its post-grad passes see."""
    from torch._inductor.decomposition import select_decomp_table

    return select_decomp_table()


def functionalized_graph(fn: Callable, args: tuple, *, tracing_mode: str = "fake") -> torch.fx.GraphModule:
    """`fn` functionalized with its mutations removed (torch.func.functionalize(fn, remove="mutations")) and traced
    by make_fx to an ATen graph: every op out of place, a mutation of an input written back by a trailing `copy_`.
    Every node carries `meta['val']`; traced "symbolic" on `symbolic_fakes`, the graph keeps their size symbols
    and `gm.shape_env` holds the guards."""
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(torch.func.functionalize(fn, remove="mutations"), tracing_mode=tracing_mode)(*args)


def torch_reinplace(gm: torch.fx.GraphModule, args: tuple) -> torch.fx.GraphModule:
    """torch's own reinplacing pass (torch.fx.passes.reinplace) on `gm`, in place, from sample `args`."""
    from torch.fx.passes.reinplace import reinplace

    return reinplace(gm, *args)


# ----------------------------------------------------------------------------------------------------------
# Symbolic fake inputs (katas 12 and 13): chosen dimensions symbolic, the rest static, as Inductor's graphs see them

USED += [
    ("torch._subclasses.fake_tensor", "FakeTensorMode.__init__", ("self", "shape_env", "allow_non_fake_inputs")),
    ("torch._subclasses.fake_tensor", "FakeTensorMode.from_tensor", ("self", "tensor", "symbolic_context")),
    ("torch.fx.experimental.symbolic_shapes", "StatelessSymbolicContext", ("dynamic_sizes",)),
    ("torch.fx.experimental.symbolic_shapes", "ShapeEnv.__init__", ("self",)),
]


def symbolic_fakes(tensors: list, dynamic: list) -> list:
    """Fake copies of `tensors` in a fresh FakeTensorMode with a ShapeEnv: the dimensions `dynamic[i]` (a set
    of dimension indices per tensor) become size symbols, equal sizes sharing one (duck sizing), the others
    stay static. The symbols are named the same way in every process for the same shapes and choices."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)
    fakes = []
    for tensor, dims in zip(tensors, dynamic):
        sizes = [DimDynamic.DUCK if d in dims else DimDynamic.STATIC for d in range(tensor.dim())]
        fakes.append(mode.from_tensor(tensor, symbolic_context=StatelessSymbolicContext(dynamic_sizes=sizes)))
    return fakes


# ----------------------------------------------------------------------------------------------------------
# The guards a pass added (katas 11-13): measured where the pass runs, around its call (graders/run/context.py in
# process, graders/isolation/serve.py in a worker), and sent to the judge as text

def _graphs(objects, depth: int = 0):
    """The fx graphs among `objects`: a GraphModule's, an ExportedProgram's, a Graph, inside tuples, lists and dicts
    (nested a few deep: a container that holds itself ends there)."""
    if isinstance(objects, torch.export.ExportedProgram):
        yield objects.graph
    elif isinstance(objects, torch.fx.GraphModule):
        yield objects.graph
    elif isinstance(objects, torch.fx.Graph):
        yield objects
    elif isinstance(objects, (tuple, list, dict)) and depth < 8:
        for item in objects.values() if isinstance(objects, dict) else objects:
            yield from _graphs(item, depth + 1)


def shape_guards(objects) -> list[str]:
    """The guards of every ShapeEnv behind the fake values (meta['val']: fake tensors, symbolic sizes) of the
    graphs among `objects` (GraphModules, ExportedPrograms and fx Graphs, also inside tuples, lists and dicts;
    anything else holds none), as sympy's text ("Eq(s77, 2)"), each once, in the order they were recorded.
    A fresh torch.export and a program loaded from bytes both record a guard here (torch writes a program's
    guards code only for symbols with sources, which only a fresh export has): what `int(size)` on a size
    symbol adds, wherever the program came from. The run path takes the difference around a pass's call."""
    from torch._subclasses.fake_tensor import FakeTensor

    envs: dict[int, Any] = {}
    for graph in _graphs(objects):
        for node in graph.nodes:
            meta = node.meta if isinstance(node.meta, dict) else {}
            for value in torch.utils._pytree.tree_leaves(meta.get("val")):
                if isinstance(value, FakeTensor):
                    env = value.fake_mode.shape_env
                elif isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                    env = value.node.shape_env
                else:
                    continue
                if env is not None:
                    envs.setdefault(id(env), env)
    texts: dict[str, None] = {}
    for env in envs.values():
        for guard in env.guards:
            texts.setdefault(str(guard.expr))
    return list(texts)


def guards_added(before: list[str], objects) -> list[str]:
    """The guards behind `objects` (`shape_guards`) that were not among `before` (their `shape_guards` before a
    call): what the call added, the ShapeEnvs of values it made included."""
    known = set(before)
    return [guard for guard in shape_guards(objects) if guard not in known]


# ----------------------------------------------------------------------------------------------------------
# The fake tensors of a program's meta['val'] (kata 11)

USED += [("torch._subclasses.fake_tensor", "FakeTensor", ()),
         ("torch.fx.experimental.symbolic_shapes", "ShapeEnv.suppress_guards", ("self",))]


@contextlib.contextmanager
def in_fake_mode(mode):
    """Run ops on `mode`'s fake tensors without recording guards in its ShapeEnv: a fake kernel may read a size
    symbol's hint (the convolution's picks its kernel by the batch and records `s0 > 1`), and a judge that reads
    a program's meta['val'] must not specialise it."""
    with mode, (mode.shape_env.suppress_guards() if mode.shape_env is not None else contextlib.nullcontext()):
        yield


def fake_mode_of(value) -> Any:
    """The FakeTensorMode `value` was made in, where it is a fake tensor; None for anything else (a real tensor,
    a SymInt, None)."""
    from torch._subclasses.fake_tensor import FakeTensor

    return value.fake_mode if isinstance(value, FakeTensor) else None


# ----------------------------------------------------------------------------------------------------------
# The speed level's timer (graders/run/timing.py): one block of calls at a time

USED += [("torch.utils.benchmark", "Timer._estimate_block_size", ("self", "min_run_time")),
         ("torch.utils.benchmark", "Timer.blocked_autorange", ("self", "min_run_time"))]


def block_timer(stmt: str, globals: dict, num_threads: int = 1) -> Any:
    """A torch.utils.benchmark.Timer of `stmt` that times one block of `calls` calls at a time: `block()` runs
    `blocked_autorange` with no minimum time, which times exactly one block, of the size its private
    `_estimate_block_size` gives, here `calls`, chosen once (`choose_calls`). (`timeit` would run a warm-up of at
    least 2 calls before each block: three times a slow model's block.)"""
    return _block_timer_class()(stmt, globals=globals, num_threads=num_threads)


@functools.cache
def _block_timer_class() -> type:
    # torch.utils.benchmark is imported here, at the first timing, not with this module: the records import this
    # module in every worker, which never times, and the benchmark's import takes 0.1 s and, where a CUDA toolkit is
    # installed, asks the CUDA runtime (graders/frame/lifetimes.py, fork_safe_cuda).
    import torch.utils.benchmark  # quiet: see graders/__init__.py

    class BlockTimer(torch.utils.benchmark.Timer):
        calls = 1

        def _estimate_block_size(self, min_run_time: float) -> int:
            return self.calls

        def block(self) -> float:
            """Seconds per call, over one block."""
            return self.blocked_autorange(min_run_time=0).times[0]

        def choose_calls(self, seconds: float) -> None:
            """Blocks of about `seconds`: blocks of 1, 10, 100, ... calls until one takes a tenth of it, scaled up."""
            self.calls = 1
            while True:
                took = self.block() * self.calls
                if took >= seconds / 10 or self.calls >= 10**6:
                    break
                self.calls *= 10
            self.calls = max(1, round(self.calls * seconds / max(took, 1e-9)))

    return BlockTimer
