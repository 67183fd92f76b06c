"""Kata 09's model zoo and hidden-model generator: tanh-GELUs spelled every way, and look-alikes."""
import math
import random
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from graders.run import Case, PathChain, assert_same_outputs, random_identifier

SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
# Tighter than graders.run.numerics' defaults: the exact (erf) GELU differs from the tanh form by at most
# 4.7e-4 (near |x| = 2.7), while a hand-written float32 tanh-GELU matches F.gelu(approximate="tanh")
# to 5e-7. Inputs reach |x| = 6, so the absolute tolerance (scaled by the output's magnitude) is ~6e-6.
GELU_RTOL, GELU_ATOL, INPUT_RANGE = 1e-5, 1e-6, 6.0


@dataclass(frozen=True)
class Spelling:
    """One way to write 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3))); the defaults are Hugging
    Face's NewGELUActivation. The fields from `half` on are variants, most of them not to be replaced."""
    product: str = "(HX)P"       # the factors H (0.5), X (x), P (1 + tanh(...)) grouped as `(ab)c` or `a(bc)`
    one_first: bool = True       # 1 + t, or t + 1
    tanh: str = "torch"          # torch.tanh | x.tanh() | nn.Tanh | F.tanh | nn.Tanhshrink ("tanhshrink_module")
    scale_first: bool = True     # c * (...), or (...) * c
    linear_first: bool = True    # x + k * x**3, or k * x**3 + x
    k_first: bool = True         # k * x**3, or x**3 * k
    cube: str = "torch_pow"
    scale: float = SQRT_2_OVER_PI
    cubic: float = 0.044715
    half: float = 0.5
    one: float | None = 1.0      # the 1 of 1 + tanh(...): another number, or None for tanh(...) alone
    linear_other: bool = False   # another tensor + 0.044715 * x**3
    cube_of_other: bool = False  # x**3 taken of another tensor
    outer_other: bool = False    # 0.5 * other * (1 + tanh(... x ...))
    leak: str | None = None      # an interior node ("tanh" or "cube") also feeds the output ("x": it may)
    x_is_a_product: bool = False  # x = x * other first: a matcher that flattens every mul finds four factors
    formula: str = "tanh"        # "erf": the exact GELU (F.gelu's default); "quick": x * sigmoid(1.702 x)


PRODUCTS = ["(HX)P", "(XH)P", "P(HX)", "P(XH)", "(HP)X", "(PH)X", "X(HP)", "X(PH)", "(XP)H", "(PX)H", "H(XP)", "H(PX)"]
CUBES = {"x_x_x": lambda b: b * b * b, "x_times_x_x": lambda b: b * (b * b), "pow_operator": lambda b: b ** 3,
         "torch_pow": lambda b: torch.pow(b, 3.0), "method_pow": lambda b: b.pow(3)}
TANHS = ["torch", "method", "module", "functional"]
SCALES = [SQRT_2_OVER_PI, 0.7978845608, 0.7978845834732056]  # exact, a rounded literal, its float32 value


class HandGelu(nn.Module):
    def __init__(self, spelling: Spelling = Spelling(), tanh_name: str = "tanh"):
        super().__init__()
        self.spelling, self.tanh_name = spelling, tanh_name
        if spelling.tanh == "module":
            setattr(self, tanh_name, nn.Tanh())
        elif spelling.tanh == "tanhshrink_module":  # x - tanh(x): "Tanh" in its class name, not a tanh
            self.squash = nn.Tanhshrink()

    def forward(self, x, other=None):
        s = self.spelling
        x = x * other if s.x_is_a_product else x
        if s.formula == "erf":  # other GELUs: 4.7e-4 (erf) and 0.02 (quick) away from the tanh form at most
            return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
        if s.formula == "quick":
            return x * torch.sigmoid(1.702 * x)
        cube = CUBES[s.cube](other if s.cube_of_other else x)
        cubic_term = s.cubic * cube if s.k_first else cube * s.cubic
        linear = other if s.linear_other else x
        inner = linear + cubic_term if s.linear_first else cubic_term + linear
        argument = s.scale * inner if s.scale_first else inner * s.scale
        tanh = {"torch": torch.tanh, "method": lambda a: a.tanh(), "functional": F.tanh,
                "module": lambda a: getattr(self, self.tanh_name)(a), "tanhshrink_module": lambda a: self.squash(a),
                }[s.tanh](argument)
        one_plus = tanh if s.one is None else s.one + tanh if s.one_first else tanh + s.one
        factors = {"H": s.half, "X": other if s.outer_other else x, "P": one_plus}
        a, b, c = (factors[ch] for ch in s.product if ch.isalpha())
        out = (a * b) * c if s.product.startswith("(") else a * (b * c)
        return out + {"tanh": tanh, "cube": cube, "x": x}[s.leak] if s.leak else out


