"""Kata 01's model zoo and hidden-model generator.

Every Linear gets a bias drawn from [-1, 1] (the default init makes it tiny), so a dropped bias shows;
random inputs make about half of every pre-activation negative, so a dropped ReLU shows. A case's
`expect` is the number of FusedLinearReLU calls a correct pass leaves (None: more than one answer is right).
"""
from __future__ import annotations

import copy
import functools
import random
from collections import OrderedDict

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from graders.run import Case, PathChain, Program, random_identifiers, random_path


def linear(fin: int, fout: int, *, bias: bool = True) -> nn.Linear:
    layer = nn.Linear(fin, fout, bias=bias)
    if bias:
        nn.init.uniform_(layer.bias, -1, 1)
    return layer


# How a block spells its activation: a module (a copy is installed on the block) or a function of the tensor.
ACTIVATIONS = {
    "relu_module": nn.ReLU(), "relu_module_inplace": nn.ReLU(inplace=True),
    "torch_relu": torch.relu, "torch_relu_inplace": torch.relu_,
    "functional_relu": F.relu, "functional_relu_inplace": functools.partial(F.relu, inplace=True),
    "method_relu": lambda y: y.relu(), "method_relu_inplace": lambda y: y.relu_(),
    # The input as a keyword: symbolic_trace records torch.relu(input=y) and self.act(input=y) with no
    # positional argument (node.args == (), node.kwargs == {"input": y}). F.relu(input=y) would not do:
    # torch's Python wrapper passes its input on positionally.
    "torch_relu_input_keyword": torch.relu, "relu_module_input_keyword": nn.ReLU(),
}
KEYWORD_INPUT = {"torch_relu_input_keyword", "relu_module_input_keyword"}  # called as act(input=y)
RELU_SPELLINGS = list(ACTIVATIONS)
LOOK_ALIKES = {"relu6_module": nn.ReLU6(), "leaky_relu_module": nn.LeakyReLU(0.1), "functional_relu6": F.relu6,
               "functional_leaky_relu": functools.partial(F.leaky_relu, negative_slope=0.1)}
ACTIVATIONS.update(LOOK_ALIKES)

# How a block wires its Linear `fc` and its activation `act` around its input x (m: the block). Only pair and
# residual may fuse; linear_module_shared may fuse or not (the module is installed by name, so both sites agree).
WIRINGS = {
    "pair": lambda fc, act, m, x: act(fc(x)),
    "residual": lambda fc, act, m, x: x + act(fc(x)),
    "dropout_between": lambda fc, act, m, x: act(m.dropout(fc(x))),
    "linear_output_used_twice": lambda fc, act, m, x: torch.sigmoid(y := fc(x)) * act(y),
    "no_activation": lambda fc, act, m, x: torch.tanh(fc(x)),
    "relu_output_used_twice": lambda fc, act, m, x: (z := act(fc(x))) * torch.sigmoid(z) + z,
    "linear_module_shared": lambda fc, act, m, x: act(fc(x)) + torch.sigmoid(fc(x * 2)),
    # One ReLU module after two Linears and once more on its own: the pairs fuse, the module stays.
    "relu_module_shared": lambda fc, act, m, x: act(m.fc2(act(fc(x)))) + act(x - 0.5),
    # The ReLU's result is read inside a container argument, not as a top-level one: a tuple output, a list.
    "relu_in_tuple_output": lambda fc, act, m, x: (act(fc(x)), torch.tanh(x)),
    "relu_in_list_argument": lambda fc, act, m, x: torch.cat([act(fc(x)), x], dim=-1),
}


class ScaledLinear(nn.Linear):
    """A Linear with a forward of its own (as a scaled or a quantisation-aware Linear has): an nn.Linear by
    isinstance, but what it computes is not F.linear."""

    def forward(self, x):
        return super().forward(x) * 0.5


class _KeepsScaledLinear(fx.Tracer):
    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return type(m) is ScaledLinear or super().is_leaf_module(m, qualname)


def trace_keeping_scaled_linear(model: nn.Module) -> fx.GraphModule:
    """A trace that keeps ScaledLinear as one call_module node, as a tracer told to keep a library's modules whole
    (or torch.nn's own subclasses, which symbolic_trace keeps) records it."""
    return fx.GraphModule(model, _KeepsScaledLinear().trace(model))


