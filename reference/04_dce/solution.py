"""Kata 04, reference solution: dead-code elimination that keeps every side effect."""
from __future__ import annotations

import inspect
import operator

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

# Functions that draw from the random-number generator. Removing one, even with its result unused,
# shifts every later random draw: the model's other outputs and the generator's state change.
RANDOM_FUNCTIONS = {
    torch.rand, torch.rand_like, torch.randn, torch.randn_like, torch.randint, torch.randint_like,
    torch.randperm, torch.normal, torch.poisson, torch.bernoulli, torch.multinomial,
    torch.dropout, torch.alpha_dropout, torch.feature_alpha_dropout, torch.rrelu,
    F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout,
    F.rrelu, F.gumbel_softmax,
}
RANDOM_METHODS = {"bernoulli", "multinomial"}  # the in-place ones (uniform_, normal_, ...) end in "_"
RANDOM_MODULES = (nn.modules.dropout._DropoutNd, nn.RReLU)  # every dropout module, and RReLU: random in training

# Leaf modules known to compute their output from their input and parameters alone, changing nothing and
# drawing nothing (with inplace=False). A leaf module is opaque: any other one (an InstanceNorm tracking
# statistics, a GRU or a TransformerEncoderLayer with dropout, a library's module) keeps its calls.
PURE_MODULES = (
    nn.Linear, nn.Bilinear, nn.Identity, nn.Flatten, nn.Unflatten, nn.modules.conv._ConvNd,
    nn.modules.pooling._MaxPoolNd, nn.modules.pooling._AvgPoolNd, nn.modules.pooling._AdaptiveAvgPoolNd,
    nn.modules.pooling._AdaptiveMaxPoolNd, nn.LayerNorm, nn.GroupNorm, nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU,
    nn.SELU, nn.CELU, nn.GELU, nn.SiLU, nn.Mish, nn.Sigmoid, nn.Tanh, nn.Hardtanh, nn.Hardsigmoid, nn.Hardswish,
    nn.Softplus, nn.Softsign, nn.Softmax, nn.LogSoftmax, nn.PReLU, nn.Tanhshrink, nn.Softshrink, nn.Hardshrink,
)

# Functions whose whole point is their effect, not their result.
SIDE_EFFECT_FUNCTIONS = {operator.setitem, operator.delitem, torch._assert, print}


def _bound_arguments(node: fx.Node, defaults: bool = False) -> dict:
    """The call's arguments by parameter name, so `F.relu(x, True)` reads as inplace=True; with `defaults`,
    the parameters left out too, at their defaults."""
    try:
        bound = inspect.signature(node.target).bind(*node.args, **node.kwargs)
    except (TypeError, ValueError):  # builtins without a signature: only keywords are named
        return dict(node.kwargs)
    if defaults:
        bound.apply_defaults()
    return bound.arguments


def _mutates(node: fx.Node, modules: dict) -> bool:
    """Does running the node change a tensor that someone else can see?"""
    if node.op == "call_method":
        # PyTorch's convention: a trailing underscore means in place (x.add_, x.zero_, x.copy_).
        return node.target.endswith("_") and not node.target.endswith("__")
    if node.op == "call_function":
        name = getattr(node.target, "__name__", "")
        if name.endswith("_") and not name.endswith("__"):  # torch.relu_, F.relu_
            return True
        if isinstance(node.target, torch._ops.OpOverload) and node.target._schema.is_mutable:
            return True
        arguments = _bound_arguments(node)
        return arguments.get("inplace") is True or arguments.get("out") is not None
    if node.op == "call_module":
        return not _module_is_pure(modules[node.target])
    return False


def _module_is_pure(module: nn.Module) -> bool:
    """Known to change nothing and draw nothing in the state it is in; an unknown module is not."""
    if getattr(module, "inplace", False) is True:
        return False
    if isinstance(module, nn.modules.batchnorm._NormBase):  # BatchNorm, InstanceNorm: running statistics
        return not (module.training and module.track_running_stats)  # training updates them; eval reads them
    if isinstance(module, RANDOM_MODULES):
        return not module.training  # random in training mode, the identity (or a fixed slope) in eval mode
    if isinstance(module, nn.Embedding):
        return module.max_norm is None  # with max_norm, each call renormalises the rows it reads, in place
    return isinstance(module, PURE_MODULES)


def _training(node: fx.Node) -> bool:
    """A dropout function's `training` (torch.dropout's `train`) flag, defaults applied: False draws nothing."""
    arguments = _bound_arguments(node, defaults=True)
    return arguments.get("training", arguments.get("train", True)) is not False


def _draws_random_numbers(node: fx.Node, modules: dict) -> bool:
    if node.op == "call_function":
        random = node.target in RANDOM_FUNCTIONS or getattr(node.target, "_nondeterministic_seeded", False)
        return random and _training(node)  # F.dropout(x, p, training=False) is the identity
    if node.op == "call_method":
        return node.target in RANDOM_METHODS
    return False  # a module call: _mutates asks whether it is known pure, draws included


def has_side_effects(node: fx.Node, modules: dict) -> bool:
    """True for a node that must stay even when nothing uses its result."""
    if node.op in ("placeholder", "output"):  # the signature and the result are the contract
        return True
    if node.op == "call_function" and node.target in SIDE_EFFECT_FUNCTIONS:
        return True
    return _mutates(node, modules) or _draws_random_numbers(node, modules)


def eliminate_dead_code(gm: fx.GraphModule) -> int:
    """Erase every node whose result nobody uses and that has no side effect; return how many."""
    modules = dict(gm.named_modules())
    removed = 0
    # Walking backwards visits every user before the node it uses, so erasing a dead user drops the
    # use before we reach the node: a whole dead chain goes in one sweep. node.users already counts
    # uses nested inside lists, tuples, dicts and kwargs.
    for node in reversed(gm.graph.nodes):
        if len(node.users) == 0 and not has_side_effects(node, modules):
            gm.graph.erase_node(node)
            removed += 1
    gm.graph.lint()
    gm.recompile()
    return removed
