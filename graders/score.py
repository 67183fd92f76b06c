"""Grade a solution tree kata by kata, print the table, and regenerate LEADERBOARD.md.

    uv run graders/score.py                                   # grade your work in katas/
    uv run graders/score.py --solutions reference --kata 03_conv_bn
    uv run graders/score.py --solutions ../team_a --team team_a   # store the run for the leaderboard

Each kata is graded in its own pytest subprocess (the kata's test file, with --solutions pointing at
the tree), so a crash or a hang in one kata costs that kata only.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from tabulate import tabulate

from graders.core import LEVELS, CheckResult, level_points, resolve_seed
from graders.katas import KATAS, REPO_ROOT, is_available
from graders.leaderboard import SCHEMA, locked, regenerate, store_run


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--solutions", type=Path, default=REPO_ROOT / "katas", metavar="DIR",
                        help="solution tree to grade: DIR/<kata>/solution.py (default: katas/)")
    parser.add_argument("--kata", action="append", choices=list(KATAS), metavar="KATA",
                        help="grade only this kata (repeatable), e.g. --kata 03_conv_bn")
    parser.add_argument("--team", help="store this run as the team's and regenerate the leaderboard")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the run's raw results to FILE")
    parser.add_argument("--no-speed", action="store_true", help="skip the speed levels (L3)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads while timing (default 1)")
    parser.add_argument("--seed", type=int, help="grading seed (default: random, printed)")
    parser.add_argument("--kata-timeout", type=float, default=900.0, metavar="S",
                        help="seconds one kata may take in all before it is stopped (default 900)")
    parser.add_argument("--kata-memory", type=float, default=8.0, metavar="GB",
                        help="address space one kata's grading process may use (default 8 GiB)")
    parser.add_argument("--results-dir", type=Path, default=REPO_ROOT / "results", help=argparse.SUPPRESS)
    parser.add_argument("--leaderboard", type=Path, default=REPO_ROOT / "LEADERBOARD.md", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.solutions.is_dir():
        parser.error(f"--solutions {args.solutions}: no such folder")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device on this machine")
    return args


def solutions_hash(tree: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(tree.glob("*/solution.py")):
        digest.update(path.relative_to(tree).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def summarise(kata: str, results: list[CheckResult]) -> dict:
    points = level_points(results)
    failures = [r for r in results if not r.passed and not r.skipped]
    speed = next((r.figures["speedup"] for r in results if r.level == 3 and "speedup" in r.figures), None)
    if not failures:
        message = "full marks" if not any(r.skipped for r in results) else "all checks that ran passed"
    elif all("still the stub" in r.message for r in failures):
        message = "not started: solution.py is still the stub"
    else:
        message = f"{failures[0].test_id}: {failures[0].message.splitlines()[0]}"
    return {"status": "graded", "points": sum(e for e, _ in points.values()), "max_points": 100.0,
            "levels": {str(level): list(p) for level, p in points.items()}, "speedup": speed,
            "message": message, "checks": [r.to_dict() for r in results]}


def failed_grading(status: str, message: str) -> dict:
    return {"status": status, "points": 0.0, "max_points": 100.0, "levels": {}, "speedup": None,
            "message": message, "checks": []}


def memory_cap(gigabytes: float):
    """A preexec hook: a solution that allocates without bound gets a MemoryError, not the machine."""
    limit = int(gigabytes * 2**30)
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def grade_kata(kata: str, args: argparse.Namespace, seed: int) -> dict:
    test_file = REPO_ROOT / "katas" / kata / f"test_{kata}.py"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "results.json"
        command = [sys.executable, "-m", "pytest", str(test_file), "-q", "-p", "no:cacheprovider",
                   "--solutions", str(args.solutions.resolve()), "--seed", str(seed), "--device", args.device,
                   "--threads", str(args.threads), "--results-json", str(out)] + (["--no-speed"] if args.no_speed else [])
        try:
            proc = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=args.kata_timeout,
                                  preexec_fn=memory_cap(args.kata_memory))
        except subprocess.TimeoutExpired:
            return failed_grading("timed out", f"grading did not finish within {args.kata_timeout:.0f}s; "
                                                f"run `uv run pytest katas/{kata}` to see which check hangs.")
        results = [CheckResult.from_dict(d) for d in json.loads(out.read_text())["results"]] if out.exists() else []
        if not results:
            tail = (proc.stdout + proc.stderr).strip().splitlines()
            return failed_grading("crashed", f"grading stopped before any check ran: {tail[-1] if tail else 'no output'}")
    return summarise(kata, results)


def level_cell(kata_result: dict, level: int) -> str:
    earned, possible = kata_result["levels"].get(str(level), (0.0, LEVELS[level].points))
    return f"{earned:.0f}/{possible:.0f}" if possible else "-"


def print_table(katas: dict[str, dict], total: float, possible: float) -> None:
    rows = []
    for kata, r in katas.items():
        if r["status"] == "not available":
            rows.append([kata, *["" for _ in LEVELS], "", "", "not yet available"])
            continue
        speed = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
        status = r["message"] if len(r["message"]) <= 100 else r["message"][:97] + "..."
        rows.append([kata, *[level_cell(r, level) for level in LEVELS], f"{r['points']:.1f}", speed, status])
    rows.append(["total", *["" for _ in LEVELS], f"{total:.1f}/{possible:.0f}", "", ""])
    headers = ["kata", *[f"L{n} {lv.name}" for n, lv in LEVELS.items()], "points", "speedup", "status"]
    print(tabulate(rows, headers=headers))


def next_step(katas: dict[str, dict], args: argparse.Namespace) -> str | None:
    todo = next((k for k, r in katas.items() if r["status"] != "not available" and r["points"] < 100), None)
    if todo is None:
        return None
    folder = args.solutions / todo
    try:
        folder = folder.resolve().relative_to(Path.cwd())
    except ValueError:
        pass
    where = f"edit {folder}/solution.py"
    if args.solutions.resolve() == (REPO_ROOT / "katas").resolve():
        where = f"read katas/{todo}/README.md, {where}"
    return f"Next: kata {todo} ({KATAS[todo]}): {where}, then run `uv run pytest katas/{todo}` to see every check."


def main(argv=None) -> int:
    args = parse_args(argv)
    seed = resolve_seed(args.seed)
    selected = args.kata or list(KATAS)
    print(f"Grading {args.solutions} on {args.device} with seed {seed} (reproduce with --seed {seed}).", flush=True)
    katas: dict[str, dict] = {}
    for index, kata in enumerate(selected, 1):
        if not is_available(kata):
            katas[kata] = failed_grading("not available", "not yet available")
            continue
        started = time.monotonic()
        print(f"[{index}/{len(selected)}] {kata} ...", end=" ", file=sys.stderr, flush=True)
        katas[kata] = grade_kata(kata, args, seed)
        print(f"{katas[kata]['points']:.1f} points in {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)

    graded = [r for r in katas.values() if r["status"] != "not available"]
    total, possible = sum(r["points"] for r in graded), 100.0 * len(graded)
    print_table(katas, total, possible)

    run = {"schema": SCHEMA, "team": args.team or "", "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "seed": seed, "device": args.device, "device_name": device_name(args.device), "threads": args.threads,
           "speed": not args.no_speed, "torch": torch.__version__, "python": platform.python_version(),
           "solutions": str(args.solutions.resolve()), "solutions_hash": solutions_hash(args.solutions),
           "total_points": total, "possible_points": possible, "katas": katas}
    if args.json:
        args.json.write_text(json.dumps(run, indent=1))
    with locked(args.results_dir):
        if args.team:
            print(f"Stored the run as {store_run(args.results_dir, run)}.")
        for problem in regenerate(args.results_dir, args.leaderboard):
            print(f"warning: {problem}", file=sys.stderr)
    print(f"Wrote {args.leaderboard}.")
    hint = next_step(katas, args)
    if hint:
        print(hint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
