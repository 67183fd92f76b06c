"""How long the processes grading starts may live, and how much memory they may take: each dies with the
process that started it, a process that leads its own session is killed with everything it started, and
each is capped in memory by the one rule of `cap_memory`. And what lives as long as a process: `long_lived`
keeps what a block loads out of the cyclic garbage collector's sight, and `exit_now` ends a process without the
interpreter's teardown of it.

Used by the grading processes (graders/batch/processes.py, graders/batch/zygote.py) and the worker
processes and nurseries (graders/isolation/sandbox.py, graders/isolation/nursery.py); `exit_now` by a grading
process started on its own (graders/batch/pytest_process.py); `long_lived` by the
loading of a solution (graders/frame/solution.py) and chapter 2's first traces (graders/run/).

May import: the standard library only.
"""
from __future__ import annotations

import atexit
import gc
import os
import resource
import signal
import sys
import threading
from contextlib import contextmanager
from typing import NoReturn


def die_with_parent() -> None:
    """In a child: SIGKILL when the thread that started it ends (Linux's PR_SET_PDEATHSIG; elsewhere nothing)."""
    if sys.platform != "linux":
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def fork_safe_cuda() -> None:
    """In a process that forks children which may use CUDA (the zygote, a nursery): never poison their fork.

    Once a process has asked the CUDA runtime anything (torch.cuda.is_available() calls cudaGetDeviceCount,
    which initialises the driver), torch refuses CUDA in every child it forks: "Cannot re-initialize CUDA in
    forked subprocess". Importing torch.utils.benchmark asks it (torch.utils.cpp_extension looks for the CUDA
    toolkit and, where it finds one, calls is_available()), so on a GPU machine with the toolkit installed
    every check of a forked grading process failed so (organiser mode on an H200, 2026-11-27). Asked
    through NVML instead (PyTorch's PYTORCH_NVML_BASED_CUDA_CHECK, meant for this), the driver stays
    untouched and the children may use CUDA. Where NVML cannot answer (no driver), torch falls back to the
    runtime: a machine without a GPU has no CUDA to lose."""
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"


def exit_now(code: int) -> NoReturn:
    """End this process with `code` as the interpreter's own exit would, less its finalization: wait for the
    threads that are not daemons, run the atexit callbacks, flush stdout and stderr, then os._exit.

    What is skipped is the teardown of every module and object, which no grading process needs: its results are
    written and closed by then. It is what a process that imported torch spends most of its exit on, and it is
    not small. Measured on this project's 2-core machine (2026-11-29): `import torch`, then exit, 0.33 s more CPU
    than the same with os._exit; with Inductor's pattern matcher imported too, 1.5 s; a `python -m pytest`
    grading kata 04's reference, 0.8-1.3 s of its 5.5-6.8 s. The processes that fork (the zygote, a nursery)
    end their children with os._exit already, after flushing: a forked child must not run its parent's atexit
    callbacks. This is for a process started on its own."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    try:
        atexit._run_exitfuncs()  # logging's flush, tempfile's clean-ups (weakref.finalize), gc.unfreeze...
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):  # closed, replaced, or its reader gone
                pass
        os._exit(code)


def kill_group(pid: int) -> None:
    """SIGKILL the process group `pid` leads, and `pid` itself in case it has not made its own group yet."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def cap_memory(limit_bytes: int, device: str = "cpu") -> None:
    """In a child: a solution that allocates without bound gets a MemoryError, not the machine.

    On the CPU the cap is the address space (RLIMIT_AS: every mapping counts, shared ones too). A process that
    uses CUDA cannot live under such a cap: the driver reserves virtual address space for unified memory far
    beyond the card's memory, and under an 8 GiB RLIMIT_AS torch sees no device at all (cudaGetDeviceCount:
    "Error 2: out of memory", seen on an H100 on 2026-11-27, where 8 GiB of RLIMIT_DATA left CUDA working and
    still stopped a 12 GiB host allocation). So on "cuda" the cap is the data segment (RLIMIT_DATA: private
    writable mappings, that is the heap and every host tensor); shared mappings escape it there."""
    kind = resource.RLIMIT_DATA if device == "cuda" else resource.RLIMIT_AS
    resource.setrlimit(kind, (limit_bytes, limit_bytes))


# The names of the long_lived blocks: a process's first solution loaded, and its first ATen trace (make_fx,
# functionalize, torch.export: chapter 2's tracers, whichever comes first), which imports sympy and Dynamo.
FIRST_SOLUTION, FIRST_TRACE = "the first solution loaded", "the first ATen trace"
_long_lived: set[str] = set()  # the names of the long_lived blocks this process has run


@contextmanager
def long_lived(name: str):
    """Run a block that loads what lives as long as the process out of the cyclic garbage collector's way: the
    collector off while it runs, everything that exists after it frozen (gc.freeze), so that each full
    collection after walks only what came later. Only the first block of each `name` in a process does so,
    the later ones run as they are: a freeze also keeps whatever garbage is alive at that moment for good, so
    it happens at most twice a process (FIRST_SOLUTION, FIRST_TRACE), not once a test in a long-lived one.

    What it is for: imports made while grading. Kata 13's reference imports Inductor's pattern matcher, and
    the judge's first trace imports sympy and Dynamo: the heap grows from 220,000 objects to 580,000, and
    every full collection walked all of it again. In one process grading kata 13's reference (2026-11-28):
    eight full collections took 1.3-1.4 s of 13-14 s of CPU before; after, two during the grading took
    0.05-0.1 s. Where a forking process froze its heap already (the zygote, a nursery), its children start
    frozen and this freezes only what came since. At exit the frozen objects are handed back (gc.unfreeze)
    so that the interpreter's last collection finalises them, as it did before (0.4-0.6 s): left frozen,
    Triton's bindings (imported with Inductor) print that their objects leaked."""
    if name in _long_lived:
        yield
        return
    if not _long_lived:  # the process's first freeze
        atexit.register(gc.unfreeze)
    _long_lived.add(name)
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
        gc.freeze()
