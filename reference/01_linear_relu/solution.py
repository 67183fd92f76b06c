"""Kata 01, reference solution: fuse every Linear -> ReLU pair into one FusedLinearReLU module call."""
from __future__ import annotations

from collections import Counter

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

# Every spelling of ReLU that symbolic_trace records. F.relu(y, inplace=True) is still F.relu; the
# in-place forms may be fused too, because the Linear's output (which they overwrite) has no other user.
RELU_FUNCTIONS = {torch.relu, torch.relu_, F.relu}
RELU_METHODS = {"relu", "relu_"}


class FusedLinearReLU(nn.Module):
    """relu(linear(x)) as one module call, on the Linear's own parameters (shared, not copied)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.register_parameter("bias", linear.bias)  # accepts None, for a Linear without bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The ReLU overwrites the fresh GEMM output: no second tensor, no second module call.
        return F.linear(x, self.weight, self.bias).relu_()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def _is_relu(node: fx.Node, modules: dict) -> bool:
    if node.op == "call_function":
        return node.target in RELU_FUNCTIONS
    if node.op == "call_method":
        return node.target in RELU_METHODS
    return node.op == "call_module" and type(modules.get(node.target)) is nn.ReLU


def _relu_input(node: fx.Node):
    return node.args[0] if node.args else node.kwargs.get("input")


def fuse_linear_relu(gm: fx.GraphModule) -> fx.GraphModule:
    """Replace every Linear -> ReLU pair of `gm` by one call of a FusedLinearReLU where that is exact."""
    modules = dict(gm.named_modules())
    calls = Counter(n.target for n in gm.graph.nodes if n.op == "call_module")
    for relu_node in list(gm.graph.nodes):
        if not _is_relu(relu_node, modules):
            continue
        linear_node = _relu_input(relu_node)
        if not (isinstance(linear_node, fx.Node) and linear_node.op == "call_module"
                and type(modules.get(linear_node.target)) is nn.Linear):
            continue
        if len(linear_node.users) != 1:        # another user needs the values before the ReLU
            continue
        if calls[linear_node.target] != 1:     # the module is installed by name: every call site would change
            continue
        gm.set_submodule(linear_node.target, FusedLinearReLU(modules[linear_node.target]))
        with gm.graph.inserting_before(relu_node):
            fused_node = gm.graph.call_module(linear_node.target, linear_node.args, linear_node.kwargs)
        relu_node.replace_all_uses_with(fused_node)
        gm.graph.erase_node(relu_node)
        gm.graph.erase_node(linear_node)
    # A ReLU module may still be called elsewhere (shared); only modules no node calls any more go.
    gm.delete_all_unused_submodules()
    gm.graph.lint()
    gm.recompile()
    return gm
