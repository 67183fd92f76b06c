"""Kata 08's model zoo, each case with its chains written out by hand (node names); the grader's own
chain finder (`expected_chains`, the README's definition), which names the hidden models' chains."""
from __future__ import annotations

import operator
import random
from dataclasses import replace
from typing import Callable

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from graders.run import Case, Program2, random_path

# The elementwise ops of the README, in every spelling: the grader's own reading of "elementwise",
# used to count what is left after fusion and, on the hidden models, to know the expected chains.
ELEMENTWISE_FUNCTIONS = {
    operator.add, torch.add, operator.sub, torch.sub, operator.mul, torch.mul, operator.truediv, torch.div,
    operator.neg, torch.neg, operator.abs, torch.abs, torch.exp, torch.relu, F.relu, torch.sigmoid, torch.tanh,
}
ELEMENTWISE_METHODS = {"add", "sub", "mul", "div", "neg", "abs", "exp", "relu", "sigmoid", "tanh"}
ELEMENTWISE_MODULES = (nn.ReLU, nn.Sigmoid, nn.Tanh)


def is_elementwise(node: fx.Node, modules: dict) -> bool:
    if "out" in node.kwargs or node.kwargs.get("inplace", False):
        return False
    if node.op == "call_module":
        module = modules.get(node.target)
        return type(module) in ELEMENTWISE_MODULES and not getattr(module, "inplace", False)
    return node.target in {"call_function": ELEMENTWISE_FUNCTIONS, "call_method": ELEMENTWISE_METHODS}.get(node.op, ())


def elementwise_count(gm: fx.GraphModule) -> int:
    modules = dict(gm.named_modules())
    return sum(is_elementwise(n, modules) for n in gm.graph.nodes)


def expected_chains(gm: fx.GraphModule) -> list[list[str]]:
    """The README's definition, as node names: each elementwise node continues the chain of its first
    input that is elementwise and has no other user."""
    modules = dict(gm.named_modules())
    elementwise = [n for n in gm.graph.nodes if is_elementwise(n, modules)]
    successor = {}
    for node in elementwise:
        if source := next((i for i in node.all_input_nodes if i in elementwise and len(i.users) == 1), None):
            successor[source] = node
    chains = [[node] for node in elementwise if node in successor and node not in successor.values()]
    for chain in chains:
        while chain[-1] in successor:
            chain.append(successor[chain[-1]])
    return [[n.name for n in chain] for chain in chains]


def case(program: Callable, width: int, chains: list[list[str]] | None, hint: str, inputs: int | Callable = 1,
         modules: dict[str, type] | None = None, **options) -> Case:
    """program(m, x, y) as a Program2, fed `inputs` random [batch, width] tensors (or what inputs(batch) returns)."""
    make = inputs if callable(inputs) else lambda batch: tuple(torch.randn(batch, width) for _ in range(inputs))
    model = lambda: Program2(  # every part a program may use (symbolic_trace records only those it touches)
        program, **{path: module() for path, module in (modules or {}).items()},
        weight=nn.Parameter(torch.randn(width, width) / width ** 0.5), bias=nn.Parameter(torch.randn(width)),
        linear=nn.Linear(width, width), conv=nn.Conv1d(1, 1, 3, padding=1), relu=nn.ReLU(), sigmoid=nn.Sigmoid(),
        tanh=nn.Tanh(), act=nn.ReLU(inplace=True), dropout=nn.Dropout(0.3))
    return Case(model, make, chains, hint, **options)


# The zoo: the programs that need a name or a comment, then every case with the chains it has.
def function_spellings(m, x, y):
    h = torch.div(torch.sub(torch.mul(torch.add(x, y), 1.5), 0.25), 2.0)
    h = torch.exp(torch.abs(torch.neg(torch.tanh(h))))
    return torch.sigmoid(F.relu(torch.relu(h) - 1.5))

def branch_and_join(m, x, y):
    h = (x + 1) * 2                             # two users: ends a chain
    left, right = torch.relu(h).sigmoid(), torch.tanh(h) * 3
    return (left + right).exp()                 # two chains reach the add: its first input continues

def join_first_input_started_later(m, x, y):
    right = torch.tanh(x) * 3                   # this chain starts first...
    left = torch.relu(y).sigmoid()
    return (left + right).exp()                 # ...but the add's first input is left: left's chain continues

def look_alikes_break(m, x, y):
    h = torch.clamp(x * 2 + 1, min=0.1)         # clamp, sqrt and gelu act elementwise, but are not among the ten
    h = torch.sqrt(h).mul(3).sub(1)
    return F.gelu(h.relu() * 2).tanh().neg()

