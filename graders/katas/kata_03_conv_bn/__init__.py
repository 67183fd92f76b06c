"""Grader for kata 03: Conv2d + BatchNorm2d folding. Models: models.py; mutants: mutants.py."""
from __future__ import annotations

import random
from dataclasses import replace

import torch
import torch.fx as fx
import torch.nn as nn

from graders.run import (
    CheckFailed,
    Context,
    Kata,
    Pass,
    Run,
    apply,
    assert_model_unchanged,
    assert_same_outputs,
    call_module_nodes,
    harness,
)

from .models import BENCHMARK, EXACT_CASES, FOLD_ALL, PAIRING_HINTS, SINGLE_PAIR, hidden_case

KATA = Kata("03_conv_bn")


def names(gm: fx.GraphModule, module_type: type) -> list[str]:
    return [n.target for n in call_module_nodes(gm, module_type)]


UNCHANGED_HINT = ("symbolic_trace shares the conv modules with the original model; fold into a copy "
                  "(copy.deepcopy(conv)) and install it with gm.set_submodule, leaving the original's modules, "
                  "their parameters and their modes as they were.")


def folded(run: Run) -> dict:
    """BatchNorms left as the case expects; every convolution kept (folding only removes BatchNorms); where the
    case asks (`extra["model_unchanged"]`), the model that was traced as it was."""
    if run.case.extra.get("model_unchanged"):
        assert_model_unchanged(run, UNCHANGED_HINT)
    bns = names(run.gm, nn.BatchNorm2d)
    if run.case.expect is not None and len(bns) not in run.case.expect:
        foldable_left = run.case.expect == (0,) and bns and run.case.hint not in PAIRING_HINTS
        run.fail(f"after fuse_conv_bn, the graph calls {len(bns)} BatchNorm2d module(s) ({', '.join(bns) or 'none'}); "
                 f"expected {' or '.join(map(str, run.case.expect))}.",
                 f"{FOLD_ALL[:-1]}, {', '.join(bns)} included." if foldable_left else None)
    dotted = [name for name in run.gm._modules if "." in name]
    if dotted:
        run.fail(f"after fuse_conv_bn, the GraphModule has a child module named '{dotted[0]}', with a dot in its name: "
                 "setattr(gm, 'a.b', m) registers a new attribute, which the graph's call_module node (it walks gm.a.b) "
                 "never calls.", "install the folded conv with gm.set_submodule(conv_node.target, fused).")
    for conv_type in (nn.Conv2d, nn.ConvTranspose2d):
        if len(names(run.gm, conv_type)) != len(names(run.before, conv_type)):
            run.fail(f"after fuse_conv_bn, the graph calls {len(names(run.gm, conv_type))} {conv_type.__name__} "
                     f"module(s); the original called {len(names(run.before, conv_type))}.",
                     "folding keeps every convolution; it only removes BatchNorms.")
    return {"batchnorms_before": len(names(run.before, nn.BatchNorm2d)), "batchnorms_after": len(bns)}


FOLD = Pass("fuse_conv_bn", verdict=folded, what="the folded module")


def shifts_lost(run: Run) -> list[tuple[str, str]]:
    """(conv, BatchNorm) for each BatchNorm the pass folded away whose conv it left without a bias: the BN's
    shift, (b - mean) * scale + beta, then has nowhere to go."""
    kept = set(names(run.gm, nn.BatchNorm2d))
    lost = []
    for bn in call_module_nodes(run.before, nn.BatchNorm2d):
        conv = bn.args[0] if bn.args else None
        if bn.target in kept or not isinstance(conv, fx.Node) or conv.op != "call_module":
            continue
        try:
            module = run.gm.get_submodule(conv.target)
        except AttributeError:
            continue
        if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d)) and module.bias is None:
            lost.append((conv.target, bn.target))
    return lost


def name_the_lost_shift(run: Run) -> None:
    """Where the outputs differ: a BatchNorm folded into a conv the pass left without a bias, named."""
    if lost := shifts_lost(run):
        run.fail(f"the folded module does not compute what the original does: {lost[0][1]} was folded into "
                 f"{lost[0][0]}, which has no bias after the pass, so the BatchNorm's shift is lost"
                 + (f"; {len(lost) - 1} more folded pair(s) lost theirs too." if len(lost) > 1 else "."),
                 "a conv without bias gets one when a BatchNorm is folded into it: b' = (0 - mean) * scale + "
                 "beta (torch.nn.utils.fusion.fuse_conv_bn_weights does the same).")


compare_folded = harness.explained(name_the_lost_shift)


def folding(case):
    """A case of this kata, its outputs compared by `compare_folded`."""
    return replace(case, compare=compare_folded)


