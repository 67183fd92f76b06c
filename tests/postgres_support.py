"""A real PostgreSQL server for the arena's tests: started once per test session from Debian's binaries
(`postgresql`, which .ci/run installs) in a folder of its own, on a free port of 127.0.0.1, with fsync off;
each test gets a fresh database on it. Where no server can be started (no binaries, or they fail) the
tests that need one are skipped with the sentence `problem` returns. As root, the server runs as the
`postgres` user (initdb refuses root)."""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Postgres:
    """One server; `database()` makes a fresh database on it and returns its SQLAlchemy URL."""

    def __init__(self):
        self.root = Path(tempfile.mkdtemp(prefix="fx-katas-postgres-"))
        self.port = _free_port()
        self.count = 0
        self.problem: str | None = None
        self.user = None
        try:
            self._start()
        except Exception as exc:  # noqa: BLE001 - any reason no server runs: the tests say it and skip
            self.problem = f"no PostgreSQL server could be started for the arena's tests ({exc})"

    def _run(self, *command: str) -> None:
        def as_user():
            if self.user is not None:
                os.setgid(self.user.pw_gid)
                os.setuid(self.user.pw_uid)

        done = subprocess.run(command, capture_output=True, text=True, timeout=120, preexec_fn=as_user, cwd=self.root)
        if done.returncode:
            raise RuntimeError(f"{Path(command[0]).name} failed: {(done.stderr or done.stdout).strip()[-300:]}")

    def _start(self) -> None:
        initdb, pg_ctl = binary("initdb"), binary("pg_ctl")
        if not (initdb and pg_ctl):
            raise RuntimeError("initdb and pg_ctl not found: apt-get install postgresql")
        if os.geteuid() == 0:
            try:
                self.user = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError("running as root and no `postgres` user to run the server as") from None
            os.chmod(self.root, 0o755)
            os.chown(self.root, self.user.pw_uid, self.user.pw_gid)
        self.data = self.root / "data"
        self._run(initdb, "-D", str(self.data), "-U", "arena", "--auth=trust", "-E", "UTF8", "--no-sync")
        self._run(pg_ctl, "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-t", "60", "-o",
                  f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                  "-c synchronous_commit=off -c full_page_writes=off", "start")

    def database(self) -> str:
        import psycopg

        self.count += 1
        name = f"arena_{self.count}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=arena dbname=postgres", autocommit=True) as c:
            c.execute(f"CREATE DATABASE {name}")
        return f"postgresql://arena@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        pg_ctl = binary("pg_ctl")
        if self.problem is None and pg_ctl:
            try:
                self._run(pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "stop")
            except Exception:  # noqa: BLE001 - stopping is best effort; the folder goes anyway
                pass
        shutil.rmtree(self.root, ignore_errors=True)
