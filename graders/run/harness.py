"""The one run path: a kata declares cases and passes as data, the harness does everything around the call.

A `Case` is a record (model builder, input builder, the expected outcome, the hint, options); a `Pass`
names the learner's function, what it returns and the kata's own structure verdict. `apply` is the
only place a learner's pass runs on a graded model: device placement, the pristine copy, the trace, the
call (`Context.call`), lint and stale-code check. `check` adds the verdict and the comparison against
the pristine copy. Kata-particular checks (kata 03's weight formula, kata 10's harness tests) stay
ordinary functions registered with `Kata.check`. `execute` runs one check: a declaration of the frame
(graders/frame/kata.py, `Declared`) through `check` or `speed`, or the kata's own function.

May import: graders.frame, and of graders.run the check's context, the measurements (numerics,
structure, timing) and chapter 2's programs (exported); the session that drives it is above it.
"""
from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn as nn
from torch.utils._pytree import tree_map

from graders.frame.kata import Check, Declared
from graders.frame.levels import CheckFailed
import graders.run.exported as exported
from graders.run.context import Context
from graders.run.numerics import ATOL, RTOL, assert_bit_identical, assert_same_outputs
from graders.run.structure import assert_valid_graph_module, before_after
from graders.run.timing import assert_speedup


def on_device(tree, device: torch.device):
    """`tree` (a module, a tensor, or a tuple/list/dict of them) moved to `device`."""
    if isinstance(tree, nn.Module):
        return tree.to(device)
    return tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, tree)


@dataclass(frozen=True)
class Case:
    """One graded model: what to build, what to feed it, what a correct pass does to it."""

    build: Callable[[], nn.Module]
    inputs: Callable[[int], tuple] | None  # batch size -> inputs (built anywhere; moved to the device)
    expect: Any = None                     # the outcome the kata's verdict checks; None: either answer is right
    hint: str = ""
    mode: str | None = None                # "eval" or "train": the whole model in that mode; None: as built
    compare: str | Callable | None = "allclose"  # "allclose", "bit_exact", None, or compare(run) -> None
    rng: bool = False                      # the model draws random numbers: both sides run from one RNG state
    tolerance: tuple[float, float] | None = None  # (rtol, atol) for "allclose"; None: graders/run/numerics.py's
    batch_sizes: tuple[int, ...] = (1, 3)
    samples: int = 2                       # fresh draws per batch size: one sample can hide a bug
    trace: Callable[[nn.Module], fx.GraphModule] = fx.symbolic_trace
    extra: dict = field(default_factory=dict)  # anything else the kata's verdict needs
    cpu_only: str = ""  # why the model cannot run on a GPU: graded on the CPU whatever the session's device


@dataclass(frozen=True)
class Pass:
    """The learner's pass: its function name, what it returns, and the kata's structure verdict.

    `returns` fx.GraphModule: the pass returns the rewritten module. Anything else (a count, a list):
    the pass rewrites the traced module in place and returns that.
    """

    function: str
    returns: type | tuple[type, ...] = fx.GraphModule
    verdict: Callable[["Run"], dict | None] | None = None
    what: str | Callable[["Run"], str] = ""  # how messages name the rewritten module
    example_inputs: bool = False  # the pass also takes example inputs (one draw of the case's first batch size)
    compare_first: bool = False   # compare outputs before the structure verdict (the more telling failure first)

    @property
    def label(self) -> str:
        """How messages name the rewritten module, where that does not depend on the run (see Run.label)."""
        return (None if callable(self.what) else self.what) or f"the module after {self.function}"


