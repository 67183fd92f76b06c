"""The shared harness: loading learner files, calling them, counting cost, and the pytest front end."""
import json
import os
import subprocess
import sys

import pytest
import torch

from graders.frame.catalogue import load_grader
from graders.frame.levels import CheckFailed
from graders.run.numerics import assert_same_outputs, describe_difference, manual_seed, seeded
from graders.run.session import GradingSession
from graders.frame.catalogue import REPO_ROOT
from graders.run.timing import count_cost

KATA = "03_conv_bn"


def session_with(tmp_path, source: str) -> GradingSession:
    (tmp_path / KATA).mkdir()
    (tmp_path / KATA / "solution.py").write_text(source)
    return GradingSession(tmp_path, seed=0, speed=False)


def test_a_grading_seed_draws_what_torch_manual_seed_draws():
    """On a CPU a grading seeds the CPU's generator alone (numerics.manual_seed): the same numbers."""
    torch.manual_seed(5)
    want = torch.randn(4)
    manual_seed(5)
    assert torch.equal(torch.randn(4), want)
    outside = torch.random.get_rng_state()
    with seeded(5):
        assert torch.equal(torch.randn(4), want)
    assert torch.equal(torch.random.get_rng_state(), outside)  # restored


def test_bit_identity_holds_nan_equal_and_tells_the_sign_of_zero_in_every_part():
    """Bit-exact comparisons (kata 07): NaN equals NaN, -0.0 differs from +0.0, in float and complex tensors
    alike (a complex NaN compared as a complex number never equals itself)."""
    inf, nan = float("inf"), float("nan")
    real = torch.tensor([inf, -0.0, nan, 1.5])
    values = torch.complex(real, real.flip(0))
    for tensor in (real, values):
        assert describe_difference(tensor.clone(), tensor) is None
    assert "at index (1,) the original gives -0.0, the rewritten module 0.0 (the same value with the other sign bit" \
        in describe_difference(real + 0.0, real)
    assert describe_difference(values * 1, values) == ("at index (0,) the imaginary part of the original gives 1.5, "
                                                       "the rewritten module nan; 4 of 4 elements differ")
    assert describe_difference(values + 0, values).startswith("at index (1,) the real part of the original gives -0.0")


def test_outputs_that_hold_nan_or_inf_compare_value_by_value():
    """assert_same_outputs on an original whose output holds NaN and infinities (a generated model whose exp
    overflows: kata 05's reference failed L4 so at seed 1363426176): the same values, NaN included, pass; a finite
    value off by more than the tolerance still fails, an infinity no more lets every difference through than a
    NaN stops a tolerable one from passing."""
    inf, nan = float("inf"), float("nan")
    want = torch.tensor([nan, inf, -inf, 2.0, 3.0])
    same = lambda values: lambda x: torch.tensor(values) + 0 * x  # noqa: E731
    inputs = [(torch.zeros(5),)]
    assert_same_outputs(same(want.tolist()), same(want.tolist()), inputs)
    assert_same_outputs(same(want.tolist()), same([nan, inf, -inf, 2.0, 3.0 + 1e-6]), inputs)  # within tolerance
    for original, wrong in [(want.tolist(), [nan, inf, -inf, 2.0, 3.5]), (want.tolist(), [1.0, inf, -inf, 2.0, 3.0]),
                            (want.tolist(), [nan, inf, inf, 2.0, 3.0]), ([inf, 2.0, 3.0], [inf, 2.0, 3.5])]:
        with pytest.raises(CheckFailed, match="does not compute what the original does"):
            assert_same_outputs(same(original), same(wrong), [(torch.zeros(len(original)),)])


