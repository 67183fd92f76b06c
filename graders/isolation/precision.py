"""Full float32 while grading: no TF32 in cuBLAS or cuDNN, float32 matmuls at the "highest" precision.

On an Ampere or newer GPU, cuDNN runs float32 convolutions in TF32 by default
(`torch.backends.cudnn.allow_tf32` is True), and cuBLAS may run float32 matmuls in TF32 too
(`torch.backends.cuda.matmul.allow_tf32`, `torch.set_float32_matmul_precision`). TF32 keeps 10 mantissa
bits: a correct Conv+BN fold then differs from the original by about 5e-4 relative, more than the graders'
tolerance (graders/run/numerics.py). So both sides of every comparison, the judge's (graders/run/session.py,
for the session's lifetime) and the worker's, where the learner's pass computes (graders/isolation/serve.py),
run in full float32. On a CPU these settings are torch's defaults and change nothing.

Sessions may overlap in one process (the project's tests, pytest's one session per solution tree): the
first `acquire` saves the process's settings, the last `release` puts them back.

May import: the standard library and torch (inside the functions: organiser mode reads NOTE without torch).
"""
from __future__ import annotations

# What the run's JSON and docs/grading.md say about it.
NOTE = ("full float32: TF32 off in cuBLAS and cuDNN (torch.backends.cuda.matmul.allow_tf32 = False, "
        "torch.backends.cudnn.allow_tf32 = False), torch.set_float32_matmul_precision('highest')")

FULL_FLOAT32 = {"cuda_matmul_allow_tf32": False, "cudnn_allow_tf32": False, "float32_matmul_precision": "highest"}

# Mutated in place, never rebound: the runtime guard (graders/isolation/guard.py) holds the graders' module
# globals to their identity. "holders": sessions holding full float32; "saved": the settings before the first.
_state: dict = {"holders": 0, "saved": None}


def settings() -> dict:
    """The process's settings now, under FULL_FLOAT32's keys."""
    import torch

    return {"cuda_matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
            "float32_matmul_precision": torch.get_float32_matmul_precision()}


def apply(wanted: dict | None = None) -> dict:
    """Set `wanted` (default: full float32); returns the settings before."""
    import torch

    wanted, before = wanted or FULL_FLOAT32, settings()
    torch.backends.cuda.matmul.allow_tf32 = wanted["cuda_matmul_allow_tf32"]
    torch.backends.cudnn.allow_tf32 = wanted["cudnn_allow_tf32"]
    torch.set_float32_matmul_precision(wanted["float32_matmul_precision"])
    return before


def is_full() -> bool:
    return settings() == FULL_FLOAT32


def acquire() -> None:
    """Full float32 from now on, until the matching release (the last one restores the settings before)."""
    before = apply()
    if _state["holders"] == 0:
        _state["saved"] = before
    _state["holders"] += 1


def release() -> None:
    if _state["holders"] == 0:
        return
    _state["holders"] -= 1
    if _state["holders"] == 0:
        apply(_state["saved"])
        _state["saved"] = None
