"""Kata 08's grader: the hidden level trusts the grader's own chain finder, so it must agree with every
chain written out by hand."""
import pytest
import torch.fx as fx

from graders.katas.kata_08_elementwise_chains.models import BASIC, EXACT_CASES, UNDER_AUTOGRAD, expected_chains

CASES = {"basic": BASIC, **EXACT_CASES, "under_autograd": UNDER_AUTOGRAD}


@pytest.mark.parametrize("case", CASES)
def test_grader_finder_agrees_with_hand_written_chains(case):
    spec = CASES[case]
    assert expected_chains(fx.symbolic_trace(spec.build())) == spec.expect