def block(kind: str, spelling: str, fc: nn.Linear, names: tuple | list = ("fc", "act")) -> Program:
    """A Linear and an activation (a module: a copy installed on the block), under names the grader picks."""
    activation = ACTIVATIONS[spelling]
    parts = {names[0]: fc, **({names[1]: copy.deepcopy(activation)} if isinstance(activation, nn.Module) else {})}
    if kind == "dropout_between":
        parts["dropout"] = nn.Dropout(0.3)
    if kind == "relu_module_shared":
        parts["fc2"] = linear(fc.out_features, fc.out_features)

    def act(m):
        module_or_function = getattr(m, names[1], activation)
        return (lambda y: module_or_function(input=y)) if spelling in KEYWORD_INPUT else module_or_function

    return Program(lambda m, x: WIRINGS[kind](getattr(m, names[0]), act(m), m, x), **parts)


def mlp(spellings: list[str], width: int = 12) -> nn.Module:
    """Linear + activation per spelling, then a last Linear with nothing after it."""
    layers = OrderedDict()
    for i, spelling in enumerate(spellings, 1):
        layers[f"fc{i}"], layers[f"act{i}"] = linear(width, width), copy.deepcopy(ACTIVATIONS[spelling])
    return nn.Sequential(layers | {f"fc{len(spellings) + 1}": linear(width, 5)})


def one_block(spelling: str, kind: str = "pair", *, bias: bool = True, fin: int = 10, fout: int = 7):
    return lambda: block(kind, spelling, linear(fin, fout, bias=bias))


def case(build, in_shape: tuple, fused: int | None, hint: str, *, dtype=torch.float32, **options) -> Case:
    """Inputs of shape (batch, *in_shape); inference models run in eval mode unless a case says otherwise."""
    options.setdefault("mode", "eval")
    return Case(build, lambda batch: (torch.randn(batch, *in_shape, dtype=dtype),), fused, hint, **options)


SINGLE_PAIR = case(one_block("relu_module"), (10,), 1,
                   "insert a call_module node for a FusedLinearReLU, point the ReLU node's users at it, and erase "
                   "the ReLU and Linear nodes.")
SPELLING_HINT = "this ReLU spelling follows a Linear too; look at the node's op and target in print_tabular()."
EXACT_CASES: dict[str, Case] = {
    "several_layers": case(lambda: mlp(["relu_module"] * 3), (12,), 3,
                           "fuse every Linear -> ReLU pair; the last Linear has no ReLU after it."),
    **{spelling: case(one_block(spelling), (10,), 1, SPELLING_HINT) for spelling in RELU_SPELLINGS[1:]},
    "linear_without_bias": case(one_block("functional_relu", bias=False), (10,), 1,
                                "a Linear built with bias=False has linear.bias None."),
    "sequence_input": case(one_block("method_relu", fin=6, fout=6), (5, 6), 1,
                           "nn.Linear accepts inputs of any rank (..., in_features); so must the fused module."),
    "nested_dotted_names": case(
        lambda: PathChain([(f"encoder.blocks.{i}", block("pair", spelling, linear(9, 9)))
                           for i, spelling in enumerate(["relu_module", "functional_relu", "method_relu_inplace"])]),
        (9,), 3, "node.target is a dotted path ('encoder.blocks.0.fc'); gm.get_submodule and gm.set_submodule "
                 "accept it, setattr does not."),
    "float64_model": case(lambda: mlp(["relu_module", "relu_module_inplace"]).double(), (12,), 2,
                          "the fused module must compute in the Linear's dtype.", dtype=torch.float64),
    "relu_output_used_twice": case(one_block("functional_relu", "relu_output_used_twice", fin=8, fout=8), (8,), 1,
                                   "every user of the ReLU node must read the fused node instead "
                                   "(relu_node.replace_all_uses_with)."),
    "relu_module_shared": case(one_block("relu_module", "relu_module_shared", fin=8, fout=8), (8,), 2,
                               "the ReLU module is also called on its own: leave that call and the module alone."),
    "relu_read_in_a_tuple_output": case(one_block("relu_module", "relu_in_tuple_output"), (10,), 1,
                                        "the model returns (relu(fc(x)), tanh(x)): the output node's argument is a "
                                        "tuple holding the ReLU node. relu_node.replace_all_uses_with(fused) "
                                        "rewrites uses inside tuples, lists and dicts too; rewiring only a user's "
                                        "top-level args misses them."),
    "relu_read_in_a_list_argument": case(one_block("torch_relu", "relu_in_list_argument"), (10,), 1,
                                         "torch.cat([relu(fc(x)), x]) reads the ReLU node inside a list argument: "
                                         "relu_node.replace_all_uses_with(fused) rewrites it there too."),
    "relu6_not_fused": case(lambda: mlp(["relu6_module"]), (12,), 0, "relu6 clips at 6 as well: it is not a ReLU."),
    "functional_relu6_not_fused": case(one_block("functional_relu6"), (10,), 0,
                                       "F.relu6 clips at 6 as well: it is not a ReLU."),
    "relu6_named_relu_not_fused": case(lambda: block("pair", "relu6_module", linear(10, 7), names=("fc", "relu")), (10,), 0,
                                       "the module at `relu` is an nn.ReLU6: a name says nothing, the module's type "
                                       "does."),
    "linear_subclass_not_fused": case(lambda: block("pair", "relu_module", ScaledLinear(10, 7)), (10,), 0,
                                      "the Linear at `fc` is a subclass of nn.Linear with a forward of its own (it "
                                      "scales its result): it does not compute F.linear. Match the exact type "
                                      "(type(m) is nn.Linear), not isinstance.", trace=trace_keeping_scaled_linear),
    "leaky_relu_not_fused": case(lambda: mlp(["leaky_relu_module"]), (12,), 0,
                                 "LeakyReLU keeps a slope below zero: it is not a ReLU."),
    "dropout_between": case(one_block("relu_module", "dropout_between"), (10,), 0,
                            "only a ReLU whose input is the Linear's output may fuse; in training mode the Dropout "
                            "between them zeroes a random part of its input.", mode="train", rng=True),
    "linear_output_used_twice": case(one_block("torch_relu", "linear_output_used_twice", fout=10), (10,), 0,
                                     "the Linear's output has a second user that needs the values before the ReLU."),
    # In place, y.relu_() overwrites the Linear's output, but the sigmoid read it before: it needs the values
    # before the ReLU just the same.
    "linear_output_used_twice_inplace": case(one_block("method_relu_inplace", "linear_output_used_twice", fout=10),
                                             (10,), 0, "the Linear's output has a second user: y.relu_() overwrites "
                                             "y in place, but the sigmoid read it before, so it needs the values "
                                             "before the ReLU (after a fusion it would read the ReLU's)."),
    "linear_module_shared": case(one_block("torch_relu", "linear_module_shared", fin=8, fout=8), (8,), None,
                                 "the Linear module is called at two sites: whatever you install under its name "
                                 "runs at both."),
}
TRAINING_MLP = case(lambda: mlp(["relu_module", "relu_module_inplace"]), (12,), 2,
                    "Linear and ReLU compute the same in training mode: fuse them there too.", mode="train")