def value_by_keyword(m, x, y):
    h = torch.sigmoid(input=x * 2)              # the chain's value passed by keyword: node.args is ()
    return torch.add(input=h, other=y, alpha=0.5).tanh()

def getitem_breaks(m, x, y):
    a, b = (x * 2 + 1).chunk(2, dim=-1)
    return torch.relu(a).sigmoid() * b.tanh()

def random_ops_break(m, x, y):
    h = F.dropout(x * 2 + 1, 0.5, training=True)
    return m.dropout(torch.sigmoid(h.relu() + torch.rand_like(h)).mul(3)).tanh().abs()

def out_keyword_breaks(m, x, y):
    buf = torch.tanh(y)
    torch.mul(torch.relu(x + 1), 2.0, out=buf)  # writes into buf, which the sub reads: not an elementwise op here
    return (buf - 0.5).sigmoid()

def module_called_twice(m, x, y):
    a = m.sigmoid(m.relu(x * 2) - 0.5)          # m.relu inside a chain...
    return m.relu(a @ m.weight)                 # ...and again outside: the fused node must not take it away

def under_autograd(m, x, y):
    a = torch.sigmoid(x * 2 - 1).mul(m.bias).tanh()  # backward needs the sigmoid's and the tanh's outputs
    b = torch.relu(y.detach() + 0.5) * m.bias        # a value that needs no grad, times a parameter that does
    return torch.exp(a) - b


SPELLINGS = "the README lists every spelling that counts: operator, torch function, Tensor method and nn module."
ENDS = "an interior node must have exactly one user, the next node of the chain (the output node counts as a user)."
BREAKS = "only the ten elementwise ops of the README, out of place, belong to a chain; everything else ends one."
FIRST_INPUT = "where two inputs could continue a chain, the first one in node.all_input_nodes does."

BASIC = case(lambda m, x, y: torch.sigmoid(torch.relu(m.linear(x) * 2.0 + 1.0)), 12, [["mul", "add", "relu", "sigmoid"]],
             "walk the graph; link each elementwise node to its elementwise input that has no other user.",
             extra={"where": "the basic model (linear, then x * 2 + 1, relu, sigmoid)"})