def linear(cin: int, cout: int, gain: float = 2.5) -> nn.Linear:
    """Pre-activations with a standard deviation of about `gain` for unit inputs: GELU's whole range."""
    layer = nn.Linear(cin, cout)
    with torch.no_grad():
        layer.weight.normal_(0, gain / math.sqrt(cin))
        layer.bias.uniform_(-1, 1)
    return layer


class MLPBlock(nn.Module):
    """Pre-norm transformer MLP: x + down(act(up(norm(x)))), with a second projection when `act` wants one."""

    def __init__(self, width: int, hidden: int, act: nn.Module, names=("norm", "up", "act", "down", "side")):
        super().__init__()
        spelling = getattr(act, "spelling", Spelling())
        self.names = names if spelling.cube_of_other or spelling.outer_other else names[:4]
        for name, module in zip(self.names, (nn.LayerNorm(width), linear(width, hidden), act,
                                             linear(hidden, width, 1.0), linear(width, hidden))):
            setattr(self, name, module)

    def forward(self, x):
        norm, up, act, down, *side = (getattr(self, name) for name in self.names)
        h = norm(x)
        return x + down(act(up(h), *(s(h) for s in side)))


def case(build, replaced: int, hint: str, *shapes: tuple, dtype=torch.float32, **options) -> Case:
    """Expected outcome: the tanh-GELUs a correct pass replaces. Inputs uniform over [-6, 6], one per shape
    ((257,) by default); outputs compared with the tolerances above."""
    return Case(build, lambda batch: tuple(torch.empty(batch, *shape, dtype=dtype).uniform_(-INPUT_RANGE, INPUT_RANGE)
                                           for shape in shapes or ((257,),)), replaced, hint, **options,
                compare=lambda run: assert_same_outputs(run.pristine, run.gm, run.input_sets(), what=run.label,
                                                        rtol=GELU_RTOL, atol=GELU_ATOL, hint=run.case.hint,
                                                        graphs=(run.before, run.gm)))


def gelu_case(replaced: int, hint: str, inputs: int = 1, **spelling) -> Case:
    return case(lambda: HandGelu(Spelling(**spelling)), replaced, hint, *[(257,)] * inputs)


def transformer(spellings: list[Spelling], width: int = 32) -> nn.Module:
    return PathChain([(f"layers.{i}", MLPBlock(width, 4 * width, HandGelu(s))) for i, s in enumerate(spellings)])


