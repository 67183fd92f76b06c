"""A nursery: one team's sandbox that forks its worker processes warm, so a fleet machine pays for a sandboxed
worker's start (bubblewrap, Python, torch: about 1.7 s of CPU) once per team instead of once per kata.

The fleet (graders/competition/jobs.py) starts a nursery per team's tree on a machine, inside the sandbox a
worker gets (graders/isolation/sandbox.py), with that team's staged solution files read-only. Its socket
is made and bound outside, in a host folder the sandbox does not see, and handed in as an open file
descriptor: nothing of the host is writable inside (before, the socket's folder was, and a solution wrote
1 GiB there). The nursery imports what a worker needs, then listens on the socket: each connection is a
judge asking for one worker (the kata, the solution file and the thread count, a JSON line); the nursery
forks a child that becomes that worker (graders/isolation/serve.py), speaking the usual channel over the
connection. Only one team's code ever runs in a nursery, so what its katas' workers can do to each other
(they share the sandbox's /tmp and can signal each other) they do to their own team; the judge trusts
none of them (its checks run on data only, as always).

A worker dies when its judge lets go: the nursery watches each connection and kills the worker's process
group when the judge's end closes (a judge that stops a worker, times it out, or dies). When a worker
ends, the nursery reaps it and tells the judge how (the status a reply frame carries), then closes the
connection. The nursery ends when its owner closes its stdin, its workers with it.

`python -m graders.isolation.nursery SOCKET MEMORY CPU DEVICE sandboxed|plain FD` (inside the sandbox; SOCKET
names it, FD is the listening socket); `open_nursery` starts one.

At the first request for a worker of katas 10-13 the nursery loads the torch internals those katas' workers
import on first use (graders/isolation/torch_private.py, FIRST_USE_MODULES), once for every worker after.

May import: graders.frame, graders.isolation (sandbox, serve, channel, torch_private).
"""
from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from graders.frame.lifetimes import fork_safe_cuda, kill_group
from graders.isolation.sandbox import Limits, bwrap, limited, sandbox_arguments, starting_environment


def _child(connection: socket.socket, request: dict, limits: Limits, others: list[int]) -> None:
    """In the forked child: become the worker for request's solution, speaking over the connection."""
    code = 70
    try:
        for fd in others:
            os.close(fd)
        os.setsid()
        limited(limits)()
        fd = connection.detach()
        os.dup2(fd, 0)
        os.dup2(fd, 1)
        os.close(fd)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)  # a solution's print() has no reader here
        os.close(null)
        from graders.isolation import serve

        serve.main([request["solution"], request["kata"], str(int(request["threads"]))])
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:  # noqa: BLE001 - a failure here is the worker's; the judge reads its end as a death
        code = 1
    finally:
        os._exit(code)


def _load_torch_internals() -> None:
    """What katas 10-13's workers import on first use (kata 13's solutions import Inductor's pattern matcher,
    which brings Dynamo): loaded once, here, for every worker forked after, instead of in each (2 s of a
    kata-13 worker's start). Frozen as the rest of the nursery's heap."""
    import gc
    import importlib

    from graders.isolation.torch_private import FIRST_USE_MODULES

    for name in FIRST_USE_MODULES:
        importlib.import_module(name)
    gc.freeze()