EXACT_CASES: dict[str, Case] = {
    "method_spellings": case(lambda m, x, y: x.mul(1.5).add(y).relu().sub(0.5).tanh().neg().abs().exp().div(2.0).sigmoid(),
                             9, [["mul", "add", "relu", "sub", "tanh", "neg", "abs_1", "exp", "div", "sigmoid"]],
                             SPELLINGS, inputs=2),
    "function_spellings": case(function_spellings, 9, [["add", "mul", "sub", "div", "tanh", "neg", "abs_1", "exp",
                                                        "relu", "sub_1", "relu_1", "sigmoid"]], SPELLINGS, inputs=2),
    "operator_spellings": case(lambda m, x, y: -(abs(x * y + 1) - 0.5) / 2, 9,
                               [["mul", "add", "abs_1", "sub", "neg", "truediv"]], SPELLINGS, inputs=2),
    "module_spellings": case(lambda m, x, y: m.tanh(m.sigmoid(m.relu(m.linear(x)) * 2) - 0.5), 10,
                             [["relu", "mul", "sigmoid", "sub", "tanh"]], SPELLINGS),
    "multi_user_interior": case(lambda m, x, y: ((a := torch.relu(x * 2)).sigmoid() + 1) * (a - 1).tanh(), 9,
                                [["mul", "relu"], ["sigmoid", "add", "mul_1"], ["sub", "tanh"]], ENDS),
    "graph_output_interior": case(lambda m, x, y: ((a := torch.tanh(x * 3 - 1)), torch.sigmoid(a).mul(2)), 9,
                                  [["mul", "sub", "tanh"], ["sigmoid", "mul_1"]], ENDS),
    "branch_and_join": case(branch_and_join, 9, [["add", "mul"], ["relu", "sigmoid", "add_1", "exp"], ["tanh", "mul_1"]],
                            FIRST_INPUT),
    "join_first_input_started_later": case(join_first_input_started_later, 9, [["tanh", "mul"], ["relu", "sigmoid", "add", "exp"]],
                                           FIRST_INPUT + " Not the chain that started first: here the add's first "
                                           "input, the sigmoid, started after the tanh's chain.", inputs=2),
    "reduction_feeds_chain": case(lambda m, x, y: ((b := (x * 2).relu()) - b.mean(-1, keepdim=True)).sigmoid(), 9,
                                  [["mul", "relu"], ["sub", "sigmoid"]],
                                  ENDS + " Joining through the relu would need the mean inside the fused node: a cycle."),
    "reductions_break": case(lambda m, x, y: torch.relu(x * 2).sum(-1, keepdim=True).sigmoid().mul(3)
                             + x.amax(-1, keepdim=True).tanh().neg(),
                             9, [["mul", "relu"], ["sigmoid", "mul_1", "add"], ["tanh", "neg"]], BREAKS),
    "look_alikes_break": case(look_alikes_break, 9, [["mul", "add"], ["mul_1", "sub", "relu", "mul_2"], ["tanh", "neg"]],
                              BREAKS + " clamp, sqrt and gelu work elementwise too, but they are not among the ten: "
                              "match the table's spellings exactly."),
    "matmul_linear_conv_break": case(
        lambda m, x, y: torch.sigmoid(m.conv((torch.tanh(m.linear(torch.relu((x * 2 + 1) @ m.weight).neg())) - 0.5)
                                             .unsqueeze(1))) * 2,
        8, [["mul", "add"], ["relu", "neg"], ["tanh", "sub"], ["sigmoid", "mul_1"]], BREAKS),
    "getitem_breaks": case(getitem_breaks, 10, [["mul", "add"], ["relu", "sigmoid", "mul_1"]], BREAKS + " " + FIRST_INPUT),
    "random_ops_break": case(random_ops_break, 9, [["mul", "add"], ["relu", "add_1", "sigmoid", "mul_1"], ["tanh", "abs_1"]],
                             BREAKS + " Dropout and rand_like draw random numbers: they are not in the list.", rng=True),
    "inplace_ops_break": case(
        lambda m, x, y: torch.relu_(F.relu(torch.sigmoid(m.act(x * 2 + 1)).mul(2), inplace=True).add_(1).tanh().sub(1) * 3)
        .neg().abs(), 9, [["mul", "add"], ["sigmoid", "mul_1"], ["tanh", "sub", "mul_2"], ["neg", "abs_1"]],
        "in-place ops (relu_, add_, inplace=True) change a tensor others may hold: they end chains."),
    "views_break": case(lambda m, x, y: (x * 2 + 1).t().relu().sigmoid().t().tanh().neg().unsqueeze(0).exp().squeeze(0)
                        .view(-1).abs().reshape(x.shape[0], -1) * 2, 9, [["mul", "add"], ["relu", "sigmoid"], ["tanh", "neg"]],
                        BREAKS + " Views (t, view, reshape, unsqueeze) are not elementwise ops."),
    "operand_defined_mid_chain": case(lambda m, x, y: (torch.relu(x) * (y @ m.weight)).tanh(), 8, [["relu", "mul", "tanh"]],
                                      "the mul's other operand is computed after the relu: put the fused node where the "
                                      "chain's last node was, not where its first was.", inputs=2),
    "reversed_operands": case(lambda m, x, y: torch.div(y, torch.sub(y, 2.0 / ((1 - x.sigmoid()) + 0.5)).abs() + 1), 9,
                              [["sigmoid", "sub", "add", "truediv", "sub_1", "abs_1", "add_1", "div"]],
                              "in 1 - v and 2.0 / v the chain's value is the second operand: keep the order.", inputs=2),
    "broadcast_grows": case(lambda m, x, y: torch.sigmoid(torch.relu(m.bias * 2).mul(0.5) + x).mul(3), 8,
                            [["mul", "relu", "mul_1", "add", "sigmoid", "mul_2"]],
                            "the chain's value grows from [8] to [batch, 8] at the add: a buffer of the old shape "
                            "cannot hold the result."),
    # int64 -> float32 at the true division -> float64 at the add.
    "dtype_promotion": case(lambda m, x, y: ((x * 3 + 1) / 2 + y).sigmoid() - torch.div(x * 5, 2, rounding_mode="floor").neg(),
                            9, [["mul", "add", "truediv", "add_1", "sigmoid", "sub"], ["mul_1", "div", "neg"]],
                            "int64 * 3 + 1 stays int64, / 2 gives float32, + a float64 tensor gives float64: a buffer "
                            "of the old dtype cannot hold the result.",
                            inputs=lambda b: (torch.randint(-20, 20, (b, 9)), torch.randn(b, 9, dtype=torch.float64))),
    "tensor_operand_promotes": case(lambda m, x, y: (x * 1.5).add(y).tanh(), 9, [["mul", "add", "tanh"]],
                                    "float32 + a float64 tensor gives float64: a float32 buffer cannot hold the "
                                    "result, so `add_` of a tensor operand is not the same op.",
                                    inputs=lambda b: (torch.randn(b, 9), torch.randn(b, 9, dtype=torch.float64))),
    "alpha_and_rounding_mode": case(
        lambda m, x, y: torch.div(torch.sub(y, torch.add(x, y, alpha=0.5), alpha=2), 0.3, rounding_mode="floor")
        .mul(0.25).tanh(), 9, [["add", "sub", "div", "mul", "tanh"]],
        "keep every keyword argument of every op (alpha, rounding_mode).", inputs=2),
    "alpha_on_the_value": case(lambda m, x, y: torch.add(y, x.sigmoid() * 2, alpha=3).tanh(), 9,
                               [["sigmoid", "mul", "add", "tanh"]],
                               "torch.add(y, v, alpha=3) is y + 3 * v: with alpha, add does not commute, so the "
                               "chain's value stays the second operand (v.add_(y, alpha=3) would compute v + 3 * y).",
                               inputs=2),
    "value_by_keyword": case(value_by_keyword, 9, [["mul", "sigmoid", "add", "tanh"]],
                             "torch.sigmoid(input=v) and torch.add(input=v, other=y) pass the chain's value by keyword: "
                             "node.args is empty; read nodes from node.kwargs too (node.all_input_nodes, map_arg).",
                             inputs=2),
    "value_squared": case(lambda m, x, y: ((a := torch.relu(x + 1)) * a).tanh(), 9, [["add", "relu", "mul", "tanh"]],
                          "a * a reads the chain's value twice: both operands are the value."),
    "chains_in_graph_order": case(lambda m, x, y: torch.relu(torch.tanh(x).sigmoid() @ m.weight).add(1).sum(-1), 8,
                                  [["tanh", "sigmoid"], ["relu", "add"]],
                                  "return the chains in graph (topological) order of their first nodes."),
    "out_keyword_breaks": case(out_keyword_breaks, 9, [["add", "relu"], ["sub", "sigmoid"]],
                               "a call with out= writes into a tensor that others hold (here the sub reads it "
                               "afterwards): it is not an elementwise op of the README and ends a chain.", inputs=2),
    "module_called_twice": case(module_called_twice, 8, [["mul", "relu", "sub", "sigmoid"]],
                                "the same nn.ReLU is called inside the chain and again outside it: the graph still "
                                "calls it after fusing, so keep it installed (delete a submodule only when no node "
                                "calls it any more).",
                                extra={"find_hint": "m.relu and m.sigmoid are module calls (call_module): an "
                                       "elementwise module is a chain node like its function (the README's table). "
                                       "The second m.relu, after the matrix product, stands alone: no chain."}),
    "no_chains": case(lambda m, x, y: ((a := torch.relu(x)) @ m.weight).sigmoid().sum(-1) + a.mean(), 8, [],
                      "a single elementwise op is not a chain: a chain has at least two nodes."),
}

