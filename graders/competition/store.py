"""The store of graded runs: one JSON file per run under results/<team>/, validated when read.

Each `score.py --team NAME` run is stored as one JSON file under results/<team>/. LEADERBOARD.md is
regenerated from all stored runs, never edited by hand. Storing and regenerating happen under one
file lock, so runs that finish at the same time lose no row.

May import: the standard library and graders.frame (scratch: write_whole).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
from contextlib import contextmanager
from pathlib import Path

from graders.frame.scratch import write_whole


SCHEMA = "fx-katas/results/1"
REQUIRED = {"schema": str, "team": str, "timestamp": str, "seed": int, "device": str, "device_name": str,
            "torch": str, "solutions_hash": str, "total_points": (int, float), "katas": dict}


class InvalidResults(ValueError):
    pass


def files_hash(files: dict[str, bytes]) -> str:
    """A team's tree as one hash ({"NN_name/solution.py": bytes}): the stored runs' solutions_hash, the live
    service's submissions, and the key of a team's nursery on a worker machine."""
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.encode() + b"\0" + files[path] + b"\0")
    return digest.hexdigest()


def validate(run: dict, source: str) -> dict:
    if not isinstance(run, dict) or run.get("schema") != SCHEMA:
        raise InvalidResults(f"{source} is not an fx-katas results file (schema {SCHEMA!r} expected).")
    for key, kind in REQUIRED.items():
        if not isinstance(run.get(key), kind):
            raise InvalidResults(f"{source}: field {key!r} is missing or not a {getattr(kind, '__name__', kind)}.")
    disqualified = run.setdefault("disqualified", [])
    if not isinstance(disqualified, list) or not all(isinstance(reason, str) for reason in disqualified):
        raise InvalidResults(f"{source}: field 'disqualified' must be a list of reasons.")
    for kata, result in run["katas"].items():
        if not isinstance(result, dict) or not isinstance(result.get("points"), (int, float)):
            raise InvalidResults(f"{source}: kata {kata!r} has no points.")
    return run


def safe_team_dir(team: str) -> str:
    """A folder name for `team`: the name itself where it is a safe one, else its safe characters and a hash of
    the name ("team a" and "team_a" get folders of their own: one would overwrite the other's saved results)."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", team).strip("._")
    if not slug:
        raise ValueError(f"team name {team!r} has no letters or digits")
    return slug if slug == team else f"{slug}-{hashlib.sha256(team.encode()).hexdigest()[:8]}"


@contextmanager
def locked(results_dir: Path):
    results_dir.mkdir(parents=True, exist_ok=True)
    with open(results_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def store_run(results_dir: Path, run: dict) -> Path:
    """Write the run atomically under results/<team>/ (the caller holds the lock)."""
    validate(run, "the run to store")
    team_dir = results_dir / safe_team_dir(run["team"])
    team_dir.mkdir(parents=True, exist_ok=True)
    stamp = re.sub(r"[^0-9T]", "", run["timestamp"][:19])
    path = team_dir / f"{stamp}-{run['solutions_hash'][:8]}-{os.getpid()}.json"
    write_whole(path, json.dumps(run, indent=1).encode(), mode=0o644)
    return path


def load_runs(results_dir: Path) -> tuple[list[dict], list[str]]:
    """All valid stored runs, and one sentence per file that could not be read."""
    runs, problems = [], []
    for path in _json_files(results_dir):
        try:
            runs.append(validate(json.loads(path.read_text()), str(path)))
        except (OSError, json.JSONDecodeError) as exc:
            problems.append(f"{path} could not be read as JSON ({exc}); it was left out of the leaderboard.")
        except InvalidResults as exc:
            problems.append(f"{exc} It was left out of the leaderboard.")
    return runs, problems


class RunFolder:
    """An organiser's run in progress: its settings (seed included) and each job's result as it arrives,
    under results/.runs/<run>/, so that `score.py --submissions DIR --resume RUN` grades only what is
    missing, with the same secret seed."""

    def __init__(self, results_dir: Path, run: str):
        if not re.fullmatch(r"[0-9A-Za-z_.-]+", run):
            raise ValueError(f"{run!r} is not a run name")
        self.run, self.path = run, results_dir / ".runs" / run

    @classmethod
    def create(cls, results_dir: Path, settings: dict) -> "RunFolder":
        import datetime
        import secrets

        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
        folder = cls(results_dir, f"{stamp}-{secrets.token_hex(2)}")
        (folder.path / "jobs").mkdir(parents=True)
        _write(folder.path / "settings.json", settings)
        return folder

    def settings(self) -> dict:
        try:
            return json.loads((self.path / "settings.json").read_text())
        except OSError:
            raise ValueError(f"--resume {self.run}: no such run under {self.path.parent}") from None

    def _file(self, team: str, kata: str, phase: str) -> Path:
        return self.path / "jobs" / safe_team_dir(team) / f"{kata}.{phase}.json"

    def save(self, team: str, kata: str, phase: str, result: dict, source: bytes | None = None) -> None:
        """Keep a job's result, with the hash of the solution file it graded (`source`)."""
        self._file(team, kata, phase).parent.mkdir(parents=True, exist_ok=True)
        _write(self._file(team, kata, phase), {"team": team, "kata": kata, "phase": phase, "result": result,
                                               "source": source_hash(source)})

    def saved(self, sources: dict[tuple[str, str], bytes | None] | None = None
              ) -> tuple[dict[tuple[str, str, str], dict], set[tuple[str, str]]]:
        """The results saved so far, and the (team, kata)s whose results were left out: given the solution files
        now (`sources`: (team, kata) -> bytes), only results saved for the very same file count (a team whose
        file changed since is graded again)."""
        found, changed = {}, set()
        for path in _json_files(self.path / "jobs"):
            try:
                entry = json.loads(path.read_text())
                team, kata = entry["team"], entry["kata"]
                if sources is not None and "source" in entry and entry["source"] != source_hash(sources.get((team, kata))):
                    changed.add((team, kata))
                    continue
                found[(team, kata, entry["phase"])] = entry["result"]
            except (OSError, ValueError, KeyError):
                continue  # half written when the organiser died: graded again
        return found, changed


def source_hash(source: bytes | None) -> str | None:
    return None if source is None else hashlib.sha256(source).hexdigest()


def _json_files(folder: Path) -> list[Path]:
    """The JSON files one level down, without the dot file a writer killed before its rename leaves (write_whole)."""
    return sorted(path for path in folder.glob("*/*.json") if not path.name.startswith("."))


def _write(path: Path, data: dict) -> None:
    write_whole(path, json.dumps(data).encode())
