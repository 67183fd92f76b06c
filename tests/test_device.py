"""Grading on CUDA works and is honest: full float32 on both sides, a speed threshold never measured on the
device is a provisional verdict (said so in the check's figures and message, the summary, the score table, the
pytest summary and the run record), the memory cap is one CUDA can start under, sandboxed workers reach the
GPU's driver, and a zoo model that cannot run on a GPU is graded on the CPU and says so.

These tests run on a CPU. Where they need a CUDA session and the machine has no GPU, they make torch report
one (`cuda_session`): a GradingSession on "cuda" only places models on the device, and the checks graded
here are fakes that build no model, so nothing reaches a GPU. On a machine with a GPU the real device is used.
"""
from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import pytest
import torch

from graders.batch.summary import summarise
from graders.competition.organiser import precision_fields
from graders.frame.catalogue import KATAS, REPO_ROOT, load_grader
from graders.frame.kata import Check, Kata
from graders.frame.levels import CheckFailed
from graders.isolation import precision
from graders.learner.pytest_plugin import speed_lines
from graders.learner.report import print_table, provisional_note
from graders.run.session import GradingSession, grade

sys.path.insert(0, str(REPO_ROOT / "bench"))
import calibrate  # noqa: E402  (bench/calibrate.py)
from speed_fidelity import Readings  # noqa: E402

KATA = "03_conv_bn"
TF32_ON = {"cuda_matmul_allow_tf32": True, "cudnn_allow_tf32": True, "float32_matmul_precision": "high"}


@pytest.fixture
def tf32_on():
    """The process starts with TF32 allowed everywhere (as a user's script might leave it); put back after."""
    before = precision.apply(TF32_ON)
    yield
    precision.apply(before)


@pytest.fixture
def cuda_session(monkeypatch):
    """Make GradingSession(device="cuda"). Without a GPU, torch is made to report one: a fake, for sessions whose
    checks build nothing on the device."""
    if not torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    sessions = []

    def make(**options):
        sessions.append(GradingSession(REPO_ROOT / "reference", device="cuda", seed=1, **options))
        return sessions[-1]

    yield make
    for session in sessions:
        session.close()


@pytest.fixture
def uncalibrated(monkeypatch):
    """KATA's CUDA threshold as if never measured on a GPU (it was, on 2026-11-27: docs/grading.md)."""
    monkeypatch.delitem(load_grader(KATA).calibrated, "cuda", raising=False)


def fake_check(level: int, run, kata: str = KATA) -> Check:
    """A check of `kata` at `level` that runs `run(ctx)` instead of grading a model."""
    return Check(kata, level, "fake", run)


# --- full float32 -------------------------------------------------------------------------------------------


def test_a_cuda_session_holds_full_float32_for_its_lifetime(tf32_on, cuda_session):
    """Fake CUDA without a GPU (see the module's docstring): the flags are process settings, set without a device."""
    seen = {}
    session = cuda_session()
    assert precision.settings() == precision.FULL_FLOAT32
    result = session.run(fake_check(1, lambda ctx: seen.update(precision.settings())))
    assert result.passed and seen == precision.FULL_FLOAT32
    session.close()
    assert precision.settings() == TF32_ON  # what the process had before


def test_overlapping_sessions_restore_the_settings_once_the_last_closes(tf32_on, cuda_session):
    """Fake CUDA without a GPU (see the module's docstring)."""
    first, second = cuda_session(), cuda_session()
    first.close()
    assert precision.is_full()  # the second still grades
    second.close()
    assert precision.settings() == TF32_ON


def test_a_cpu_session_leaves_the_settings_alone(tf32_on):
    GradingSession(REPO_ROOT / "reference", device="cpu").close()
    assert precision.settings() == TF32_ON


def test_a_check_that_turns_tf32_on_fails_and_the_next_starts_in_full_float32(cuda_session):
    """Fake CUDA without a GPU (see the module's docstring). In process, a learner's pass could set TF32 itself."""
    session = cuda_session()

    def turns_tf32_on(ctx):
        torch.backends.cuda.matmul.allow_tf32 = True

    result = session.run(fake_check(1, turns_tf32_on))
    assert not result.passed and "float32 precision changed" in result.message
    assert precision.is_full()


