"""Grader for kata 10: the learner writes a verifier of graph passes, `verify_pass`, which must classify a battery
of passes whose truth is known (models.py): correct ones, and wrong ones that each hide from every check but one."""
from __future__ import annotations

import contextlib
import copy
import io
import itertools
import math
import time

import torch
import torch.fx as fx

from graders.run import Called, Case, CheckFailed, Context, Kata, alone, build, measure_speedup, on_device

from .models import BENCHMARK, CASES, CHECK_KEYS, eliminate_dead_code, hidden_cases, identity

KATA = Kata("10_verify_harness", imports_torch_internals=True)
SPEED = KATA.manifest["speed"]
AGREEMENT_FACTOR, NO_OP_RANGE = SPEED["agreement_factor"], SPEED["no_op_range"]
TIME_BUDGET_S, MIN_TIMED_ROUNDS = SPEED["time_budget_s"], SPEED["min_timed_rounds"]


def built(ctx: Context, case: Case) -> tuple[torch.nn.Module, tuple]:
    return build(ctx, case), on_device(case.inputs(case.batch_sizes[0]), ctx.device)


def verify(ctx: Context, model: torch.nn.Module, pass_fn, inputs: tuple, watch: tuple = (),
           tolerances: dict | None = None) -> tuple[dict, float, Called]:
    """The learner's verify_pass on one model and pass (with the caller's `tolerances`, atol and rtol, where a case
    sets them), its report checked for keys and types; with the call (the model and `watch`ed objects as they are
    afterwards)."""
    start = time.perf_counter()
    # A GraphModule whose code raises prints the generated code to stderr before re-raising: noise here.
    with contextlib.redirect_stderr(io.StringIO()):
        called = ctx.invoke("verify_pass", model, pass_fn, inputs, returns=dict, watch=watch, kwargs=tolerances)
    report, elapsed = called.result, time.perf_counter() - start
    if missing := [key for key in (*CHECK_KEYS, "speedup") if key not in report]:
        raise CheckFailed(f"verify_pass returned a dict without the key(s) {', '.join(missing)}; it must have "
                          f"{', '.join(CHECK_KEYS)} (bools) and speedup (a float).")
    for key in CHECK_KEYS:
        if not isinstance(report[key], bool):
            raise CheckFailed(f"verify_pass returned {key}={report[key]!r} ({type(report[key]).__name__}); "
                              "each check must be a Python bool (wrap a tensor result in bool(...)).")
    if not isinstance(report["speedup"], (float, int)):
        raise CheckFailed(f"verify_pass returned speedup={report['speedup']!r}; it must be a float.")
    return report, elapsed, called


def run_case(ctx: Context, name: str, case: Case) -> dict:
    """verify_pass must report the case's truth about its pass, and leave the caller's model as it was."""
    model, inputs = built(ctx, case)
    pristine = copy.deepcopy(model)
    tolerances = {key: case.extra[key] for key in ("atol", "rtol") if key in case.extra}
    report, elapsed, called = verify(ctx, model, case.extra["pass"], inputs, tolerances=tolerances)
    model = called.args[0]  # as verify_pass left it (rebuilt from the worker's record when isolated)
    label = case.extra.get("label") or name
    called_with = (" called with " + ", ".join(f"{k}={v:g}" for k, v in tolerances.items())) if tolerances else ""
    if wrong := [key for key, truth in case.expect.items() if report[key] != truth]:
        said = " and ".join(f"{key}={report[key]}" for key in wrong)
        truths = " and ".join(f"{key} is {case.expect[key]}" for key in wrong)
        # Which keys are wrong can tell two causes apart (kata.toml's `hint_when`: wrong keys -> hint)
        hint = case.extra.get("hint_when", {}).get(",".join(wrong), case.hint)
        raise CheckFailed(f"verify_pass{called_with} said {said} for the pass `{label}`, but {truths}: "
                          f"{case.extra['why']}." + (f" Hint: {hint}" if hint else ""))
    if case.extra.get("speedup_nan") and not math.isnan(report["speedup"]):
        raise CheckFailed(f"verify_pass said speedup={report['speedup']!r} for the pass `{label}`, whose transformed "
                          "model cannot run the example: no ratio exists, so speedup is nan (float('nan')), not a "
                          "number a table would rank. Hint: when timing raises, report float(\"nan\").")
    if changed := [n for n, t in pristine.state_dict().items() if not torch.equal(t, model.state_dict()[n])]:
        raise CheckFailed(f"after verify_pass ran the pass `{label}`, the model it was given has changed "
                          f"({', '.join(changed)}): run the pass on a deep copy, never on the caller's model.")
    return {"verify_pass_s": round(elapsed, 2)}


for name, case in CASES.items():
    KATA.add(case.extra["level"], name, lambda ctx, name=name, case=case: run_case(ctx, name, case))


