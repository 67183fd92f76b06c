"""Grading processes forked from a warm one: a zygote process, started once by the process that grades (a
fleet worker), imports torch, pytest and the graders, then forks each grading process on request instead
of a new interpreter importing them all again.

A grading process started with `python -m pytest` spends about 2 s of CPU importing torch, pytest and the
graders before it grades anything: as long as grading one kata's correctness levels. The fleet grades one
job per (team, kata), so that import would be paid once per kata; forked, a grading process starts in a
few hundredths of a second. The zygote imports only the graders' own modules, never a solution (solution
code runs only in the sandboxed worker processes the judge starts, as before), and holds no seed and no
team's data: every grading process starts from the same clean state.

(Python's multiprocessing forkserver does the same, but runs the parent's __main__ again in every child:
score.py, or the whole `dask worker` command line, in every grading process.)

A forked grading process runs what `python -m pytest ARGS` runs, with what run_katas gives a subprocess:
a session of its own (its process group is killed as one), its output in a file, the address-space cap,
the environment it would have been given, and death with the zygote, which exits when the process that
started it closes its pipe (or dies), or when it has forked nothing and has no child for IDLE_SECONDS
(about 650 MB of torch and graders a fleet machine should not keep for a run long over; the next request
starts a new one, and a request that meets a zygote on its way out is made again of the new one). A client
whose gradings come minutes apart and should each start at once (watch mode) keeps its zygotes warm instead
(keep_warm). Ctrl-C in a terminal reaches the client alone: the zygote ignores SIGINT (it ends with its client),
and each grading process leads a session of its own.
Thread pools: torch creates its own lazily, so the zygote has none to lose; each grading process sets its
own (OMP_NUM_THREADS, torch.set_num_threads).

The torch internals that katas 10-13 import on first use (graders/isolation/torch_private.py,
FIRST_USE_MODULES: Dynamo, Inductor's decompositions and pattern matcher; 1.2 s of CPU for Dynamo, 2.9 s in
all) are loaded at the first request that names such a kata, once for every grading process forked after it;
a zygote that grades other katas only never pays for them.

Protocol, a JSON line each way: the client sends {"args", "output", "env", "memory", "device", "katas" (those
the process will grade)}; the zygote answers
{"pid"} for each request in order and {"exited", "status"} as each grading process ends (status as
subprocess reports it: the exit code, or minus the signal that killed it).

May import: graders.frame; it names, without importing them, the modules a grading process imports
(graders.learner.pytest_plugin and what it imports, graders.isolation.torch_private's FIRST_USE_MODULES) for
the zygote to load.
"""
from __future__ import annotations

import gc
import importlib
import json
import math
import os
import queue
import selectors
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from graders.frame.catalogue import KATAS, REPO_ROOT, grader_module_name, imports_torch_internals
from graders.frame.lifetimes import cap_memory, die_with_parent, fork_safe_cuda, kill_group
from graders.frame.machinelock import MachineLock, default_path

# A zygote with no child that has been asked for nothing this long exits (FX_KATAS_ZYGOTE_IDLE to change it).
IDLE_SECONDS = float(os.environ.get("FX_KATAS_ZYGOTE_IDLE", "300"))

# What every grading process imports before it grades: loaded once, in the zygote.
PRELOAD = ["torch", "torch.fx", "torch.utils.benchmark", "pytest", "tabulate", "cloudpickle",
           "graders.learner.pytest_plugin", "graders.run", "graders.isolation.worker",
           *[grader_module_name(kata) for kata in KATAS]]


# --- the zygote process -------------------------------------------------------------------------------

def _warm_up() -> None:
    """Pay once what every grading process would pay on its own: torch's lazy first uses. The first
    torch.testing.assert_close imports torch.distributed.tensor (to check for DTensors) and with it
    torch.fx.experimental.symbolic_shapes and sympy: 1.4 s of CPU, in every forked grading process, as
    long as the grading of a kata's correctness levels itself."""
    import torch

    torch.testing.assert_close(torch.zeros(2), torch.zeros(2))