# Graded with grad on (README, "Autograd"): outputs, gradients w.r.t. inputs and parameters, inputs unchanged.
UNDER_AUTOGRAD = case(under_autograd, 8, [["mul", "sub", "sigmoid", "mul_1", "tanh", "exp", "sub_1"], ["add", "relu", "mul_2"]],
                      "with grad on, autograd keeps values for backward (a sigmoid's output, a product's operands) and "
                      "refuses out= where a tensor requires grad: run a step in place only when grad mode is off or "
                      "nothing it reads requires grad, and never write into the fused node's inputs.", inputs=2)

# The L3 benchmark: five ops on one 4096x4096 float32 tensor (64 MiB: past every cache and glibc's mmap
# threshold, so each unfused op also pays for a fresh allocation). README, "Measured speedups".
BENCHMARK_SIZE = 4096
# Every step after the head can provably run in place (README, "When a result does not fit the buffer"): the
# result-saving relu comes last, so nothing overwrites the output its backward reads.
BENCHMARK = case(lambda m, x, y: torch.relu(-(x * 1.5 + 0.5) - 0.25), 8, None, "",
                 inputs=lambda batch: (torch.randn(batch, BENCHMARK_SIZE),), batch_sizes=(BENCHMARK_SIZE,))

# Hidden models (L4): random programs of elementwise ops in random spellings, with breakers, values
# read twice, extra graph outputs, parameters and modules under random nested names.
# Each op's spellings, picked op first, then spelling: Tensor method, torch function, operator, nn module.
UNARY_SPELLINGS = [[lambda v: v.relu(), torch.relu, F.relu, nn.ReLU], [lambda v: v.sigmoid(), torch.sigmoid, nn.Sigmoid],
                   [lambda v: v.tanh(), torch.tanh, nn.Tanh], [lambda v: v.neg(), torch.neg, operator.neg],
                   [lambda v: v.abs(), torch.abs, abs]]