# ----------------------------------------------------------------------------------------------
# L1: the weight formula on its own, then one conv -> BN pair.

WEIGHT_VARIANTS = {
    "eps": "the eps term left out (sqrt(running_var) instead of sqrt(running_var + eps))",
    "mean": "the running mean left out",
    "conv_b": "the conv bias left out",
    "bn_b": "beta (bn.bias) left out",
    "bn_w": "gamma (bn.weight) left out",
}


def expected_fold(conv_w, conv_b, rm, rv, eps, bn_w, bn_b, leave_out: str | None = None):
    """The folding formula in float64, optionally with one term left out (to name a learner's slip)."""
    d = lambda t, neutral: (torch.full_like(rm, neutral) if t is None else t).double()  # noqa: E731
    conv_b, bn_w, bn_b = d(conv_b, 0.0), d(bn_w, 1.0), d(bn_b, 0.0)
    rm, rv, eps = rm.double(), rv.double(), 0.0 if leave_out == "eps" else eps
    rm = torch.zeros_like(rm) if leave_out == "mean" else rm
    conv_b = torch.zeros_like(conv_b) if leave_out == "conv_b" else conv_b
    bn_b = torch.zeros_like(bn_b) if leave_out == "bn_b" else bn_b
    bn_w = torch.ones_like(bn_w) if leave_out == "bn_w" else bn_w
    scale = bn_w / torch.sqrt(rv + eps)
    return conv_w.double() * scale.reshape(-1, 1, 1, 1), (conv_b - rm) * scale + bn_b


def check_fold_weights(ctx: Context, *, with_optional: bool) -> None:
    cout = 6
    conv_w = torch.randn(cout, 3, 3, 3)
    rm, rv, eps = torch.empty(cout).uniform_(-2, 2), torch.empty(cout).uniform_(0.05, 3), random.choice([1e-2, 0.1])
    conv_b, bn_w, bn_b = (torch.randn(cout), torch.randn(cout), torch.randn(cout)) if with_optional else (None, None, None)
    args = (conv_w, conv_b, rm, rv, eps, bn_w, bn_b)
    got = ctx.call("fuse_conv_bn_weights", *args, returns=tuple)
    if len(got) != 2 or not all(isinstance(t, torch.Tensor) for t in got):
        raise CheckFailed(f"fuse_conv_bn_weights must return a (weight, bias) pair of tensors, got {len(got)} items.")
    want = expected_fold(*args)
    call = "with conv bias, gamma and beta given" if with_optional else "with conv_b=None, bn_w=None, bn_b=None"
    for label, g, w in zip(("weight", "bias"), got, want):
        if g.shape != w.shape or g.dtype != conv_w.dtype:
            raise CheckFailed(f"fuse_conv_bn_weights ({call}) returned a {label} of shape {tuple(g.shape)} and dtype "
                              f"{g.dtype}; expected shape {tuple(w.shape)} and dtype {conv_w.dtype}.")
        if not torch.allclose(g.double(), w, rtol=1e-5, atol=1e-6):
            slips = [why for term, why in WEIGHT_VARIANTS.items()
                     if torch.allclose(g.double(), expected_fold(*args, leave_out=term)[label == "bias"], rtol=1e-5, atol=1e-6)]
            diagnosis = f" It matches the formula with {slips[0]}." if slips else ""
            raise CheckFailed(
                f"fuse_conv_bn_weights ({call}) returned a wrong fused {label}: largest error "
                f"{(g.double() - w).abs().max().item():.3g}.{diagnosis} Hint: scale = gamma / sqrt(var + eps); "
                "W' = W * scale per output channel; b' = (b - mean) * scale + beta."
            )


KATA.add(1, "fold_weights", lambda ctx: check_fold_weights(ctx, with_optional=True))
KATA.add(1, "fold_weights_optional_none", lambda ctx: check_fold_weights(ctx, with_optional=False))


KATA.cases(1, {"single_pair": folding(SINGLE_PAIR)}, FOLD)
KATA.cases(2, {name: folding(case) for name, case in EXACT_CASES.items()}, FOLD)


@KATA.check(level=2)
def original_model_unchanged(ctx: Context):
    """symbolic_trace shares leaf modules with the traced model: editing them in place corrupts it."""
    run = apply(ctx, EXACT_CASES["several_blocks_relu"], FOLD)
    # Every module keeps its class, configuration, mode, parameters and buffers: so the model computes what it did.
    assert_model_unchanged(run, UNCHANGED_HINT)


KATA.speed("small_cnn_speedup", BENCHMARK, FOLD, what="the folded small CNN",
           hint="every BatchNorm in this CNN follows a conv it can fold into: fold all eight.")
KATA.hidden(lambda rng: folding(hidden_case(rng)), FOLD)