def _grading_process(request: dict) -> None:
    """In the forked child: become what `python -m pytest ARGS` would be, run it, exit with its status."""
    code = 70
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a started process (the zygote ignores it)
        os.setsid()  # a session of its own: the judge kills its process group as one
        die_with_parent()  # with the zygote
        cap_memory(request["memory"], request["device"])
        fd = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # not the zygote's request pipe
        os.close(null)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(REPO_ROOT)
        sys.argv = [sys.executable, "-m", "pytest", *request["args"]]
        import pytest
        import torch

        if os.environ.get("OMP_NUM_THREADS"):
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        code = int(pytest.main(request["args"]))
    except BaseException as exc:  # noqa: BLE001 - whatever happens, the child never returns into the zygote's loop
        print(f"the grading process failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _load(names, then=lambda: None) -> None:
    """Import `names` (and run `then`) holding the machine lock shared: loading is grading work too, held off any
    timing on this machine. Everything loaded so far lives as long as every grading process: out of the garbage
    collector's sight (gc.freeze, as the gc docs advise before forking), a full collection in a grading process
    (pytest runs two per session) takes milliseconds instead of 0.1 s each, and leaves the shared pages alone."""
    lock = MachineLock(default_path())
    with lock.hold(exclusive=False):
        for name in names:
            importlib.import_module(name)
        then()
    lock.close()  # its children must not inherit a hold
    gc.freeze()


def serve() -> None:
    """The zygote's loop: fork a grading process per request line on stdin, report pids and exits on stdout."""
    # Ctrl-C in the client's terminal reaches its whole process group, this zygote with it: the client decides
    # (it ends, and closing its pipe ends us), not a KeyboardInterrupt traceback on the learner's screen.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fork_safe_cuda()  # before anything asks torch about CUDA: its children may use it
    out = os.fdopen(os.dup(1), "w")  # the replies' pipe: whatever else prints goes to stderr
    os.dup2(2, 1)
    _load(PRELOAD, then=_warm_up)
    torch_internals_loaded = False
    requests = os.fdopen(sys.stdin.fileno(), "rb", buffering=0)
    selector = selectors.DefaultSelector()
    selector.register(requests, selectors.EVENT_READ)
    pending = b""
    children: set[int] = set()
    quiet_since = time.monotonic()

    def say(message: dict) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    while True:
        ready = selector.select(timeout=0.1)
        if not ready and not children and time.monotonic() - quiet_since > IDLE_SECONDS:
            os._exit(0)  # idle: the client starts another when it needs one (Zygote.get)
        if ready:
            chunk = os.read(requests.fileno(), 65536)
            if not chunk:  # the client is gone: so are we, and our children with us (their death signal)
                os._exit(0)
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                if not torch_internals_loaded and imports_torch_internals(request.get("katas", ())):
                    # Paid here once instead of in each grading process of katas 10-13 (1.2-3 s of CPU each).
                    _load(importlib.import_module("graders.isolation.torch_private").FIRST_USE_MODULES)
                    torch_internals_loaded = True
                pid = os.fork()
                if pid == 0:
                    _grading_process(request)
                children.add(pid)
                say({"pid": pid})
                quiet_since = time.monotonic()
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                say({"exited": pid, "status": os.waitstatus_to_exitcode(status)})
                quiet_since = time.monotonic()


# --- the client, in the process that grades -------------------------------------------------------------

class Zygote:
    """The client's handle on its zygote: started on first use, again if it died."""

    _lock = threading.Lock()
    _current: "Zygote | None" = None
    idle: float | None = None  # seconds its zygotes wait for a request before they exit (None: IDLE_SECONDS)

    def __init__(self):
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        if self.idle is not None:
            env["FX_KATAS_ZYGOTE_IDLE"] = str(self.idle)
        self.process = subprocess.Popen([sys.executable, "-m", "graders.batch.zygote"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, cwd=REPO_ROOT, env=env)
        self.pids: queue.Queue[int | None] = queue.Queue()
        self.exits: dict[int, int] = {}
        self.ended = threading.Event()
        self.changed = threading.Condition()
        threading.Thread(target=self._listen, daemon=True, name="fx-katas-zygote").start()

    def _listen(self) -> None:
        for line in self.process.stdout:
            message = json.loads(line)
            if "pid" in message:
                self.pids.put(message["pid"])
            else:
                with self.changed:
                    self.exits[message["exited"]] = message["status"]
                    self.changed.notify_all()
        with self.changed:  # the zygote died: its grading processes died with it
            self.ended.set()
            self.changed.notify_all()
        self.pids.put(None)

    @classmethod
    def get(cls) -> "Zygote":
        with cls._lock:
            if cls._current is None or cls._current.ended.is_set():
                cls._current = cls()
            return cls._current

    def fork(self, request: dict) -> int:
        with self._lock:  # one request at a time: each answer (or the one None of its ending) is its own
            if self.ended.is_set():
                raise ZygoteEnded("the zygote process had ended")
            try:
                self.process.stdin.write((json.dumps(request) + "\n").encode())
                self.process.stdin.flush()
            except (BrokenPipeError, ValueError):  # it ended (idle, or killed): the listener says None
                pass
            pid = self.pids.get()
        if pid is None:
            raise ZygoteEnded("the zygote process ended before it forked the grading process")
        return pid


def keep_warm(idle: float = math.inf) -> None:
    """The zygotes this process starts from now on wait `idle` seconds (by default for as long as this process
    lives) for their next request, not IDLE_SECONDS: for a client whose gradings come minutes apart and should
    each start at once, as a learner's saves in watch mode do. A client that stays with its zygote keeps its
    memory too (about 650 MB, shared with the grading processes it forks)."""
    Zygote.idle = idle


class ZygoteEnded(RuntimeError):
    """The zygote was gone (idle, or killed) before it forked the grading process asked for."""


class ForkedProcess:
    """A grading process forked by the zygote, with the surface of subprocess.Popen that run_katas uses."""

    def __init__(self, args: list[str], output: Path, env: dict[str, str], memory_gb: float, device: str = "cpu",
                 katas: list[str] = ()):
        request = {"args": args, "output": str(output), "env": env, "memory": int(memory_gb * 2**30), "device": device,
                   "katas": list(katas)}
        try:
            self.zygote = Zygote.get()
            self.pid = self.zygote.fork(request)
        except ZygoteEnded:  # met it on its way out (it exits when idle): once more, of a new one
            self.zygote = Zygote.get()
            self.pid = self.zygote.fork(request)

    @property
    def returncode(self) -> int | None:
        if self.pid in self.zygote.exits:
            return self.zygote.exits[self.pid]
        return -signal.SIGKILL if self.zygote.ended.is_set() else None

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        with self.zygote.changed:
            self.zygote.changed.wait_for(lambda: self.returncode is not None, timeout)
        return self.returncode

    def kill(self) -> None:
        """Kill its process group (it leads its own session: the judge and the workers it started)."""
        if self.returncode is None:
            kill_group(self.pid)


if __name__ == "__main__":
    serve()
