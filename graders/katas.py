"""The catalogue of katas, and where each one's grader lives."""
from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

KATAS: dict[str, str] = {
    "01_linear_relu": "Linear + ReLU fusion",
    "02_matmul_bias_relu": "matmul + bias + ReLU with subgraph_rewriter",
    "03_conv_bn": "Conv2d + BatchNorm2d folding",
    "04_dce": "dead-code elimination",
    "05_cse": "common-subexpression elimination",
    "06_constant_folding": "constant folding",
    "07_algebraic_simplify": "algebraic simplification",
    "08_elementwise_chains": "elementwise-chain finder and fuser",
    "09_gelu": "tanh-GELU detection",
    "10_verify_harness": "pass-verification harness",
}


def grader_module_name(kata: str) -> str:
    return f"graders.kata_{kata}"


def is_available(kata: str) -> bool:
    """A kata is available once its grader module exists."""
    return importlib.util.find_spec(grader_module_name(kata)) is not None


def available_katas() -> list[str]:
    return [kata for kata in KATAS if is_available(kata)]


def load_grader(kata: str):
    """The kata's grader: a `graders.core.Kata` declared in graders/kata_<name>.py."""
    if kata not in KATAS:
        raise KeyError(f"unknown kata {kata!r}; the katas are: {', '.join(KATAS)}")
    return importlib.import_module(grader_module_name(kata)).KATA
