"""Grader for kata 01: Linear + ReLU fusion by manual graph surgery. Models: models.py; mutants: mutants.py."""
from __future__ import annotations

import copy

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from graders.run import (
    CheckFailed,
    Context,
    Kata,
    Pass,
    Run,
    apply,
    assert_model_unchanged,
    assert_same_outputs,
    assert_sendable,
    input_sets,
    on_device,
)

from .models import BENCHMARK, EXACT_CASES, SINGLE_PAIR, TRAINING_MLP, hidden_case, linear

KATA = Kata("01_linear_relu")
RELU_NODES = {("call_function", torch.relu), ("call_function", torch.relu_), ("call_function", F.relu),
              ("call_method", "relu"), ("call_method", "relu_")}  # and call_module of an nn.ReLU
# What one fusion does to the graph: one FusedLinearReLU call more, one Linear call and one ReLU node fewer.
PER_FUSION = {
    "fused": ("FusedLinearReLU module call(s)", +1, None),
    "linear": ("nn.Linear call(s)", -1, "each fused Linear node must leave the graph (gm.graph.erase_node), "
                                        "every other one stay."),
    "relu": ("ReLU node(s)", -1, "each fused ReLU node must leave the graph (gm.graph.erase_node) once its users "
                                 "read the fused node; every other one stays."),
}


def fused_type(ctx: Context) -> str:
    """The fused module's class name: graded by name, since an isolated judge sees modules rebuilt from records."""
    if ctx.defines("FusedLinearReLU") != "class":
        raise CheckFailed(f"{ctx.solution_path} has no class FusedLinearReLU: the kata asks for "
                          f"{KATA.api['FusedLinearReLU']}.")
    return "FusedLinearReLU"


def nodes_by_kind(gm: fx.GraphModule, fused_class: str, linear_classes: frozenset = frozenset()) -> dict[str, list[fx.Node]]:
    """FusedLinearReLU calls, Linear calls (a FusedLinearReLU subclassing nn.Linear is not one; a module whose
    class is named in `linear_classes` is: an isolated judge gets a Linear subclass of its own model back
    rebuilt from its trace, under its class name), and ReLUs in any spelling."""
    modules, kinds = dict(gm.named_modules()), {kind: [] for kind in PER_FUSION}
    for node in gm.graph.nodes:
        module = modules.get(node.target) if node.op == "call_module" else None
        linear = isinstance(module, nn.Linear) or (module is not None and type(module).__name__ in linear_classes)
        kind = ("fused" if type(module).__name__ == fused_class else "linear" if linear
                else "relu" if type(module) is nn.ReLU or (node.op, node.target) in RELU_NODES else None)
        if kind:
            kinds[kind].append(node)
    return kinds


def parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


TRACEABLE = ("in a competition the worker traces your FusedLinearReLU with torch.fx and the judge runs that trace "
             "(README, \"Trust model\"): its forward may not branch on a tensor's rank, shape or values; "
             "F.linear(x, weight, bias) handles every rank, with or without a bias.")


def pairs_left(gm: fx.GraphModule, kinds: dict[str, list[fx.Node]]) -> str:
    """Where a pass fused some pairs and not others, the ReLUs still reading a Linear, each with its spelling, for the
    hint: which spellings or places the pass missed shows there (empty where none is left)."""
    linears = {node for node in kinds["linear"] if len(node.users) == 1}  # read by the ReLU alone: a pair
    left = [(node, node.args[0]) for node in kinds["relu"] if node.args and node.args[0] in linears]

    def spelling(node: fx.Node) -> str:
        if node.op == "call_module":
            return f"call_module {node.target}: {gm.get_submodule(node.target)!r}"
        names = {torch.relu: "torch.relu", torch.relu_: "torch.relu_", F.relu: "F.relu"}
        target = node.target if node.op == "call_method" else names.get(node.target, str(node.target))
        return f"{node.op} {target}" + (", inplace=True" if node.kwargs.get("inplace") else "")

    spelled = [f"{node.name} ({spelling(node)}) after {linear.target}" for node, linear in left]
    return ("the pass fused some pairs and left these ReLUs reading a Linear: " + "; ".join(spelled) +
            ". Every one of them is a pair here: look at their op, target and arguments in print_tabular().") if left else ""


def fused_as_expected(run: Run) -> dict:
    fused_class = fused_type(run.ctx)
    assert_sendable(run.ctx, FUSE.function, run.gm, TRACEABLE)  # as a competition's worker does
    linear_classes = frozenset(type(m).__name__ for m in run.before.modules() if isinstance(m, nn.Linear))
    before, after = nodes_by_kind(run.before, fused_class), nodes_by_kind(run.gm, fused_class, linear_classes)
    for kind, (what, change, hint) in PER_FUSION.items() if run.case.expect is not None else ():
        expected = len(before[kind]) + change * run.case.expect
        if len(after[kind]) != expected:
            names = ", ".join(n.target if n.op == "call_module" else n.name for n in after[kind]) or "none"
            if kind == "fused" and 0 < len(after[kind]) < expected:  # some pairs fused: the case's hint may not be why
                hint = pairs_left(run.gm, after) or hint
            run.fail(f"after fuse_linear_relu, the graph runs {len(after[kind])} {what} ({names}); expected "
                     f"{expected}.", hint)
    if parameter_count(run.gm) != parameter_count(run.before):
        run.fail(f"after fuse_linear_relu, the GraphModule holds {parameter_count(run.gm)} parameters; the original "
                 f"holds {parameter_count(run.before)}.", "FusedLinearReLU should hold the Linear's own weight and "
                 "bias as parameters, and a Linear that was fused should leave the GraphModule.")
    return {"fused": len(after["fused"]), "linears_before": len(before["linear"])}