@dataclass
class Run:
    """Everything about one application of a pass, for the verdict and the comparison."""

    ctx: Context
    case: Case
    via: Pass
    model: nn.Module          # the model that was traced (the GraphModule shares its submodules)
    pristine: nn.Module       # a deep copy taken before the trace: the reference for numerics
    before: fx.GraphModule    # a traced copy the pass never saw: the "before" graph in messages
    traced: fx.GraphModule    # the GraphModule handed to the pass
    gm: fx.GraphModule        # the rewritten GraphModule (the returned one, or `traced` for in-place passes)
    result: Any               # what the pass returned
    extra_args: tuple = ()    # what the pass was called with after the GraphModule (example inputs)
    program_before: Any = None  # chapter 2: an untouched copy of the ExportedProgram the pass was given
    added_guards: list[str] = field(default_factory=list)  # chapter 2: Called.added_guards (added_guards_sentence)

    def graphs(self) -> str:
        return before_after(self.before, self.gm)

    @property
    def label(self) -> str:
        return self.via.what(self) if callable(self.via.what) else self.via.label

    def fail(self, sentence: str, hint: str | None = None, *, graphs: bool = True):
        """Raise the check's verdict: the sentence, the hint, then the graph before and after the pass."""
        hint = self.case.hint if hint is None else hint
        raise CheckFailed(sentence + (f" Hint: {hint}" if hint else "") + (self.graphs() if graphs else ""))

    def assert_no_guard_added(self, given: str, hint: str | None = None, *, where: str = "") -> None:
        """The pass added no guard to the ShapeEnv of the `given` ("graph") it was handed (`added_guards_sentence`);
        `where` opens the sentence ("on program x ")."""
        if self.added_guards:
            self.fail(where + added_guards_sentence(self.via.function, given, self.added_guards), hint)

    def make_inputs(self, batch: int) -> tuple:
        return on_device(self.case.inputs(batch), self.ctx.device)

    def input_sets(self) -> list[tuple]:
        return [self.make_inputs(batch) for batch in self.case.batch_sizes for _ in range(self.case.samples)]

    def call_again(self, module: fx.GraphModule | None = None):
        """Run the pass once more, on its own result (idempotence checks)."""
        return self.ctx.call(self.via.function, module or self.gm, *self.extra_args, returns=self.via.returns)


def assert_sendable(ctx: Context, function: str, value, hint: str = "") -> None:
    """What a competition's worker does with what `function` returned (graders/isolation/worker.py): record it
    as data, tracing every module and helper of the learner's own with the records' tracer. Isolated, the
    worker has done it already; in a learner's run nothing else traces them, so without this a module the
    worker cannot trace (a forward that branches on a tensor's rank) keeps points here that a competition
    does not give."""
    if ctx.session.isolate:
        return
    from graders.isolation import records

    try:
        records.record_values({"result": value})
    except Exception as exc:  # noqa: BLE001 - a RecordError, or e.g. an attribute torch.save cannot pickle
        message = str(exc) if isinstance(exc, records.RecordError) else f"{type(exc).__name__}: {exc}"
        raise CheckFailed(f"{function} ran, but what it returned or left behind cannot be sent to the judge as "
                          f"data: {message}." + (f" Hint: {hint}" if hint else "")) from None


def added_guards_sentence(function: str, given: str, added: list[str]) -> str:
    """Chapter 2's one sentence for a pass that specialised a size symbol: `added` is its call's
    `Called.added_guards` (`Run.added_guards`), the guards it added to the ShapeEnv behind the fake values of the
    `given` ("program", "graph") it was handed, measured where it ran (in process, or in the worker), whatever
    way that graph or program was made."""
    shown = "; ".join(g[:200] for g in added[:3]) + (f" and {len(added) - 3} more" if len(added) > 3 else "")
    return (f"{function} added the guard(s) {shown} to the ShapeEnv of the {given} it was given: reading a size "
            "symbol's value (int(), or == in an if that its range does not decide) fixes it for every later call.")


def build(ctx: Context, case: Case) -> nn.Module:
    model = case.build()
    if case.mode == "eval":
        model.eval()
    elif case.mode == "train":
        model.train()
    return on_device(model, ctx.device)