BINARY_SPELLINGS = [[operator.add, torch.add, lambda a, b: a.add(b)], [operator.sub, torch.sub, lambda a, b: a.sub(b)],
                    [operator.mul, torch.mul, lambda a, b: a.mul(b)]]
BREAKERS = [  # a reduction, a matmul, views, an in-place op, getitem and cat, dropout
    lambda m, v: v - v.mean(-1, keepdim=True), lambda m, v: v @ m.weight, lambda m, v: v.t().t(),
    lambda m, v: v.view(-1).view(v.shape[0], -1), lambda m, v: F.relu(v * 1.0, inplace=True),
    lambda m, v: torch.cat(v.chunk(2, dim=-1)[::-1], dim=-1), lambda m, v: F.dropout(v, 0.5, training=False),
]


def hidden_case(rng: random.Random) -> Case:
    width = rng.choice([8, 12, 16])
    modules: dict[str, type] = {}  # the nn-module spellings, installed under random dotted paths
    program = []  # step i computes value 2 + i from the model and the values before it (x, y, ...)
    steps = rng.randint(10, 18)
    # Every model holds an nn-module activation under a random path, read by an elementwise function and by nothing
    # else, so that it sits in a chain: one that a pass knowing activation modules by their attribute names (the
    # visible models' relu, sigmoid, tanh) gets wrong at every seed.
    module_at = rng.randrange(steps - 1)
    def any_value(count: int) -> int:  # of the values so far, any but the module's
        return rng.choice([value for value in range(count) if value != 2 + module_at])
    for step in range(steps):
        count = 2 + step  # the values so far: x, y and one per earlier step
        source, roll = count - 1 if rng.random() < 0.8 else any_value(count), rng.random()
        if step in (module_at, module_at + 1):
            module_step = step == module_at
            source, roll = count - 1, 0.0
            spell = rng.choice([spell for group in UNARY_SPELLINGS for spell in group
                                if isinstance(spell, type) == module_step])
        elif roll < 0.45:
            spell = rng.choice(rng.choice(UNARY_SPELLINGS))
        if roll < 0.45:
            if isinstance(spell, type):
                path = random_path(rng, 2, step)
                modules[path] = spell
                program.append(lambda m, vs, s=source, p=path: m.get_submodule(p)(vs[s]))
            else:
                program.append(lambda m, vs, s=source, f=spell: f(vs[s]))
        elif roll < 0.85:
            spell, kind = rng.choice(rng.choice(BINARY_SPELLINGS)), rng.choice(["scalar", "input", "bias", "value"])
            other = any_value(count) if kind == "value" else rng.randrange(2)  # "input": x or y
            scalar, swap = round(rng.uniform(0.5, 1.5), 3), rng.random() < 0.4 and kind != "scalar"
            def binary(m, vs, s=source, f=spell, kind=kind, other=other, scalar=scalar, swap=swap):
                operand = scalar if kind == "scalar" else m.bias if kind == "bias" else vs[other]
                return f(operand, vs[s]) if swap else f(vs[s], operand)
            program.append(binary)
        elif roll < 0.92:
            scalar = round(rng.uniform(1.5, 3.0), 3)
            program.append(lambda m, vs, s=source, d=scalar: vs[s] / d if d > 2 else torch.div(vs[s], d))
        else:
            program.append(lambda m, vs, s=source, f=rng.choice(BREAKERS): f(m, vs[s]))
    extra_outputs = rng.sample([value for value in range(2, 2 + len(program) - 1) if value != 2 + module_at],
                               k=rng.randint(0, 2))
    def run(m, x, y):
        values = [x, y]
        for op in program:
            values.append(op(m, values))
        return (values[-1], *(values[i] for i in extra_outputs))
    generated = case(run, width, None, "the pass must work for any spelling, name, nesting and graph shape.",
                     inputs=2, modules=modules)
    return replace(generated, expect=expected_chains(fx.symbolic_trace(generated.build())))  # README's definition
