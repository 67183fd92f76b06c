"""Kata 02's model zoo and hidden-model generator. symbolic_trace records the function a model calls, so a
block calling MATMULS["torch.mm"] traces as source saying torch.mm(x, w) does."""

import itertools
import operator
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

from graders.run import Case, CheckFailed, PathChain, Run, assert_same_outputs, random_identifier

MATMULS = {"@": operator.matmul, "torch.matmul": torch.matmul, "torch.mm": torch.mm}
BIAS_ADDS = {"p + b": operator.add, "b + p": lambda p, b: b + p, "torch.add(p, b)": torch.add,
             "torch.add(b, p)": lambda p, b: torch.add(b, p)}
RELUS = {"F.relu": F.relu, "F.relu(inplace=True)": lambda y: F.relu(y, inplace=True),
         "torch.relu": torch.relu, ".relu()": lambda y: y.relu()}

# Blocks a correct pass must leave alone, and why (the hint a learner reads).
BLOCKED_KINDS = {
    "product_reused": "the product x @ w has a second user (a sigmoid of it): adding the bias into its "
                      "buffer would change what that user reads. The matcher refuses a match whose inner "
                      "nodes leak out, but only if the matmul is inside the pattern.",
    "sum_reused": "the sum x @ w + b has a second user besides the ReLU: a ReLU in its buffer would change "
                  "what that user reads.",
    "relu6": "the activation is relu6, not ReLU: it clamps at 6.",
    "gelu": "the activation is GELU, not ReLU.",
    "add_alpha": "torch.add(p, b, alpha=0.5) scales the bias: the keyword is part of the node, and a "
                 "pattern without it does not match it.",
}
SPELLING = ("@", "p + b", "F.relu")  # (matmul, bias add, ReLU): keys of the three tables above