def apply(ctx: Context, case: Case, via: Pass) -> Run:
    """The one place a learner's pass runs on a graded model."""
    if case.cpu_only and ctx.device.type != "cpu":
        ctx = ctx.on(torch.device("cpu"))  # the Run's context: its inputs, comparisons and verdict on the CPU too
    model = build(ctx, case)
    pristine = copy.deepcopy(model)
    with exported.kept_on_disk(not ctx.session.isolate):  # a worker must not reach what a later grading loads
        traced = case.trace(model)
    if isinstance(traced, exported.ExportedProgram):  # chapter 2: the pass rewrites a torch.export program
        return _apply_to_program(ctx, case, via, model, pristine, traced)
    # The same graph on modules of its own: a copy costs a third of a trace. Its nodes share meta['val'] with the
    # traced graph's (fx copies node.meta shallowly), so it shares their ShapeEnv too (make_fx keeps a symbolic
    # trace's on the module: copying it was nine tenths of copying a symbolic kata 13 graph, 35 of 39 ms).
    shape_env = getattr(traced, "shape_env", None)
    before = copy.deepcopy(traced, {id(shape_env): shape_env} if shape_env is not None else None)
    extra = (on_device(case.inputs(case.batch_sizes[0]), ctx.device),) if via.example_inputs else ()
    # `model` is watched: the pass must leave it as it was, and leaf modules it shares with `traced` show
    # whether it did. Isolated, all of these come back rebuilt from the worker's records.
    called = ctx.invoke(via.function, traced, *extra, returns=via.returns,
                        watch=(model,) if isinstance(model, nn.Module) else ())
    result, traced, model = called.result, called.args[0], (called.watched or (model,))[0]
    gm = result if isinstance(result, fx.GraphModule) else traced
    assert_valid_graph_module(gm, via.function, in_place=via.returns is not fx.GraphModule)
    return Run(ctx, case, via, model, pristine, before, traced, gm, result, extra, added_guards=called.added_guards)


def _apply_to_program(ctx: Context, case: Case, via: Pass, model: nn.Module, pristine: nn.Module,
                      given: "exported.ExportedProgram") -> Run:
    """`apply` for a pass over an ExportedProgram (`Pass.returns` ExportedProgram): the pass gets the program
    and returns a new one. The Run's `traced` is the program given, as the call left it; `program_before` an
    untouched copy; `gm` and `before` are their modules (`ExportedProgram.module()`), which the comparisons,
    the timing and the messages use as they use any GraphModule. A pass may add no guard (specialise no size
    symbol): `added_guards_sentence`, first."""
    program_before = exported.copy_program(given)
    called = ctx.invoke(via.function, given, returns=via.returns)
    result, given = called.result, called.args[0]
    if called.added_guards:
        raise CheckFailed(f"{added_guards_sentence(via.function, 'program', called.added_guards)} "
                          f"Hint: {exported.GUARD_HINT}")
    gm = exported.settle(result, program_before, via.function)
    assert_valid_graph_module(gm, via.function)
    return Run(ctx, case, via, model, pristine, program_before.module(), given, gm, result, (), program_before,
               called.added_guards)


def module_states(model: nn.Module) -> dict[str, tuple[str, dict[str, torch.Tensor]]]:
    """Every module of `model` by path: what it is (class name, configuration, mode) and its own parameters
    and buffers. By name, not by class: after isolated grading the model comes back rebuilt from records
    (graders/isolation/records/)."""
    return {path: (f"{type(m).__name__}({m.extra_repr()}){'' if m.training else ' in eval mode'}",
                   {**dict(m.named_parameters(recurse=False)), **dict(m.named_buffers(recurse=False))})
            for path, m in model.named_modules()}


def _described(kind: str | None, state: dict[str, torch.Tensor]) -> str:
    return "gone" if kind is None else f"a {kind} holding " + (
        ", ".join(f"{name} {tuple(t.shape)}" for name, t in state.items()) or "nothing")


def assert_model_unchanged(run: Run, hint: str) -> None:
    """The model that was traced keeps every module's type, parameters and buffers: symbolic_trace shares
    leaf modules with the caller's model, so a pass that edits them in place (weights, `__class__`)
    changes the caller's model, even where outputs happen to agree."""
    now = module_states(run.model)
    for path, (kind, state) in module_states(run.pristine).items():
        where, (new_kind, new_state) = f"`{path}`" if path else "(the root)", now.get(path, (None, {}))
        if new_kind != kind or state.keys() != new_state.keys():
            run.fail(f"after {run.via.function}, the module {where} of the model that was traced is "
                     f"{_described(new_kind, new_state)}; before the pass it was {_described(kind, state)}.", hint)
        changed = [key for key, t in state.items() if t.shape != new_state[key].shape
                   or not torch.equal(t, new_state[key])]
        if changed:
            run.fail(f"after {run.via.function}, the {kind.split('(')[0]} {where} of the model that was traced holds "
                     f"other values in {', '.join(changed)} than before the pass.", hint)