def test_the_worker_runs_the_pass_in_full_float32(tmp_path):
    """Isolated grading: the learner's pass runs in the worker process, which sets full float32 before it loads
    the solution (on any device: on a CPU these are torch's defaults, except cuDNN's flag, which a fresh
    process has on). The pass reports the worker's settings in the one sentence that comes back: an exception."""
    (tmp_path / KATA).mkdir()
    (tmp_path / KATA / "solution.py").write_text(
        "import torch\n\n\ndef fuse_conv_bn(gm):\n"
        "    raise RuntimeError(f'tf32 matmul={torch.backends.cuda.matmul.allow_tf32} '\n"
        "                       f'cudnn={torch.backends.cudnn.allow_tf32} '\n"
        "                       f'precision={torch.get_float32_matmul_precision()}')\n")
    results = grade(KATA, tmp_path, levels=(1,), isolate=True, seed=0)
    message = next(r.message for r in results if r.check == "single_pair")
    assert "tf32 matmul=False cudnn=False precision=highest" in message, message


# --- provisional thresholds -----------------------------------------------------------------------------------


def manifest(speed: dict) -> dict:
    return {"title": "a kata", "api": {}, "speed": speed}


def test_a_threshold_without_a_calibration_record_is_provisional():
    kata = Kata("99_made_up", manifest({"threshold": {"cpu": 1.5, "cuda": 1.2},
                                        "calibrated": {"cpu": "some CPU, 2026-11-25, 20 gradings"}}))
    assert kata.provisional("cpu") is None
    assert "has not been calibrated on a GPU" in kata.provisional("cuda")
    assert Kata("99_made_up", manifest({"threshold": {"cpu": 1.5}})).provisional("cpu")
    # No time threshold on a device (08 on CUDA: the exact traffic count alone): nothing is provisional there.
    assert Kata("99_made_up", manifest({"threshold": {"cpu": 1.5}})).provisional("cuda") is None
    assert load_grader("08_elementwise_chains").provisional("cuda") is None


def test_every_manifest_says_which_thresholds_were_measured_on_what_and_when():
    for name in KATAS:
        grader = load_grader(name)
        if grader.thresholds:  # (kata 12's speed level is an exact count alone: no clock, nothing to calibrate)
            assert "cpu" in grader.calibrated, name  # measured by bench/speed_fidelity.py (docs/grading.md, Grading speed)
        assert set(grader.calibrated) <= set(grader.thresholds), name
        for device, record in grader.calibrated.items():
            what, when, how_many = record.rsplit(", ", 2)
            assert what and datetime.date.fromisoformat(when) and how_many.endswith(" gradings"), (name, record)


def speed_figures(**more) -> dict:
    return {"speedup": 1.5, "speedup_low": 1.4, "speedup_high": 1.6, "threshold": 1.2, "rounds": 3,
            "aten_ops_before": 4, "aten_ops_after": 2, "bytes_written_before": 100, "bytes_written_after": 50, **more}


def test_a_cuda_speed_verdict_is_provisional_until_calibrated(cuda_session, uncalibrated, monkeypatch):
    """Fake CUDA without a GPU (see the module's docstring); the fake L3 check returns figures instead of timing."""
    session = cuda_session()
    passed = session.run(fake_check(3, lambda ctx: speed_figures()))
    assert passed.passed and passed.figures["provisional"] is True
    assert "not been calibrated on a GPU" in passed.message

    def falls_short(ctx):
        raise CheckFailed("the rewrite is 1.10x against the traced original; this level needs at least 1.20x.\nmore",
                          speed_figures(speedup=1.1))

    failed = session.run(fake_check(3, falls_short))
    assert not failed.passed and failed.figures["provisional"] is True
    assert failed.message.splitlines()[0].endswith("(bench/calibrate.py --device cuda))")  # tables show line one

    monkeypatch.setitem(load_grader(KATA).calibrated, "cuda", "NVIDIA H100, 2026-11-26, 20 gradings")
    calibrated = session.run(fake_check(3, lambda ctx: speed_figures()))
    assert "provisional" not in calibrated.figures and calibrated.message == "ok"