def serve_nursery(listening: int, limits: Limits, sandboxed: bool) -> None:
    """The nursery's loop: fork a worker per connection, kill it when its judge lets go, reap it."""
    import gc

    fork_safe_cuda()  # before anything asks torch about CUDA: its workers may use it

    from graders.frame.catalogue import KATAS, imports_torch_internals
    from graders.isolation import serve
    from graders.isolation.channel import write_frame

    for kata in KATAS:  # the point of a nursery: torch, torch.fx's first uses, the katas' models, loaded once
        serve._warm_up(kata)
    gc.freeze()  # out of the collector's sight: every worker shares these pages (the gc docs' advice before fork)
    torch_internals_loaded = False

    listener = socket.socket(fileno=listening)  # bound and listening already: made by open_nursery, outside
    poller = select.poll()
    poller.register(0, select.POLLIN)  # the owner's pipe: EOF ends the nursery
    poller.register(listener, select.POLLIN)
    children: dict[int, socket.socket] = {}  # pid: the connection to its judge (the nursery's copy)
    by_fd: dict[int, int] = {}  # the connection's fd: pid
    os.write(1, b"ready\n")
    sweep = time.monotonic()
    while True:
        for fd, events in poller.poll(100):
            if fd == 0:
                if not os.read(0, 1024):
                    for pid in children:
                        kill_group(pid)
                    os._exit(0)
            elif fd == listener.fileno():
                connection, _ = listener.accept()
                request = json.loads(_read_line(connection))
                if not torch_internals_loaded and imports_torch_internals([request.get("kata")]):
                    _load_torch_internals()
                    torch_internals_loaded = True
                pid = os.fork()
                if pid == 0:
                    _child(connection, request, limits, [listener.fileno(), *by_fd])
                children[pid] = connection
                by_fd[connection.fileno()] = pid
                poller.register(connection, select.POLLRDHUP)
            elif fd in by_fd and events & (select.POLLRDHUP | select.POLLHUP | select.POLLERR):
                kill_group(by_fd[fd])  # the judge let go: its worker goes
                poller.unregister(fd)
        reaped = False
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                reaped = True
                connection = children.pop(pid)
                fd = connection.fileno()
                by_fd.pop(fd, None)
                try:
                    poller.unregister(fd)
                except KeyError:
                    pass
                try:  # how it ended, for the judge's sentence; nobody may be listening any more
                    write_frame(fd, serve._reply(ok=False, failure="died", status=os.waitstatus_to_exitcode(status)))
                except OSError:
                    pass
                connection.close()
        if sandboxed and (reaped or time.monotonic() > sweep):  # in a PID namespace of its own: /proc is ours
            _kill_strays(set(children))
            sweep = time.monotonic() + 1.0


def _kill_strays(workers: set[int]) -> None:
    """Kill every process of this sandbox that belongs to no live worker: what a worker left running (a
    daemon in a session of its own, a child of a worker that ended) would otherwise burn CPU beside other
    teams' timings until the nursery ends. A worker leads its own session, so its processes carry its pid as
    their session id; the sandbox's init (pid 1) and the nursery are spared."""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in (1, me):
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            session = int(stat.rsplit(")", 1)[1].split()[3])
        except (OSError, ValueError, IndexError):
            continue
        if session not in workers and session != os.getsid(0):
            kill_group(int(entry))


def _read_line(connection: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = connection.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


@dataclass
class Nursery:
    """A running nursery, as its owner (a fleet worker machine) holds it."""

    socket_path: Path
    process: subprocess.Popen

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        """Close its pipe: it kills its workers and ends."""
        try:
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def open_nursery(solutions: Path, sockets: Path, limits: Limits = Limits()) -> Nursery:
    """Start a nursery for the solution files under `solutions` (read-only inside), listening in `sockets`.
    Sandboxed where bubblewrap runs; the caller's thread must outlive it (the sandbox dies with it)."""
    socket_path = sockets / "nursery.sock"
    if len(os.fsencode(socket_path)) > 107:  # sockaddr_un's limit
        raise ValueError(f"a nursery's socket path is longer than a Unix socket's 107 bytes: {socket_path}")
    binary = bwrap()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(socket_path))
    listener.listen(16)
    command = [sys.executable, "-m", "graders.isolation.nursery", str(socket_path), str(limits.memory_gb),
               str(limits.cpu_s), limits.device, "sandboxed" if binary else "plain", str(listener.fileno())]
    if binary is not None:
        command = [binary, *sandbox_arguments([solutions], limits.device), *command]
    try:
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
                                   close_fds=True, pass_fds=(listener.fileno(),),
                                   cwd="/tmp" if os.path.isdir("/tmp") else None,
                                   env=starting_environment(binary is not None))
    finally:
        listener.close()  # the nursery holds its own copy
    if process.stdout.readline() != b"ready\n":
        process.kill()
        process.wait()
        raise RuntimeError(f"the nursery for {solutions} did not start")
    return Nursery(socket_path, process)


def connect(socket_path: Path, solution: Path, kata: str, threads: int) -> socket.socket:
    """A judge's request for a worker: the connection that is its channel."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(str(socket_path))
    connection.sendall((json.dumps({"solution": str(solution), "kata": kata, "threads": threads}) + "\n").encode())
    return connection


if __name__ == "__main__":
    serve_nursery(int(sys.argv[6]), Limits(float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]), sys.argv[5] == "sandboxed")
