"""The judge's handle on a worker process, the only process where a solution's code runs when grading is
isolated (--isolate, and always in organiser mode): starting it (in the sandbox where one can run),
asking it to call a learner function, and rebuilding what it answers.

The judge (the grading session: graders/run/session.py) never imports the solution. For each call of a
learner function it sends the worker a request (the function's name, the arguments the grader built, and
the objects whose state it wants to see afterwards), pickled with cloudpickle: data the judge made, so the
worker may trust it (graders/isolation/channel.py). The worker (graders/isolation/serve.py) answers with
data only (graders/isolation/records/): modules as graph records and torch.nn modules loaded with
weights_only=True, tensors, numbers, strings, nodes by name. The judge rebuilds modules from those records
without the solution's code and runs every check, timing included, on what it rebuilt. Whatever a solution
does to its own process (patching torch, the timers, the grader's modules, hooks, caches keyed on inputs)
stays there. The sandbox and the limits around the worker: graders/isolation/sandbox.py.

May import: graders.frame, the rest of graders.isolation.
"""
from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from graders.frame.levels import CheckFailed
from graders.frame.solution import Called, missing_solution
from graders.isolation import records
from graders.isolation.channel import dumps_request, read_frame, write_frame
from graders.isolation.nursery import connect as nursery_connect
from graders.isolation.sandbox import (Limits, bwrap, limited, sandbox_arguments, sandbox_problem,
                                       starting_environment)

__all__ = ["Channel", "Limits", "Worker", "WorkerFailed", "kill", "launch", "sandbox_problem"]


class WorkerFailed(Exception):
    """The worker died, overran its time, or sent something that is not a reply."""


@dataclass
class Channel:
    """The pipes to a running worker and its process, which leads its own process group; or the connection
    to a worker a nursery forked (graders/isolation/nursery.py), which dies when the connection closes."""

    pid: int | None
    to_worker: int
    from_worker: int
    process: subprocess.Popen | None
    connection: socket.socket | None = None


def launch(solution_path: Path, kata: str, *, threads: int = 1, limits: Limits = Limits()) -> Channel:
    """Start a worker for `solution_path` (sandboxed where bubblewrap runs); it says hello once it has
    imported the solution."""
    command = [sys.executable, "-m", "graders.isolation.serve", str(solution_path), kata, str(threads)]
    binary = bwrap()
    if binary is not None:
        command = [binary, *sandbox_arguments([solution_path.parent], limits.device), *command]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               cwd="/tmp" if os.path.isdir("/tmp") else None,
                               env=starting_environment(binary is not None), start_new_session=True,
                               close_fds=True, preexec_fn=limited(limits))
    return Channel(process.pid, process.stdin.fileno(), process.stdout.fileno(), process)


def from_nursery(nursery: Path, solution_path: Path, kata: str, *, threads: int = 1) -> Channel:
    """Ask the team's nursery for a worker for `solution_path`; it says hello once it has imported the solution."""
    connection = nursery_connect(nursery, solution_path, kata, threads)
    return Channel(None, connection.fileno(), connection.fileno(), None, connection)


def kill(channel: Channel) -> int | None:
    """Kill a worker's whole process group and close its pipes; its exit status (a nursery's worker: the
    nursery kills it when the connection closes; None)."""
    if channel.connection is not None:
        channel.connection.close()
        return None
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

    def __init__(self, solution_path: Path, kata: str, *, threads: int = 1, limits: Limits = Limits(),
                 nursery: Path | None = None):
        self.solution_path, self.kata, self.threads, self.limits = solution_path, kata, threads, limits
        self.nursery = nursery  # the socket of the team's nursery, which forks workers warm (the fleet)
        self._channel: Channel | None = None
        self.load_failure: str | None = None

    def start(self, timeout: float) -> None:
        """Start the worker; it imports the solution and says whether that worked."""
        if self.load_failure or self._channel is not None:
            return
        self.load_failure = missing_solution(self.solution_path)  # bubblewrap cannot bind a missing file
        if self.load_failure:
            return
        if self.nursery is not None:
            try:
                self._channel = from_nursery(self.nursery, self.solution_path, self.kata, threads=self.threads)
            except OSError as exc:
                raise WorkerFailed(f"the team's nursery at {self.nursery} did not answer ({exc})") from None
        else:
            self._channel = launch(self.solution_path, self.kata, threads=self.threads, limits=self.limits)
        try:
            # A little inside the check's own time-out, so that this sentence, not the check's, says why.
            hello = self._receive(time.monotonic() + 0.9 * timeout, "importing the solution")
        except WorkerFailed as failure:
            # A solution that hangs or kills its process while loading does so again: later checks of this
            # kata fail with this sentence at once instead of waiting out their own time-outs.
            self.load_failure = str(failure)
            raise
        if not hello.get("ok"):
            self.load_failure = str(hello.get("message"))

    def request(self, message: dict, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        self.start(timeout)
        if self.load_failure:
            return {"ok": False, "failure": "load", "message": self.load_failure}
        try:
            write_frame(self._channel.to_worker, dumps_request(message))
        except OSError:
            self.stop()
            raise WorkerFailed("the worker process ended before it was asked anything") from None
        return self._receive(deadline, f"{message.get('function') or message.get('name')}")

    def call(self, ctx, function: str, args: tuple, watch: tuple, kwargs: dict | None = None):
        """`Context.invoke` for an isolated solution: the call runs in the worker, its outcome is rebuilt here."""
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
            guards = reply.get("guards", [])
            if not (isinstance(guards, list) and all(isinstance(g, str) for g in guards)):
                raise records.RecordError("the guards the call added are not a list of text")
        except (records.RecordError, KeyError, TypeError) as exc:
            raise CheckFailed(f"{function} ran, but the judge cannot rebuild what the worker sent back: {exc}.") from None
        return Called(result, after, watched, str(reply.get("type")), list(guards))

    def defines(self, ctx, name: str) -> str:
        reply = self._ask(ctx, {"kind": "defines", "name": name})
        if not reply.get("ok"):
            raise CheckFailed(str(reply.get("message")))
        return str(reply.get("kind"))

    def _ask(self, ctx, message: dict) -> dict:
        try:
            return self.request(message, ctx.session.timeout(ctx.check))
        except WorkerFailed as failure:
            raise CheckFailed(str(failure)) from None

    def _receive(self, deadline: float, doing: str) -> dict:
        try:
            data = read_frame(self._channel.from_worker, deadline)
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
        if reply.get("failure") == "died" and self._channel and self._channel.connection is not None:
            # The nursery's word on its worker's end (graders/isolation/nursery.py): how it died.
            self.stop()
            status = reply.get("status")
            raise WorkerFailed(f"the worker process running the solution died while {doing} ran"
                               f"{_exit_reason(status if isinstance(status, int) else None)}")
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