L1_CASES = {
    "hf_new_gelu": gelu_case(1, "match the multiplication at the root, then walk up its operands: 0.5, x and "
                                "1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3))."),  # Hugging Face's NewGELUActivation
    "linear_gelu_linear": case(lambda: MLPBlock(16, 48, HandGelu()), 1, "here x is the output of a Linear: x is "
                               "whatever node the pattern's x positions share.", (16,)),
}
CONSTANT = "is sqrt(2/pi) {}: compare constants with a relative tolerance of about 1e-5."
GROUPED = "is the same product of three factors, grouped another way."
NOT_A_GELU = "leave it alone: with another constant it is another function, and F.gelu would change the output."
SAME_NODE = "is not a GELU of anything: every x in the pattern must be the same node."
LEAKS = "has a second user outside the pattern: replacing would erase a node that is still needed."
EXACT_CASES: dict[str, Case] = {
    "cube_x_x_x": gelu_case(1, "x * x * x is (x * x) * x: two mul nodes, both of x.", cube="x_x_x"),
    "cube_x_times_x_x": gelu_case(1, "x * (x * x) associates the other way round.", cube="x_times_x_x"),
    "cube_pow_operator": gelu_case(1, "x ** 3 traces to operator.pow(x, 3).", cube="pow_operator"),
    "cube_method_pow": gelu_case(1, "x.pow(3) traces to a call_method node 'pow'.", cube="method_pow"),
    "tanh_method": gelu_case(1, "x.tanh() traces to a call_method node 'tanh'.", tanh="method"),
    "tanh_module": gelu_case(1, "an nn.Tanh module traces to a call_module node: look the module up and test its "
                                "type, whatever it is called.", tanh="module"),
    "constant_rounded_literal": gelu_case(1, "0.7978845608 " + CONSTANT.format("rounded"), scale=SCALES[1]),
    "constant_float32_value": gelu_case(1, "0.7978845834732056 " + CONSTANT.format("in float32"), scale=SCALES[2]),
    "commuted_everywhere": gelu_case(1, "a * b and b * a (and a + b, b + a) are the same: try both operand orders "
                                        "at every level (and the cube here is x * x * x).", product="P(XH)",
                                     one_first=False, scale_first=False, linear_first=False, k_first=False,
                                     cube="x_x_x"),
    "half_applied_last": gelu_case(1, f"x * (1 + t) * 0.5 {GROUPED}", product="(XP)H"),
    "half_times_tanh_part": gelu_case(1, f"x * (0.5 * (1 + t)) {GROUPED} Here the tanh is x.tanh() and the cube "
                                         "x ** 3.", product="X(HP)", tanh="method", cube="pow_operator"),
    "gelu_input_used_elsewhere": case(lambda: nn.Sequential(linear(24, 24, 1.5), HandGelu(Spelling(leak="x"))), 1,
                                      "x itself may have other users: only the nodes between x and the result must "
                                      "be used nowhere else.", (24,)),
    "gelu_input_is_a_product": gelu_case(1, "x may itself be a mul node: do not flatten the product past the three "
                                            "factors 0.5, x and (1 + tanh(...)); the cube here is x * x * x.", 2,
                                         product="H(XP)", cube="x_x_x", x_is_a_product=True),
    "chained_gelus": case(lambda: nn.Sequential(HandGelu(Spelling(cube="x_x_x")), HandGelu(Spelling(tanh="method"))),
                          2, "gelu(gelu(x)): after the first replacement, the second GELU's x is the new node. The "
                          "first GELU cubes x as x * x * x, the second calls x.tanh()."),
    "transformer_mlp": case(lambda: transformer([Spelling(), Spelling(cube="x_x_x", tanh="module"),
                                                 Spelling(product="P(HX)", scale=SCALES[1])]), 3,
                            "every MLP block holds one tanh-GELU: replace all three.", (5, 32)),
    "float64_model": case(lambda: nn.Sequential(linear(24, 24, 1.5), HandGelu(Spelling(cube="method_pow"))).double(), 1,
                          "this is a tanh-GELU, written another way: the pass must see through the spelling.", (24,),
                          dtype=torch.float64),
    # Not tanh-GELUs, or not safe to replace.
    "scale_0_8": gelu_case(0, NOT_A_GELU, scale=0.8),
    "cubic_0_0447": gelu_case(0, NOT_A_GELU, cubic=0.0447),
    "half_missing": gelu_case(0, "x * (1 + tanh(...)) is twice a GELU: the 0.5 is part of the pattern.", half=1.0,
                              product="X(HP)"),
    "cube_of_another_tensor": gelu_case(0, f"x + 0.044715 * y**3 {SAME_NODE}", 2, cube_of_other=True),
    "linear_term_another_tensor": gelu_case(0, f"y + 0.044715 * x**3 {SAME_NODE} The linear term too.", 2,
                                            linear_other=True),
    "two_plus_tanh": gelu_case(0, "0.5 * x * (2 + tanh(...)) is not a GELU: the 1 of 1 + tanh is part of the pattern.",
                               one=2.0),
    "tanh_without_one": gelu_case(0, "0.5 * x * tanh(...) is not a GELU: the 1 + is part of the pattern.", one=None),
    "tanhshrink_module_not_tanh": gelu_case(0, "nn.Tanhshrink computes x - tanh(x): a class name holding 'Tanh' is not "
                                               "a tanh. Test the module's type (isinstance(module, nn.Tanh)).",
                                            tanh="tanhshrink_module"),
    "outer_factor_another_tensor": gelu_case(0, f"0.5 * y * (1 + tanh(... x ...)) {SAME_NODE}", 2, outer_other=True),
    "tanh_used_elsewhere": gelu_case(0, f"the tanh node {LEAKS}", leak="tanh"),
    "cube_used_elsewhere": gelu_case(0, f"x**3 {LEAKS}", cube="x_times_x_x", leak="cube"),
    "exact_erf_gelu": gelu_case(0, "0.5 * x * (1 + erf(x / sqrt(2))) is the exact GELU, not the tanh approximation: "
                                   "match the tanh argument too, not only the outer product.", formula="erf"),
    "quick_gelu_sigmoid": gelu_case(0, "x * sigmoid(1.702 x) is another approximation, up to 0.02 away from the tanh "
                                       "form.", formula="quick"),
    "gelu_next_to_a_lookalike": case(lambda: transformer([Spelling(scale=0.8), Spelling(tanh="method")]), 1,
                                     "the first block's constant is 0.8 (not a GELU), the second block's GELU is "
                                     "genuine.", (5, 32)),
}