def check_speedup(ctx: Context, pass_fn, what: str, low: float, high: float = math.inf) -> dict:
    """The learner's speedup for `pass_fn` (`what` it does) on the benchmark: between `low` and `high`, and within
    the agreement factor of the grader's own interleaved measurement."""
    expectation = f"{what} must measure " + (f"between {low} and {high}" if high < math.inf else f"at least {low}x")
    model, inputs = built(ctx, BENCHMARK)
    baseline, candidate = fx.symbolic_trace(copy.deepcopy(model)), pass_fn(fx.symbolic_trace(copy.deepcopy(model)))
    with alone():  # the learner's timing loop and the grader's
        report, elapsed, _ = verify(ctx, model, pass_fn, inputs)
        theirs = float(report["speedup"])
        # The grader's own reading decides only whether the two agree, within a factor 1.4: it may stop once that
        # is clear, and half the usual time per side and round is plenty for it.
        agree = (theirs / AGREEMENT_FACTOR, theirs * AGREEMENT_FACTOR) if math.isfinite(theirs) and theirs > 0 else None
        ours = measure_speedup(baseline, candidate, inputs, threads=ctx.threads, accept=agree, min_run_time=0.1)
    figures = {"learner_speedup": round(theirs, 3), "grader_speedup": round(ours.median, 3), "rounds": ours.rounds,
               "agreement_factor": AGREEMENT_FACTOR, "verify_pass_s": round(elapsed, 2)}
    if elapsed > TIME_BUDGET_S:
        raise CheckFailed(f"verify_pass took {elapsed:.1f} s; the budget is {TIME_BUDGET_S:.0f} s. Hint: time "
                          "chunks of a fixed duration, not a fixed number of calls, and a few rounds.", figures)
    if not (math.isfinite(theirs) and low <= theirs <= high):
        raise CheckFailed(f"verify_pass measured speedup={theirs:.3f}; {expectation} (the grader measured "
                          f"{ours}). Hint: speedup is time(original) / time(transformed).", figures)
    if not 1 / AGREEMENT_FACTOR <= theirs / ours.median <= AGREEMENT_FACTOR:
        raise CheckFailed(f"verify_pass measured speedup={theirs:.3f}, the grader's interleaved measurement "
                          f"{ours}: they must agree within a factor {AGREEMENT_FACTOR}. Hint: warm both models up, "
                          "alternate them round by round, take the median ratio, time with one thread.", figures)
    return figures


class CallLog:
    """A forward pre-hook on fc1 that logs which copy ("original", "transformed") ran on the example input.
    A class, not a closure, so that it travels to a worker with the model."""

    def __init__(self, example: torch.Tensor):
        self.example, self.calls = example, []

    def __call__(self, fc1, args):
        if torch.equal(args[0], self.example):
            self.calls.append(fc1.side)
        # returns None: a pre-hook's other return values replace the input

    def __deepcopy__(self, memo):  # the copies verify_pass makes of the model all log here, as a closure would
        return self


def tags_the_transformed_copy(gm):
    """The identity, but the copy it returns reports itself as "transformed" to the CallLog."""
    gm.fc1.side = "transformed"
    return gm


@KATA.check(level=3)
def interleaved_timing(ctx: Context):
    """Graded on the order of the calls, not on a clock: timing all of one model, then all of the other, puts the
    machine's drift into the ratio; no clock reading tells that apart from the pass reliably, the call order does."""
    model, inputs = built(ctx, CASES["identity_pass"])
    # fc1 is a leaf: deepcopy and symbolic_trace keep it and this hook, so every copy reports (the pass tags its own).
    model.fc1.side = "original"
    hook = CallLog(torch.abs(torch.flatten(inputs[0], 1)))
    model.fc1.register_forward_pre_hook(hook)
    # The log is watched: isolated, the calls happen in the worker and the log comes back as data.
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # not the grading's 1: a verifier that sets 1 to time and never restores it shows
    try:
        report, elapsed, called = verify(ctx, model, tags_the_transformed_copy, inputs, watch=(hook.calls,))
        left = torch.get_num_threads()
    finally:
        torch.set_num_threads(threads)
    if not ctx.session.isolate and left != 2:  # isolated, the worker's threads are its own
        raise CheckFailed(f"verify_pass was called with torch's thread count at 2 and left it at {left}: a caller's "
                          "setting is the caller's. Hint: set one thread for the timing, and restore the count "
                          "you found in a finally block.")
    log = called.watched[0]
    figures = {"verify_pass_s": round(elapsed, 2)}
    for side in ("original", "transformed"):
        calls = log.count(side)
        longest = max((len(list(run)) for s, run in itertools.groupby(log) if s == side), default=0)
        figures[f"{side}_calls"], figures[f"{side}_longest_stretch"] = calls, longest
        if calls < MIN_TIMED_ROUNDS:
            raise CheckFailed(f"verify_pass ran the {side} model on example_inputs {calls} time(s): too few to have "
                              f"timed it. Hint: speedup is measured on example_inputs themselves, over at least "
                              f"{MIN_TIMED_ROUNDS} rounds.", figures)
        if longest > calls / 2:
            raise CheckFailed(
                f"verify_pass ran the {side} model on example_inputs {calls} times, {longest} of them in one stretch "
                f"with no call of the other model in between: it timed the two back to back, so the machine's "
                f"drift over the run (clock frequency, other load) lands in the speedup. Hint: alternate the two "
                f"round by round (A B, B A, ...), at least {MIN_TIMED_ROUNDS} rounds.", figures)
    return figures


# After interleaved_timing, which reads no clock: grading that stops at the first failing check (the mutant
# tests) does not time the benchmark for a verifier whose loop does not even alternate.
KATA.add(3, "dead_code_speedup", lambda ctx: check_speedup(
    ctx, eliminate_dead_code, "removing two of the three Linears", KATA.thresholds[ctx.device.type]))
KATA.add(3, "no_op_speedup", lambda ctx: check_speedup(ctx, identity, "a pass that changes nothing", *NO_OP_RANGE))

KATA.hidden(hidden_cases, check=lambda ctx, cases: {name: run_case(ctx, name, case)["verify_pass_s"]
                                                    for name, case in cases.items()})