def test_a_cpu_speed_verdict_is_measured_and_other_levels_are_never_provisional(monkeypatch):
    session = GradingSession(REPO_ROOT / "reference", device="cpu", seed=1)
    assert "provisional" not in session.run(fake_check(3, lambda ctx: speed_figures())).figures
    monkeypatch.delitem(load_grader(KATA).calibrated, "cpu")
    assert session.run(fake_check(3, lambda ctx: speed_figures())).figures["provisional"] is True
    assert "provisional" not in session.run(fake_check(1, lambda ctx: {})).figures
    skipped = GradingSession(REPO_ROOT / "reference", device="cpu", speed=False).run(fake_check(3, lambda ctx: {}))
    assert skipped.skipped and "provisional" not in skipped.message


def test_the_table_the_pytest_summary_and_the_run_record_say_provisional(cuda_session, uncalibrated, capsys):
    """Fake CUDA without a GPU (see the module's docstring)."""
    session = cuda_session()
    results = [session.run(fake_check(3, lambda ctx: speed_figures())), session.run(fake_check(1, lambda ctx: {}))]
    summary = summarise(KATA, results)
    assert summary["speed_provisional"] is True
    katas = {KATA: summary, "04_dce": {**summary, "speed_provisional": False}}
    print_table(katas, 200.0, 200.0)
    table = capsys.readouterr().out
    assert "1.50x provisional" in table and provisional_note(katas) in table and "04_dce" not in provisional_note(katas)
    lines = speed_lines(KATA, results, "cuda")
    assert "needs 1.20x, provisional" in lines[0] and "not been calibrated" in lines[-1]
    fields = precision_fields("cuda", katas)
    assert fields == {"float32": precision.NOTE, "speed_provisional": [KATA]}
    on_cpu = [GradingSession(REPO_ROOT / "reference").run(fake_check(3, lambda ctx: speed_figures()))]
    measured = summarise(KATA, on_cpu)
    assert measured["speed_provisional"] is False and provisional_note({KATA: measured}) is None
    assert ["provisional" in line for line in speed_lines(KATA, on_cpu, "cpu")] == [False]
    assert precision_fields("cpu", {KATA: measured})["speed_provisional"] == []


# --- bench/calibrate.py -----------------------------------------------------------------------------------------


def readings(reference, no_op=(), n=5, has_no_op=True) -> Readings:
    return Readings("03_conv_bn", "cuda", n, list(reference), list(no_op), has_no_op)


def test_a_proposal_clears_the_reference_by_the_margin_and_the_no_op_by_the_headroom():
    proposal = calibrate.propose(readings([1.8, 1.9, 2.0], [0.98, 1.0, 1.03]))
    assert proposal.threshold == 1.5 and proposal.margin == pytest.approx(0.2) and proposal.note == ""
    assert proposal.headroom == pytest.approx(1.5 / 1.03 - 1)
    thin = calibrate.propose(readings([1.25, 1.3], [1.0, 1.02]))  # 1.25 / 1.2 = 1.04 < 1.02 * 1.1
    assert thin.threshold == 1.15 and thin.note.startswith("thin")
    assert calibrate.propose(readings([1.05, 1.1], [1.0, 1.02])).threshold is None  # overlapping: no threshold
    on_bytes = calibrate.propose(readings([1.02, 1.05], [], n=2))  # the no-op failed on bytes twice
    assert on_bytes.threshold == 0.85 and "byte count" in on_bytes.note
    assert calibrate.propose(readings([])).threshold is None


def test_write_changes_only_the_speed_records_of_a_manifest():
    path = REPO_ROOT / "graders" / "katas" / "kata_10_verify_harness" / "kata.toml"
    text = path.read_text()
    record = calibrate.calibration_record("cpu", 20, datetime.date(2026, 11, 26))
    assert record.endswith(", 2026-11-26, 20 gradings")
    updated = calibrate.updated_manifest(text, "cuda", 2.1, record)
    changed = [(a, b) for a, b in zip(text.splitlines(), updated.splitlines()) if a != b]
    assert len(text.splitlines()) == len(updated.splitlines()) and len(changed) == 2
    assert changed[0][1].startswith("threshold = { cpu = 2.0, cuda = 2.1 }  # the dead-code pass")
    assert changed[1][1].startswith('calibrated = { cpu = "AMD EPYC') and f'cuda = "{record}" }}  #' in changed[1][1]
    bare = text.replace(next(line for line in text.splitlines(keepends=True) if line.startswith("calibrated")), "")
    inserted = calibrate.updated_manifest(bare, "cuda", 2.1, record)
    assert f'calibrated = {{ cuda = "{record}" }}' in inserted.splitlines()[inserted.splitlines().index(
        next(line for line in inserted.splitlines() if line.startswith("threshold"))) + 1]