@pytest.mark.parametrize("source, expected", [
    ("def fuse_conv_bn(gm:\n", "does not compile"),
    ("import not_a_module_anywhere\n", "importing"),
    ("raise RuntimeError('boom')\n", "RuntimeError: boom"),
    ("x = 1\n", "has no function fuse_conv_bn"),
    ("def fuse_conv_bn(gm):\n    return 42\n", "returned a int"),
    ("def fuse_conv_bn(gm):\n    return gm.nope\n", "solution.py line 2: `return gm.nope`"),
])
def test_a_broken_solution_fails_with_one_sentence(tmp_path, source, expected):
    session = session_with(tmp_path, source)
    single_pair = next(c for c in load_grader(KATA).checks if c.name == "single_pair")
    result = session.run(single_pair)
    assert not result.passed and expected in result.message
    assert "\n" not in result.message.split(" Hint")[0]


def test_missing_solution_file_is_explained(tmp_path):
    session = GradingSession(tmp_path, seed=0)
    with pytest.raises(CheckFailed, match="does not exist"):
        session.load(KATA)


def test_cost_counter_counts_ops_and_fresh_bytes():
    x = torch.randn(8, 8)
    cost = count_cost(lambda t: (t * 2 + 1).view(64), (x,))
    assert cost.aten_ops == 3  # mul, add, view
    assert cost.bytes_written == 2 * 64 * 4  # the view writes nothing


def run_pytest(*args, env=None):
    return subprocess.run([sys.executable, "-m", "pytest", f"katas/{KATA}", "-p", "no:cacheprovider", *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, env={**os.environ, **(env or {})})


def test_kata_tests_grade_the_tree_given_by_option_or_environment():
    by_option = run_pytest("--solutions", "reference", "--seed", "3", "-k", "L1 or L4")
    assert by_option.returncode == 0, by_option.stdout
    assert "grading seed 3" in by_option.stdout and "points per level" in by_option.stdout
    assert "L4 hidden   5/5" in by_option.stdout
    by_env = run_pytest("--seed", "3", "-k", "L1", env={"KATA_SOLUTIONS": "reference"})
    assert by_env.returncode == 0, by_env.stdout


def test_kata_tests_fail_the_stub_with_level_ids_and_sentences():
    proc = run_pytest("--seed", "3", "--no-speed")
    assert proc.returncode == 1
    assert "test_L2_exact[depthwise]" in proc.stdout and "still the stub" in proc.stdout
    assert "0.0 / 100.0" in proc.stdout and "Traceback" not in proc.stdout


def test_a_hanging_pass_times_out_twice_then_the_rest_fail_at_once(tmp_path):
    (tmp_path / KATA).mkdir()
    (tmp_path / KATA / "solution.py").write_text("def fuse_conv_bn(gm):\n    while True:\n        pass\n")
    records = tmp_path / "records.json"
    proc = run_pytest("--solutions", str(tmp_path), "--seed", "0", "--no-speed", "-k", "L1 or L2",
                      "--check-timeout", "2", "--results-json", str(records))
    assert proc.returncode == 1
    messages = [r["message"] for r in json.loads(records.read_text())["results"]]
    timed_out = [m for m in messages if m.startswith("timed out")]
    assert timed_out == ["timed out: the check did not finish within 2.0 s; does the pass loop forever on this model?"] * 2
    assert messages[-1] == "not run: 2 earlier checks of 03_conv_bn timed out."
    assert "03_conv_bn test_L1_pattern[single_pair]: timed out: the check did not finish within 2.0 s" in proc.stdout


def test_a_run_that_grades_no_kata_is_not_failed_by_the_runtime_guard(tmp_path):
    # The project's own tests change the graders' state (a zygote started in process sets Zygote._current); with
    # the plugin's guard counting that as tampering, `pytest -p no:xdist tests/test_cheats.py` exited 1 with every
    # test passed. Tampering in a run that grades katas is still disqualified (tests/test_score.py).
    (tmp_path / "test_state.py").write_text(
        "from graders.batch.zygote import Zygote\n\n\ndef test_sets_grader_state():\n    Zygote._current = object()\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                           "-p", "graders.learner.pytest_plugin", str(tmp_path / "test_state.py")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout + proc.stderr