def compare(run: Run) -> None:
    """The rewritten module against the pristine original, as the case asks."""
    how, case = run.case.compare, run.case
    try:
        if how is None:
            return
        if callable(how):
            how(run)
        elif how == "bit_exact":
            assert_bit_identical(run.pristine, run.gm, run.input_sets(), what=run.label, hint=case.hint,
                                 graphs=(run.before, run.gm))
        elif how == "allclose":
            rtol, atol = case.tolerance or (RTOL, ATOL)
            assert_same_outputs(run.pristine, run.gm, run.input_sets(), what=run.label, hint=case.hint,
                                graphs=(run.before, run.gm), seed=1234 if case.rng else None, rtol=rtol, atol=atol)
        else:
            raise ValueError(f"unknown comparison {how!r}")
    except CheckFailed as failure:
        if run.graphs() in str(failure):
            raise
        # The rewritten module crashed: say so with the case's hint and the graphs, like any other verdict.
        raise CheckFailed(str(failure) + (f" Hint: {case.hint}" if case.hint else "") + run.graphs(),
                          failure.figures) from None


def explained(explain: Callable[[Run], None]) -> Callable[[Run], None]:
    """A `Case.compare`: the outputs compared as every kata compares them ("allclose", the case's tolerance); where
    they differ, `explain(run)` first, which fails the check naming a cause it can see (`Run.fail`) or returns, and
    the comparison's own failure stands (the case's hint is about the trap the case was built for)."""
    def compare_explained(run: Run) -> None:
        try:
            compare(replace(run, case=replace(run.case, compare="allclose")))
        except CheckFailed:
            explain(run)
            raise

    return compare_explained


def check(ctx: Context, case: Case, via: Pass) -> dict:
    """Apply the pass, give the kata's verdict on the result, then compare it with the original."""
    run = apply(ctx, case, via)
    if via.compare_first:
        compare(run)
    figures = via.verdict(run) if via.verdict else None
    if not via.compare_first:
        compare(run)
    return {**(figures or {}), **({"graded_on": f"cpu: {case.cpu_only}"} if run.ctx is not ctx else {})}


def speed(ctx: Context, case: Case, via: Pass, *, what: str, hint: str, verdict: bool = False) -> dict:
    """The L3 verdict on the kata's benchmark case, with the thresholds of the kata's manifest.

    `verdict`: the pass's structure verdict must hold on the benchmark too (after timing, so a pass
    that changes nothing is still reported by its speed)."""
    run = apply(ctx, case, via)
    batch = case.batch_sizes[0]
    figures = assert_speedup(ctx, run.before, run.gm, lambda: run.make_inputs(batch), ctx.kata.thresholds,
                             what=what, hint=hint, max_bytes_fraction=ctx.kata.max_bytes_fraction)
    return {**figures, **((via.verdict(run) or {}) if verdict and via.verdict else {})}


def hidden_rng(ctx: Context) -> random.Random:
    """The hidden-model generator's randomness: drawn from the check's seed, so the grading seed decides."""
    return random.Random(ctx.seed)


def execute(graded: Check, ctx: Context) -> dict | None:
    """Run one check: a declaration as the frame recorded it, or the kata's own check function."""
    declared = graded.run
    if not isinstance(declared, Declared):
        return declared(ctx)
    if declared.kind == "case":
        return check(ctx, declared.case, declared.via)
    if declared.kind == "hidden":
        generated = declared.generator(hidden_rng(ctx))
        return declared.grade(ctx, generated) if declared.grade else check(ctx, generated, declared.via)
    if declared.kind == "speed":
        return speed(ctx, declared.case, declared.via, **declared.options)
    raise ValueError(f"{graded.kata}: unknown declaration {declared.kind!r} of check {graded.test_id}")