def test_calibrate_writes_nothing_unless_asked(monkeypatch, capsys):
    """The grading itself is faked (`collect`): calibrate.py's own run on a CPU is a benchmark, not a test."""
    monkeypatch.setattr(calibrate, "collect", lambda kata, n, scratch, device: Readings(kata, device, n, [2.0] * n,
                                                                                         [1.0] * n, True))
    before = {name: (load_grader(name).thresholds, (REPO_ROOT / "graders/katas" / f"kata_{name}/kata.toml").read_text())
              for name in ("04_dce", "05_cse")}
    assert calibrate.main(["--device", "cpu", "-n", "2", "--kata", "04_dce", "--kata", "05_cse"]) == 0
    out = capsys.readouterr().out
    assert "1.65x" in out and "Nothing written" in out
    for name, (_, text) in before.items():
        assert (REPO_ROOT / "graders/katas" / f"kata_{name}/kata.toml").read_text() == text


# --- what lets CUDA run at all ------------------------------------------------------------------------------

CAPPED = """
import resource, sys
from graders.frame.lifetimes import cap_memory
cap_memory(6 * 2**30, sys.argv[1])
import torch
print(resource.getrlimit(resource.RLIMIT_AS)[0] == 6 * 2**30, resource.getrlimit(resource.RLIMIT_DATA)[0] == 6 * 2**30)
try:
    torch.empty(8 * 2**30, dtype=torch.uint8).fill_(1)
    print("allocated")
except RuntimeError:
    print("stopped")
"""