# The L3 benchmark: one hand-written GELU on a 2048x4096 float32 tensor (32 MiB, so every intermediate is a
# fresh allocation; README, "Measured speedups": the reference reads 3.7x-4.7x on CPU, a no-op 0.96x-1.01x).
BENCHMARK = case(HandGelu, 1, "", (4096,), batch_sizes=(2048,))


# Hidden models (L4): MLP blocks under random names, each activation a random tanh-GELU spelling or look-alike.
LOOKALIKES = {
    "wrong_scale": lambda rng, s: replace(s, scale=rng.choice([0.8, 0.75, 0.7])),
    "wrong_cubic": lambda rng, s: replace(s, cubic=rng.choice([0.0447, 0.045, 0.035])),
    "cube_of_other": lambda rng, s: replace(s, cube_of_other=True),
    "outer_other": lambda rng, s: replace(s, outer_other=True),
    "leak": lambda rng, s: replace(s, leak=rng.choice(["tanh", "cube"])),
    "erf": lambda rng, s: replace(s, formula="erf"),
    "quick": lambda rng, s: replace(s, formula="quick"),
}


def hidden_case(rng: random.Random) -> Case:
    width = rng.choice([8, 12, 16, 24])
    kinds = [rng.choice(["gelu"] * 7 + list(LOOKALIKES)) for _ in range(rng.randint(2, 5))]
    # At least one GELU, and it calls its tanh as an nn.Tanh under a random name: a pass that knows the module by
    # the visible models' name for it (`tanh`) fails every seed
    module_tanh = rng.randrange(len(kinds))
    kinds[module_tanh] = "gelu"
    blocks = []
    for index, kind in enumerate(kinds):
        tanh = "module" if index == module_tanh else rng.choice(TANHS)
        spelling = Spelling(product=rng.choice(PRODUCTS), one_first=rng.random() < 0.5, tanh=tanh,
                            scale_first=rng.random() < 0.5, linear_first=rng.random() < 0.5,
                            k_first=rng.random() < 0.5, cube=rng.choice(list(CUBES)), scale=rng.choice(SCALES))
        act = HandGelu(spelling if kind == "gelu" else LOOKALIKES[kind](rng, spelling), random_identifier(rng))
        names = []
        while len(names) < 5:
            names += [name] if (name := random_identifier(rng)) not in names else []
        path = ".".join(random_identifier(rng) for _ in range(rng.randint(1, 3))) + f"_{index}"
        blocks.append((path, MLPBlock(width, rng.choice([2, 3, 4]) * width, act, tuple(names))))
    return case(lambda: PathChain(blocks), kinds.count("gelu"), "the pass must work for any spelling, names and "
                "nesting, and leave look-alikes alone.", (rng.randint(1, 4), width))