# The L3 benchmark: a small inference MLP at batch 1, where each op's fixed cost (module call, dispatch,
# allocation) is most of its time, so removing one module call and one allocation per layer pays; where
# the GEMM dominates (wide layers, big batches) fusing buys nothing on a CPU (README, "Where fusing pays").
BENCHMARK_LAYERS, BENCHMARK_HIDDEN = 8, 64
BENCHMARK = case(lambda: nn.Sequential(*(m for _ in range(BENCHMARK_LAYERS)
                                         for m in (linear(BENCHMARK_HIDDEN, BENCHMARK_HIDDEN), nn.ReLU()))),
                 (BENCHMARK_HIDDEN,), BENCHMARK_LAYERS, "", batch_sizes=(1,))


# ----------------------------------------------------------------------------------------------
# Hidden models (L4): random depth, widths, input rank, ReLU spellings, names and nesting, with
# pairs that must not fuse mixed in. The generator knows how many a correct pass fuses.

FUSABLE_KINDS = ["pair", "pair", "residual", "relu_in_list_argument"]
UNFUSABLE_KINDS = ["dropout_between", "linear_output_used_twice", "no_activation"]


def hidden_case(rng: random.Random) -> Case:
    width = in_width = rng.choice([6, 8, 12, 16])
    blocks, fused, length = [], 0, rng.randint(4, 7)
    while len(blocks) < length or fused < 2:  # at least two pairs to fuse: a no-op must not pass
        kind = rng.choice(FUSABLE_KINDS + UNFUSABLE_KINDS)
        # Most pairs use a ReLU spelling; some use a look-alike that must stay.
        spelling = rng.choice(list(LOOK_ALIKES)) if rng.random() < 0.2 else rng.choice(RELU_SPELLINGS)
        fout = width if kind in ("residual", "linear_output_used_twice") else rng.choice([6, 8, 12, 16, 24])
        names = random_identifiers(rng, 2)
        fc_act = block(kind, spelling, linear(width, fout, bias=rng.random() < 0.7), names)
        blocks.append((random_path(rng, 3, len(blocks)), fc_act))
        fused += kind in FUSABLE_KINDS and spelling in RELU_SPELLINGS
        width = fout + width if kind == "relu_in_list_argument" else fout
    in_shape = (in_width,) if rng.random() < 0.6 else (rng.randint(2, 5), in_width)
    return case(lambda: PathChain(blocks), in_shape, fused, "the pass must work for any names, nesting depth and "
                "ReLU spelling.", mode="train" if rng.random() < 0.3 else "eval", rng=True)
