"""The guards a pass added (chapter 2: a size symbol it specialised) are measured where the pass ran, around its
call (graders/run/context.py in process, graders/isolation/serve.py in a worker), and katas 12 and 13 fail them in
one sentence, in process and isolated alike (kata 11: tests/test_kata_11_export_conv_bn.py)."""
import re

import pytest

from graders.dev.mutation import write_mutant_tree
from graders.frame.catalogue import load_grader
from graders.katas.kata_12_reinplace.mutants import MUTANTS as REINPLACE_MUTANTS
from graders.katas.kata_13_sdpa_pattern.mutants import MUTANTS as ATTENTION_MUTANTS
from graders.run.session import GradingSession

pytestmark = pytest.mark.locks_per_check  # grades in process (the judge's side, isolated): tests/conftest.py

CASES = {  # kata: (its mutant that adds a guard, a symbolic check that catches it, the pass's name)
    "12_reinplace": (next(m for m in REINPLACE_MUTANTS if m.name == "reads_concrete_sizes"), "symbolic_batch",
                     "reinplace"),
    "13_sdpa_pattern": (next(m for m in ATTENTION_MUTANTS if m.name == "branches_on_a_size"), "divided_by_sqrt_d",
                        "fuse_attention"),
}


def message(tmp_path, kata: str, isolate: bool) -> str:
    mutant, check, _ = CASES[kata]
    grader = load_grader(kata)
    graded = next(c for level in (1, 2) for c in grader.checks_at(level) if c.name == check)
    session = GradingSession(write_mutant_tree(tmp_path, kata, mutant), seed=0, isolate=isolate)
    try:
        result = session.run(graded)
    finally:
        session.close()
    assert not result.passed, f"{kata} {mutant.name} passed {check}"
    return result.message


@pytest.mark.parametrize("isolate", [False, True], ids=["in_process", "isolated"])
@pytest.mark.parametrize("kata", list(CASES))
def test_a_guard_the_pass_added_is_named(tmp_path, kata, isolate):
    function = CASES[kata][2]
    text = message(tmp_path, kata, isolate)
    assert re.search(rf"{function} added the guard\(s\) \S.* to the ShapeEnv of the graph it was given: reading a "
                     r"size symbol's value", text), text
    assert "Traceback" not in text, text