class Block(nn.Module):
    """One site: relu(x @ w + b) in the given spelling, or a blocked (or either-way) variant of it."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | float, spelling: tuple = SPELLING,
                 kind: str = "fuse", names: tuple[str, str] = ("weight", "bias")):
        super().__init__()
        self.kind, self.spelling, self.names = kind, spelling, names
        setattr(self, names[0], weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight))
        # A float bias stays a plain attribute: traced as a literal argument of the add.
        setattr(self, names[1], bias if isinstance(bias, nn.Parameter) else
                nn.Parameter(bias) if isinstance(bias, torch.Tensor) else bias)

    def forward(self, x):
        w, b = (getattr(self, name) for name in self.names)
        b = x if self.kind == "bias_is_the_input" else b  # relu(x @ w + x)
        b = b.double() if self.kind == "bias_cast_in_forward" else b  # a node the graph knows nothing of
        x = x[0] if self.kind == "one_sample" else x  # a vector: x @ w has no batch dimension
        matmul, bias_add, relu = (table[key] for table, key in zip((MATMULS, BIAS_ADDS, RELUS), self.spelling))
        product = matmul(x, w)
        total = torch.add(product, b, alpha=0.5) if self.kind == "add_alpha" else bias_add(product, b)
        y = {"relu6": F.relu6, "gelu": F.gelu}.get(self.kind, relu)(total)
        if self.kind == "shared_operands":  # a second site reads the same x, w and b: each has two users
            return y + relu(bias_add(matmul(x * 0.5, w), b))
        if self.kind == "product_reused":
            return y * torch.sigmoid(product)
        return y - 0.5 * total if self.kind == "sum_reused" else y


def random_weight(*shape: int) -> torch.Tensor:
    return torch.randn(*shape) / shape[-2] ** 0.5


def random_bias(width: int, kind: str = "fuse") -> torch.Tensor:
    # Large enough that dropping the bias shows, and that relu6 really clamps at 6 somewhere.
    return torch.empty(width).uniform_(3, 9) if kind == "relu6" else torch.randn(width) * 2


def block(fan_in: int, fan_out: int, spelling: tuple = SPELLING, kind: str = "fuse", bias=None) -> Block:
    return Block(random_weight(fan_in, fan_out), random_bias(fan_out, kind) if bias is None else bias, spelling, kind)


def spelled(matmul="@", bias_add="p + b", relu="F.relu", **options):
    return lambda: net(*(block(i, o, (matmul, bias_add, relu), **options) for i, o in ((12, 16), (16, 8))))


def net(*blocks: nn.Module) -> PathChain:
    return PathChain([(f"layer{i}", b) for i, b in enumerate(blocks)])


def outputs_match(run: Run) -> None:
    """The standard comparison; a crash of the rewritten module (addmm on a 3-D input) gets the hint too."""
    try:
        assert_same_outputs(run.pristine, run.gm, run.input_sets(), what=run.label, hint=run.case.hint,
                            graphs=(run.before, run.gm))
    except CheckFailed as failure:
        hinted = "Hint:" in str(failure)  # else the rewritten module crashed: no hint, no graphs yet
        run.fail(str(failure), hint="" if hinted else None, graphs=not hinted)


def case(build, in_shape: tuple, rewrites: int | None, hint: str, dtype=torch.float32, **options) -> Case:
    """A case whose expected outcome is the number of sites a correct pass rewrites (None: either)."""
    return Case(build, lambda batch: (torch.randn(batch, *in_shape, dtype=dtype),), rewrites, hint,
                compare=outputs_match, **options)


# Spellings the visible models use, each but the canonical one a pattern of its own: (matmul, bias add, ReLU, why).
SPELLING_CASES = {
    "torch_matmul_spelling": ("torch.matmul", "p + b", "F.relu", "torch.matmul(x, w) is not x @ w (operator.matmul)"),
    "mm_and_torch_add": ("torch.mm", "torch.add(p, b)", "torch.relu",
                         "torch.relu(torch.add(torch.mm(x, w), b)) shares no target with F.relu(x @ w + b)"),
    "commuted_bias": ("@", "b + p", "F.relu", "b + x @ w puts the product second: the matcher knows no commutativity"),
    "commuted_torch_add": ("torch.matmul", "torch.add(b, p)", ".relu()",
                           "torch.add(b, torch.matmul(x, w)).relu() is commuted, and .relu() is a call_method node"),
    "torch_relu": ("@", "p + b", "torch.relu", "torch.relu is not F.relu"),
    "method_relu": ("@", "p + b", ".relu()", "y.relu() is a call_method node with target 'relu'"),
    "inplace_relu": ("@", "p + b", "F.relu(inplace=True)", "F.relu(y) traces with the keyword inplace=False, and a "
                     "literal must match exactly: F.relu(y, inplace=True) needs its own pattern"),
}
TWO_LAYER_MLP = case(spelled(), (12,), 2, "both layers are relu(x @ w + b) in the spelling of `pattern`: "
                                          "replace_pattern(gm, pattern, replacement) rewrites them.")
EXACT_CASES: dict[str, Case] = {
    **{name: case(spelled(*spelling), (12,), 2, f"{why}. The matcher compares call targets by identity and arguments "
                  "position by position: every spelling is a pattern of its own (print gm.graph to see the targets).")
       for name, (*spelling, why) in SPELLING_CASES.items()},
    "batched_3d_input": case(spelled(), (5, 12), 2, "x is (batch, tokens, features): torch.addmm multiplies "
                                                    "2-D matrices only; torch.matmul handles any batch dimensions."),
    "batched_weights": case(lambda: Block(random_weight(3, 12, 8), random_bias(8), ("torch.matmul", "p + b",
                            "torch.relu")), (4, 12), 1, "the site is torch.relu(torch.matmul(x, w) + b), a spelling "
                            "of its own, with a 3-D weight (a stack of weights, one per batch element): a batched "
                            "matmul, which flattening x to 2-D for addmm does not compute."),
    "scalar_bias": case(spelled(bias=0.5), (12,), 2, "a pattern's placeholder matches a literal too: here b is the "
                                                     "float 0.5."),
    "mixed_spellings": case(lambda: net(block(12, 16, ("@", "b + p", "torch.relu")),
                                        block(16, 16, ("torch.matmul", "torch.add(p, b)", ".relu()")),
                                        block(16, 8, ("torch.mm", "torch.add(b, p)", "F.relu(inplace=True)")),
                                        block(8, 8)), (12,), 4,
                            "four sites in four spellings: every one is rewritten, and the count says 4."),
    "float64": case(lambda: net(block(12, 16), block(16, 8, ("@", "b + p", "F.relu"))).double(), (12,), 2,
                    "the sites are F.relu(x @ w + b) and F.relu(b + x @ w) (the commuted add a pattern of its own), "
                    "in float64: the fused form must keep the model's dtype.", torch.float64),
    **{f"blocked_{kind}": case(spelled(kind=kind), (12,), 0, f"{why} A correct pass leaves this model exactly as "
                               "it is.") for kind, why in BLOCKED_KINDS.items()},
    # The in-place epilogue is exact only where the sum keeps the product's shape and dtype; a filter on the
    # match (replace_pattern_with_filters) leaves the other sites alone.
    "bias_broadcasts_beyond_the_product": case(
        lambda: Block(random_weight(12, 8), torch.randn(2, 1, 8) * 2), (12,), 0,
        "b has shape (2, 1, 8) and the product (batch, 8): p + b broadcasts to (2, batch, 8), a new shape, and "
        "p.add_(b) raises. A pattern carries no shapes: filter the matches (replace_pattern_with_filters) on what "
        "the graph knows of b (a get_attr node reads a parameter: its shape and dtype) and leave this site alone."),
    "float64_bias_on_float32_product": case(
        lambda: Block(random_weight(12, 8), random_bias(8).double()), (12,), 0,
        "b is float64 and the product float32: p + b is float64 (type promotion), while p.add_(b) keeps float32 "
        "and rounds the sum. Filter the matches on dtypes: torch.result_type(p, b) must be p's dtype."),
    "bias_cast_in_forward": case(lambda: Block(random_weight(12, 8), random_bias(8), kind="bias_cast_in_forward"), (12,), 0,
                                 "b is self.bias.double(), computed in forward: a call_method node with no shape or "
                                 "dtype the graph knows (no get_attr, no metadata), and here p + b is float64 while "
                                 "p.add_(b) would stay float32. Where the graph does not tell enough, leave the site."),
    "row_bias_on_a_vector": case(lambda: Block(random_weight(12, 8), torch.randn(1, 8) * 2, kind="one_sample"), (12,), 0,
                                 "x is x[0], a vector whose shape the graph does not know, and b has shape (1, 8): "
                                 "the product is (8,), and p + b grows it to (1, 8), so p.add_(b) raises. Do not "
                                 "assume x has a batch dimension: with x's shape unknown, only a bias of at most one "
                                 "dimension surely fits the product."),
    "zero_dim_biases_of_other_dtypes": case(
        lambda: net(Block(random_weight(12, 16), torch.tensor(0.25, dtype=torch.float64)),
                    Block(random_weight(16, 8), nn.Parameter(torch.tensor(2), requires_grad=False))), (12,), 2,
        "a 0-dim tensor does not promote a tensor of its own category: float32 + a 0-dim float64 (or int64) tensor "
        "is float32, so both sites fuse. Ask torch.result_type(p, b), not b.dtype == p.dtype, and fuse into a form "
        "that takes such a bias (p.add_(b) does; torch.addmm wants a bias of its operands' dtype)."),
    "float_literal_on_an_integer_product": Case(
        lambda: Block(nn.Parameter(torch.randint(-3, 4, (12, 8)), requires_grad=False), 0.5),
        lambda batch: (torch.randint(-3, 4, (batch, 12)),), 0,
        "the product of two int64 tensors is int64, and p + 0.5 is float32 (a float literal promotes an integer "
        "tensor): p.add_(0.5) raises. A literal bias needs the dtype check too.", compare=outputs_match,
        cpu_only="CUDA has no integer matrix product (addmm_cuda is not implemented for int64)"),
    "mm_with_a_literal_bias": case(spelled("torch.mm", "torch.add(p, b)", "torch.relu", bias=0.5), (12,), 2,
                                   "the sites are torch.relu(torch.add(torch.mm(x, w), 0.5)), a spelling of "
                                   "their own, and b is the Python number 0.5, which torch.add accepts and "
                                   "torch.addmm refuses (its bias must be a tensor)."),
    "operands_shared_by_two_sites": case(
        lambda: net(block(12, 8, kind="shared_operands"), block(8, 8, ("torch.matmul", "torch.add(b, p)", ".relu()"),
                                                                    kind="shared_operands")), (12,), 4,
        "x, w and b are each read by two sites here, spelled F.relu(x @ w + b) and torch.add(b, torch.matmul(x, w))"
        ".relu() (each spelling a pattern of its own); only the product and the sum must have no other user "
        "(the matcher checks that); the pattern's inputs may have any number."),
    "bias_is_the_input": case(lambda: net(*(block(12, 12, kind="bias_is_the_input", bias=0.0) for _ in "hh")),
                              (12,), None, "in relu(h @ w + h) one node would fill two placeholders (x and b), "
                              "which the matcher never does; leaving it or rewriting it exactly are both fine."),
}

# The L3 benchmark, a wide projection head: the 48 MB product dwarfs the multiply (16 multiply-adds per output
# element), so the time goes to the bias add and the ReLU writing two more 48 MB tensors (README, "Where the fused
# form pays"; "Measured speedups" says why the level counts fresh-tensor bytes and the time threshold sits low).
BATCH, TOKENS, FAN_IN, FAN_OUT = 8, 384, 16, 4096
BENCHMARK = case(lambda: PathChain([("head", block(FAN_IN, FAN_OUT, ("@", "p + b", "torch.relu")))]),
                 (TOKENS, FAN_IN), 1, "", batch_sizes=(BATCH,))


# The spellings the visible models show (the zoo above: SPELLING, SPELLING_CASES, batched_weights and
# mixed_spellings): a pass that lists only these gets L2 right and fails every hidden model.
VISIBLE_SPELLINGS = {SPELLING, *(tuple(spelling) for *spelling, _ in SPELLING_CASES.values()),
                     ("torch.matmul", "p + b", "torch.relu"), ("@", "b + p", "torch.relu"),
                     ("torch.matmul", "torch.add(p, b)", ".relu()"), ("torch.mm", "torch.add(b, p)", "F.relu(inplace=True)")}


# Hidden models (L4): random depth, widths, spellings, literal biases, 2-D or 3-D inputs, parameter
# names and nesting, with blocked sites mixed in.
def hidden_case(rng: random.Random) -> Case:
    batched, tokens = rng.random() < 0.5, rng.randint(2, 5)
    width = in_width = rng.choice([8, 12, 16, 24])
    blocks, rewrites = [], 0
    kinds = [rng.choice(["fuse"] * 4 + ["shared_operands"] + list(BLOCKED_KINDS)) for _ in range(rng.randint(3, 6))]
    unseen = rng.randrange(len(kinds))  # at least one site to rewrite, in a spelling no visible model shows
    # (torch.mm is 2-D only)
    kinds[unseen] = "fuse"
    for index, kind in enumerate(kinds):
        fan_out = rng.choice([8, 12, 16, 24])
        spellings = [s for s in itertools.product(MATMULS, BIAS_ADDS, RELUS)
                     if (s[0] != "torch.mm" or not batched) and (index != unseen or s not in VISIBLE_SPELLINGS)]
        spelling = rng.choice(spellings)
        literal = kind in ("fuse", "shared_operands") and rng.random() < (0.5 if spelling[0] == "torch.mm" else 0.15)
        bias = round(rng.uniform(-1, 1), 2) if literal else random_bias(fan_out, kind)
        names = (random_identifier(rng), random_identifier(rng))
        while names[1] == names[0]:
            names = (names[0], random_identifier(rng))
        path = ".".join(random_identifier(rng) for _ in range(rng.randint(1, 3))) + f"_{len(blocks)}"
        blocks.append((path, Block(random_weight(width, fan_out), bias, spelling, kind, names)))
        rewrites, width = rewrites + {"fuse": 1, "shared_operands": 2}.get(kind, 0), fan_out
    return case(lambda: PathChain(blocks), (tokens, in_width) if batched else (in_width,), rewrites,
                "the pass must work for any spelling combination, parameter names, nesting and input rank.")
