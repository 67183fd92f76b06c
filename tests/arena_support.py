"""Shared by the arena's tests: a real server (uvicorn in a subprocess on 127.0.0.1, a free port, a real
SQLite file), the arena.py commands, HTTP calls and the trees teams submit. Every process a test starts
is stopped when the test ends, passed or failed: the server by its process group, the grading processes
it started (they run in sessions of their own) by their ids, found by the server's private TMPDIR."""
from __future__ import annotations

import bz2
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path

from sqlalchemy import create_engine, text

from graders.frame.catalogue import REPO_ROOT

ARENA = str(REPO_ROOT / "graders" / "arena.py")
SCORE = str(REPO_ROOT / "graders" / "score.py")
NO_OP_01 = '''import torch.fx as fx
import torch.nn as nn


class FusedLinearReLU(nn.Module):
    def __init__(self, linear):
        super().__init__()
        self.linear = linear

    def forward(self, x):
        return self.linear(x).relu()


def fuse_linear_relu(gm: fx.GraphModule) -> fx.GraphModule:
    return gm  # no rewrite at all
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def arena(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, ARENA, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    if check and done.returncode:
        raise AssertionError(f"arena.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done


def token_of(output: str) -> str:
    return re.search(r"token \(shown once; only its hash is kept\): (\S+)", output).group(1)


def create(db: str, *args: str) -> str:
    """The organiser's token."""
    return token_of(arena("create", "--db", db, *args).stdout)


def add_team(db: str, name: str) -> str:
    return token_of(arena("team", "add", "--db", db, name).stdout)


def add_teams(db: str, *names: str) -> list[str]:
    """Each team's token, in order: one `arena.py team add` for them all (a command is a Python start, about 1 s
    of CPU)."""
    added = arena("team", "add", "--db", db, *names).stdout
    tokens = re.findall(r"token \(shown once; only its hash is kept\): (\S+)", added)
    assert len(tokens) == len(names), tokens
    return tokens


class Response:
    def __init__(self, status: int, headers, body: bytes):
        self.status, self.headers, self.body = status, headers, body

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")

    def json(self):
        return json.loads(self.body)


def http(url: str, *, token: str | None = None, data: bytes | None = None, kind: str | None = None,
         method: str | None = None, headers: dict | None = None, timeout: float = 60) -> Response:
    request = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"))
    for key, value in {**(headers or {}), **({"Authorization": f"Bearer {token}"} if token else {}),
                       **({"Content-Type": kind} if kind else {})}.items():
        request.add_header(key, value)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return Response(response.status, response.headers, response.read())
    except urllib.error.HTTPError as exc:
        return Response(exc.code, exc.headers, exc.read())


TAR_KINDS = {"symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE, "dir": tarfile.DIRTYPE, "fifo": tarfile.FIFOTYPE}


def tar_of(members: list[tuple[str, bytes | None, str]]) -> bytes:
    """A tar archive: (name, content, kind) with kind "file", "symlink" or "hardlink" (content: the target), "dir"
    or "fifo" (content: None)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, content, kind in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(content)
                archive.addfile(info, io.BytesIO(content))
            else:
                info.type = TAR_KINDS[kind]
                info.linkname = content.decode() if content else ""
                archive.addfile(info)
    return buffer.getvalue()


def bomb(path: Path, compression: str, size: int, chunk: int = 16 << 20) -> Path:
    """A compression bomb written to `path`: a tar archive whose first member holds `size` zero bytes
    under a path the server ignores (04_dce/zeros.bin), then 04_dce/solution.py (the reference), bzip2- or
    gzip-compressed. Built without holding the zeros: `chunk` zero bytes are compressed once, as one stream,
    and that stream is written size/chunk times (a file of streams one after another, as pbzip2 and pigz
    write them, read back as one); so 1 GiB under bzip2 is a second's work and a few KiB."""
    assert size % chunk == 0

    def compressed(data: bytes) -> bytes:
        if compression == "bzip2":
            return bz2.compress(data, 9)
        packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        return packer.compress(data) + packer.flush()

    header = tarfile.TarInfo("04_dce/zeros.bin")
    header.size = size
    zeros = compressed(bytes(chunk))
    with open(path, "wb") as out:
        out.write(compressed(header.tobuf(format=tarfile.GNU_FORMAT)))
        for _ in range(size // chunk):
            out.write(zeros)
        out.write(compressed(tar_of([("04_dce/solution.py", solution("04_dce"), "file")])))
    return path


def multipart(fields: dict[str, bytes | str]) -> tuple[bytes, str]:
    boundary = "arena-test-boundary-7d1e"
    body = b""
    for name, value in fields.items():
        if isinstance(value, str):
            body += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n").encode()
        else:
            body += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"solution.py\"\r\n"
                     "Content-Type: text/x-python\r\n\r\n").encode() + value + b"\r\n"
    return body + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def solution(kata: str, tag: str = "") -> bytes:
    return (REPO_ROOT / "reference" / kata / "solution.py").read_bytes() + (f"\n# {tag}\n".encode() if tag else b"")


class PortTaken(Exception):
    """The server could not bind its port: another process took it after free_port() let it go."""


class Server:
    """`arena.py serve` in a subprocess (its own process group) on a free port of 127.0.0.1."""

    def __init__(self, db: str, tmp: Path, *args: str):
        self.db, self.tmp, self.args = db, tmp, args
        self.scratch = tmp / "server-tmp"  # TMPDIR of the server and of every grading process it starts
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.process: subprocess.Popen | None = None
        self.starts = 0

    def start(self, timeout: float = 90, port: int | None = None) -> "Server":
        """Start it on a free port (or on `port`); if another process took that port before the server bound
        it (the server's own Dask cluster binds ports of its own first), again on another one."""
        if port is not None:
            return self._start(timeout, port)
        for _ in range(3):
            try:
                return self._start(timeout)
            except PortTaken:
                continue
        return self._start(timeout)

    def _start(self, timeout: float, port: int | None = None) -> "Server":
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.starts += 1
        self.log = self.tmp / f"server{self.starts}.log"
        env = {**os.environ, "TMPDIR": str(self.scratch)}
        with open(self.log, "w") as log:
            self.process = subprocess.Popen([sys.executable, ARENA, "serve", "--db", self.db, "--port", str(self.port),
                                             *self.args], cwd=REPO_ROOT, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                if "address already in use" in self.log.read_text().lower():
                    raise PortTaken(self.port)
                raise AssertionError(f"the server exited ({self.process.returncode}):\n{self.log.read_text()}")
            try:
                if http(self.url + "/api/competition", timeout=5).status in (200, 404):
                    return self
            except OSError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"the server did not answer within {timeout}s:\n{self.log.read_text()}")

    def kill(self) -> None:
        """SIGKILL: the server dies mid-work, as in a crash."""
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        self.kill_graders()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)
        self.kill_graders()

    def kill_graders(self) -> None:
        """The grading processes this server started (and the workers they started): their command lines
        name the server's TMPDIR; each is killed by its id."""
        mark = str(self.scratch).encode()
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    if mark in (proc / "cmdline").read_bytes():
                        os.kill(int(proc.name), signal.SIGKILL)
                except (OSError, ProcessLookupError):
                    pass

    def get(self, path: str, **kw) -> Response:
        return http(self.url + path, **kw)

    def submit(self, token: str, archive: bytes, **kw) -> Response:
        return http(self.url + "/api/submissions", token=token, data=archive, kind="application/x-tar", **kw)

    def wait_for(self, predicate, timeout: float, what: str, every: float = 0.5):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            if self.process.poll() is not None:
                raise AssertionError(f"the server exited while waiting for {what}:\n{self.log.read_text()}")
            time.sleep(every)
        raise AssertionError(f"{what}: not within {timeout}s")


def token_option(token: str) -> str:
    """`--token=TOKEN`, never `--token TOKEN`: a token (secrets.token_urlsafe) begins with '-' once in 64, and
    argparse reads `--token -x...` as a missing value ("expected one argument"). A test whose team drew such a
    token failed: with three, test_create_teams_submit_through_the_cli_read_results_and_close about 1 run in 22.
    `score.py --submit URL --token TOKEN`, as the docs write it, fails the same way for such a team."""
    return f"--token={token}"


def score_submit(url: str, token: str, tree: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCORE, "--submit", url, token_option(token), "--solutions", str(tree)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)


def tree(root: Path, files: dict[str, bytes]) -> Path:
    for path, content in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(content)
    return root


def sql(db: str, statement: str, **params) -> tuple | None:
    """Run one statement on the database at URL `db` (SQLite or PostgreSQL); its first row as a tuple, if any."""
    engine = create_engine(db)
    try:
        with engine.begin() as connection:
            result = connection.execute(text(statement), params)
            return tuple(result.fetchone()) if result.returns_rows else None
    finally:
        engine.dispose()