FUSE = Pass("fuse_linear_relu", verdict=fused_as_expected, what="the fused module")


@KATA.check(level=1)
def fused_module(ctx: Context):
    fc = linear(10, 6).to(ctx.device)
    expected = copy.deepcopy(fc)
    module = ctx.call("FusedLinearReLU", fc, returns=nn.Module)
    assert_sendable(ctx, "FusedLinearReLU", module, TRACEABLE)
    if parameter_count(module) != parameter_count(expected):
        raise CheckFailed(f"FusedLinearReLU(linear) holds {parameter_count(module)} parameters; the Linear holds "
                          f"{parameter_count(expected)}. Hint: keep the Linear's weight and bias as its parameters.")
    inputs = input_sets(lambda batch: on_device((torch.randn(batch, 10),), ctx.device))
    with torch.no_grad():
        got = module(x := inputs[0][0])
        right = torch.relu(expected(x))
        slips = {"the ReLU is missing": expected(x), "the bias is missing": torch.relu(x @ expected.weight.T)}
    for slip, wrong in slips.items():
        # A slip is named only where its output differs from the right one on this input (with every output
        # below zero, relu(x @ W.T) and relu(x @ W.T + b) can both be all zeros).
        if (isinstance(got, torch.Tensor) and got.shape == wrong.shape and torch.allclose(got, wrong, atol=1e-5)
                and not torch.allclose(wrong, right, atol=1e-5)):
            raise CheckFailed(f"FusedLinearReLU(linear)(x) computes something else than relu(linear(x)): {slip}.")
    assert_same_outputs(lambda x: torch.relu(expected(x)), module, inputs, what="FusedLinearReLU(linear)",
                        hint="forward computes relu(x @ weight.T + bias), e.g. F.linear(x, weight, bias).relu_().")


KATA.cases(1, {"single_pair": SINGLE_PAIR}, FUSE)
KATA.cases(2, EXACT_CASES, FUSE)


@KATA.check(level=2)
def trains_like_the_original(ctx: Context):
    """Linear and ReLU behave alike in training and eval mode, so a training model fuses too, and its
    gradients must still reach every parameter."""
    run = apply(ctx, TRAINING_MLP, FUSE)
    fused_as_expected(run)
    want_x = torch.randn(4, 12, device=ctx.device).requires_grad_()
    got_x = want_x.detach().clone().requires_grad_()
    try:
        run.pristine(want_x).square().sum().backward()
        run.gm(got_x).square().sum().backward()
    except RuntimeError as exc:
        run.fail(f"backward through the fused training-mode model raised: {exc}.", "the fused module must stay "
                 "differentiable: do not detach, use torch.no_grad or write into an out= tensor in forward "
                 "(F.linear(x, weight, bias) is all it needs).", graphs=False)
    missing = [name for name, p in run.gm.named_parameters() if p.grad is None]
    if missing or got_x.grad is None:
        run.fail(f"after backward through the fused training-mode model, no gradient reached "
                 f"{', '.join(missing + (['the input'] if got_x.grad is None else []))}.", "use the Linear's own "
                 "parameters in forward, without .detach() or torch.no_grad().", graphs=False)
    if not torch.allclose(got_x.grad, want_x.grad, rtol=1e-4, atol=1e-5):
        run.fail("the input gradient of the fused training-mode model differs from the original's (largest error "
                 f"{(got_x.grad - want_x.grad).abs().max().item():.3g}).", "", graphs=False)


@KATA.check(level=2)
def traced_model_keeps_its_modules(ctx: Context):  # even where outputs agree
    hint = ("symbolic_trace shares the Linear modules with the caller's model: build a new FusedLinearReLU(linear) "
            "and install it in gm with gm.set_submodule; never change the caller's modules (their class, "
            "parameters or buffers).")
    for name in ("nested_dotted_names", "relu_module_shared"):
        run = apply(ctx, EXACT_CASES[name], FUSE)
        assert_sendable(ctx, FUSE.function, run.gm, TRACEABLE)
        assert_model_unchanged(run, hint)


KATA.speed("small_mlp_speedup", BENCHMARK, FUSE, what="the fused MLP",
           hint="every Linear in this MLP is followed by a ReLU: fuse all eight, and make the fused forward one "
                "F.linear and one in-place relu_, nothing more.", verdict=True)
KATA.hidden(hidden_case, FUSE)
