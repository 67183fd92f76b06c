"""Kata 13 graded isolated: its ATen graphs reach the worker without their fake tensors (no pickler carries one)
and the worker makes them again (graders/isolation/channel.py; tests/test_worker.py shows the same fake values
arrive); the worker's meta['val'] comes back as text in the records, which the verdict reads as it reads the fake
tensors in process, and the guards the pass added beside them, measured in the worker around the call."""
from graders.frame.catalogue import REPO_ROOT, load_grader
from graders.run.session import grade


def test_the_reference_earns_the_same_verdicts_isolated():
    results = grade("13_sdpa_pattern", REPO_ROOT / "reference", seed=0, levels=(1, 2), isolate=True)
    assert [r.test_id for r in results] == [c.test_id for level in (1, 2) for c in load_grader("13_sdpa_pattern").checks_at(level)]
    assert all(r.passed for r in results), [(r.test_id, r.message[:300]) for r in results if not r.passed]