@pytest.mark.parametrize("device, address_space, data", [("cpu", True, False), ("cuda", False, True)])
def test_the_memory_cap_counts_what_cuda_can_start_under(device, address_space, data):
    """On the CPU the cap is the address space; on CUDA, whose driver reserves address space beyond any such
    cap (cudaGetDeviceCount: out of memory under 8 GiB of RLIMIT_AS, on an H100), the data segment. Either
    way a host allocation over the cap stops."""
    import subprocess

    out = subprocess.run([sys.executable, "-c", CAPPED, device], capture_output=True, text=True, cwd=REPO_ROOT,
                         env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert out.stdout.split() == [str(address_space), str(data), "stopped"], out.stderr[-2000:]


def test_a_sandboxed_worker_on_cuda_reads_the_driver_s_libraries(tmp_path, monkeypatch):
    """On "cuda" the sandbox binds the folders of LD_LIBRARY_PATH (where a container mounts the driver) and the
    GPU's device nodes; on "cpu" neither. A real bubblewrap sandbox where one runs."""
    import subprocess

    from graders.isolation.sandbox import bwrap, sandbox_arguments, starting_environment

    driver = tmp_path / "nvidia" / "lib64"
    driver.mkdir(parents=True)
    (driver / "libcuda.so.1").write_text("the driver")
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{driver}:{tmp_path / 'missing'}")
    cuda, cpu = sandbox_arguments([], "cuda"), sandbox_arguments([], "cpu")
    assert "/dev/nvidia" not in " ".join(cpu) and str(driver) not in cpu
    assert ["--setenv", "LD_LIBRARY_PATH", str(driver)] == cuda[cuda.index("LD_LIBRARY_PATH") - 1:][:3]
    import glob

    assert [cuda[i + 1] for i, a in enumerate(cuda) if a == "--dev-bind"] == sorted(glob.glob("/dev/nvidia*"))
    binary = bwrap()
    if binary is None:
        pytest.skip("no sandbox on this machine (bubblewrap cannot create namespaces)")
    look = ["sh", "-c", f'echo "$LD_LIBRARY_PATH"; cat {driver}/libcuda.so.1']
    inside = subprocess.run([binary, *cuda, *look], capture_output=True, text=True, env=starting_environment(True))
    assert inside.stdout.split("\n")[:2] == [str(driver), "the driver"], inside.stderr
    outside = subprocess.run([binary, *cpu, *look], capture_output=True, text=True, env=starting_environment(True))
    assert outside.returncode != 0 and "the driver" not in outside.stdout


def cpu_only_checks() -> list[Check]:
    return [check for name in KATAS for check in load_grader(name).checks  # a zoo's cases: no speed level (a clock)
            if getattr(check.run, "case", None) is not None and check.run.case.cpu_only and check.level != 3]


def test_a_zoo_model_that_cannot_run_on_a_gpu_is_graded_on_the_cpu_and_says_so(cuda_session):
    """Kata 02's integer product (CUDA has no int64 addmm), 06's hand-built constructors, 07's plain tensor
    attributes and every graph of 13 (what attention decomposes to depends on the device it is traced for): on a
    CUDA session their cases build, run and compare on the CPU. Their checks build real models, so without a GPU
    they would fail here if any tensor went to the (fake) CUDA device."""
    checks = cpu_only_checks()
    assert {check.kata for check in checks} == {"02_matmul_bias_relu", "06_constant_folding", "07_algebraic_simplify",
                                                "13_sdpa_pattern"}
    session = cuda_session()
    for check in checks:
        result = session.run(check)
        assert result.passed, (check.test_id, result.message)
        assert result.figures["graded_on"] == f"cpu: {check.run.case.cpu_only}"
    # On a CPU session the same cases say nothing of it: one check of each kata shows it (the figure is set in
    # one place for every case, graders/run/harness.py).
    on_cpu, one_each = GradingSession(REPO_ROOT / "reference", device="cpu", seed=1), {}
    for check in checks:
        one_each.setdefault(check.kata, check)
    assert all("graded_on" not in on_cpu.run(check).figures for check in one_each.values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: the fork poisoning it guards against is CUDA's")
def test_a_fleet_job_grades_on_cuda_in_processes_forked_warm():
    """Organiser mode's own path on a GPU: the job's grading process is forked by the zygote, its worker by the
    team's nursery, and neither parent may have asked the CUDA runtime anything first (fork_safe_cuda,
    graders/frame/lifetimes.py). On an H200 on 2026-11-27, before it, every check of every kata failed
    "Cannot re-initialize CUDA in forked subprocess": importing torch.utils.benchmark had asked."""
    from graders.competition.jobs import grade_job, make_job
    from graders.frame.levels import CheckResult

    files = {"04_dce/solution.py": (REPO_ROOT / "reference" / "04_dce" / "solution.py").read_bytes()}
    result = grade_job(make_job("ada", "04_dce", files, "correctness", 3, speed=False, device="cuda"))
    records = [CheckResult.from_dict(r) for r in result.get("records", [])]
    assert records and all(r.passed for r in records), result.get("failed") or [r.message for r in records if not r.passed]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: chapter 2's fake kernels and records on CUDA")
@pytest.mark.parametrize("kata", ["11_export_conv_bn", "12_reinplace", "13_sdpa_pattern"])
def test_chapter_2s_references_earn_every_correctness_point_on_cuda(kata):
    """On an H200 on 2026-11-27 (torch 2.11, chapter 2's gate lifted there) kata 11's reference lost points on CUDA
    alone: torch.export's conv strides and the fake convolution's layout with a bias (docs/grading.md, Proven on a
    GPU). Kata 13 was never graded on a GPU with the torch it needs (2.15): this is the first thing to run there."""
    from graders.isolation import torch_private

    if problem := torch_private.chapter_2_problem():
        pytest.skip(problem)
    session = GradingSession(REPO_ROOT / "reference", device="cuda", seed=3, speed=False)
    try:
        failed = [f"{check.name}: {result.message.splitlines()[0]}" for check in load_grader(kata).checks
                  if not (result := session.run(check)).passed and not result.skipped]
    finally:
        session.close()
    assert not failed, failed
