"""Every available kata: the reference gets full marks (speed level included), the stub gets zero."""
import pytest

from graders.run.session import grade
from graders.frame.catalogue import REPO_ROOT, available_katas

pytestmark = pytest.mark.locks_per_check  # grades in process: tests/conftest.py

KATAS = available_katas()


@pytest.mark.timing
@pytest.mark.parametrize("kata", KATAS)
def test_reference_gets_full_marks(kata):
    results = grade(kata, REPO_ROOT / "reference", seed=0)
    failures = [f"{r.test_id}: {r.message}" for r in results if not r.passed]
    assert not failures, "\n".join(failures)
    assert sum(r.points for r in results) == pytest.approx(100.0)


@pytest.mark.parametrize("kata", KATAS)
def test_reference_passes_with_another_seed(kata):
    results = grade(kata, REPO_ROOT / "reference", seed=12345, levels=(2, 4))
    assert all(r.passed for r in results), [f"{r.test_id}: {r.message}" for r in results if not r.passed]


@pytest.mark.parametrize("kata", KATAS)
def test_stub_gets_zero_with_readable_reasons(kata):
    results = grade(kata, REPO_ROOT / "katas", seed=0, speed=False)
    assert sum(r.points for r in results) == 0
    for r in results:
        if not r.skipped:
            assert "still the stub" in r.message and "TODO(human)" in r.message, f"{r.test_id}: {r.message}"
