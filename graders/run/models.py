"""Helpers for building graded models with random names and nesting, and models as data (Program), shared by
the kata graders.

May import: the standard library and torch.
"""
from __future__ import annotations

import keyword
import random
from typing import Callable

import torch
import torch.nn as nn

_SYLLABLES = ["enc", "dec", "blk", "layer", "stage", "unit", "proj", "head", "body", "trunk", "mix", "cell"]


def random_identifier(rng: random.Random) -> str:
    """A fresh Python identifier such as 'stage7_mix', so that no pass can key on module names."""
    while True:
        name = f"{rng.choice(_SYLLABLES)}{rng.randrange(100)}_{rng.choice(_SYLLABLES)}"
        if not keyword.iskeyword(name):
            return name


def random_identifiers(rng: random.Random, n: int) -> list[str]:
    """`n` distinct fresh identifiers, drawn in turn (a repeat is drawn again)."""
    names: list[str] = []
    while len(names) < n:
        if (name := random_identifier(rng)) not in names:
            names.append(name)
    return names


def random_path(rng: random.Random, deepest: int, index: int) -> str:
    """A dotted path of 1 to `deepest` fresh identifiers, ending in `_<index>` so that no two paths collide."""
    return ".".join(random_identifier(rng) for _ in range(rng.randint(1, deepest))) + f"_{index}"


def nest_under(root: nn.Module, path: str, module: nn.Module) -> None:
    """Install `module` at dotted `path`, creating empty container modules on the way."""
    *parents, leaf = path.split(".")
    for name in parents:
        if not hasattr(root, name):
            setattr(root, name, nn.Module())
        root = getattr(root, name)
    setattr(root, leaf, module)


class PathChain(nn.Module):
    """Blocks installed at (possibly dotted) paths and run in order: a model whose module names the grader picks."""

    def __init__(self, blocks: list[tuple[str, nn.Module]]):
        super().__init__()
        self.order = [path for path, _ in blocks]
        for path, block in blocks:
            nest_under(self, path, block)

    def forward(self, x):
        for path in self.order:
            x = self.get_submodule(path)(x)
        return x


class Program(nn.Module):
    """A model as data: forward(x) returns program(self, x). Each part is installed at its (possibly dotted)
    name: a module or parameter as itself, a plain tensor as a buffer, anything else as a plain attribute."""

    def __init__(self, program: Callable | None, **parts):
        super().__init__()
        self.program = program
        for path, part in parts.items():
            nest_under(self, path, nn.Buffer(part) if type(part) is torch.Tensor else part)

    def forward(self, x):
        return self.program(self, x)


class Program2(Program):
    """A Program of two inputs: forward(x, y=None) returns program(self, x, y). A separate class because
    symbolic_trace makes one placeholder per parameter of forward (and cannot trace *inputs)."""

    def forward(self, x, y=None):
        return self.program(self, x, y)


def bn2d(channels: int, *, affine: bool = True, track_running_stats: bool = True) -> nn.BatchNorm2d:
    """A BatchNorm2d with random eps, running statistics and affine parameters (katas 03 and 11)."""
    bn = nn.BatchNorm2d(channels, eps=random.choice([1e-3, 1e-2, 0.1]), affine=affine,
                        track_running_stats=track_running_stats)
    with torch.no_grad():
        if track_running_stats:
            bn.running_mean.uniform_(-2, 2)
            bn.running_var.uniform_(0.05, 3)
        if affine:
            bn.weight.uniform_(-2, 2)
            bn.bias.uniform_(-1, 1)
    return bn


def conv2d(cin: int, cout: int, kernel=3, *, bias: bool = True, transposed: bool = False, **options) -> nn.Module:
    """A Conv2d (or ConvTranspose2d) with a random bias; padding keeps the size unless given."""
    options.setdefault("padding", (kernel if isinstance(kernel, int) else kernel[0]) // 2 * options.get("dilation", 1))
    conv = (nn.ConvTranspose2d if transposed else nn.Conv2d)(cin, cout, kernel, bias=bias, **options)
    if bias:
        with torch.no_grad():
            conv.bias.uniform_(-1, 1)
    return conv
