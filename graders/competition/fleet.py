"""The grading fleet: every (team, kata) graded as Dask jobs, on one machine or many.

With no address a `Fleet` starts a Dask cluster of its own inside this process (the embedded default: one
worker, one thread per core, nothing to start); with `tls://HOST:8786` it uses a running scheduler and
the workers that joined it (`dask worker tls://HOST:8786 --nthreads $(nproc)`), each of them and score.py
holding the fleet's certificate (graders/competition/certificates.py; a `tcp://` address works unencrypted,
with a warning: it admits anyone). A job
(graders/competition/jobs.py) carries data only: a team's solution file, the kata, the phase, the device
and the seed; the worker machine grades it in processes of its own and sends back the records.

- One job per (team, kata) grades every level, as many at once per machine as its worker has threads.
  Timing stays alone, per machine: every grading process of a machine shares its machine lock, shared
  while checks run, exclusive while a speed level times (graders/frame/machinelock.py).
- No job names a worker (but a speed job its timing host): the scheduler keeps each job until a worker has a
  free thread, so a worker never holds more jobs than it runs, and a worker's death is charged to the job that
  killed it alone (the fault isolation below). A team's jobs preferring one "home" worker (tried 2026-11-27,
  for its nursery to stay warm) broke both: Dask sends a restricted job to its worker at once, where it waits
  and dies with the culprit; and it never hands a job that prefers a lost worker to one that joins later.
- `timing_host` splits a kata in two jobs: its correctness levels anywhere, then (once they are back,
  and only if the solution loaded) its speed level on that machine.
- A kata whose file is its shipped stub, byte for byte, is judged at once from the bytes (every check
  of a stub fails): no job, no sandbox; a team that left katas untouched costs the fleet nothing there.
- A job lost with its worker is run again elsewhere by the scheduler; one whose solution took down the
  machines grading it more than the scheduler allows (distributed.scheduler.allowed-failures, 3) comes back
  as "crashed the grader", with a reason. A machine at another project version refuses its jobs; they go
  to the other machines, or fail with its sentence when none is left.
- A lost scheduler is no verdict: `run_jobs` raises `FleetLost` (the jobs graded before it stay saved by
  the caller, and a resumed run grades the others); no job is reported as crashed for it.

May import: graders.frame, graders.batch, graders.competition (jobs, certificates).
"""
from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from graders.batch.summary import failed_grading, is_shipped_stub, stub_records, summarise_phases
from graders.competition.certificates import plain_warning, security
from graders.competition.jobs import PHASES, did_not_load, grade_job, make_job, speed_not_run, warm_up
from graders.frame.levels import CheckResult


class FleetLost(RuntimeError):
    """The fleet itself failed (its scheduler lost): the jobs still pending have no verdict."""


# What future.result() raises when the client lost its scheduler (the futures are cancelled with the reason
# "scheduler-connection-lost") or its connection: the fleet's failure, never a solution's.
LOST = ("FutureCancelledError", "CancelledError", "CommClosedError")


@dataclass
class Job:
    team: str
    kata: str
    phase: str
    files: dict[str, bytes] = field(repr=False, default_factory=dict)
    speed: bool = True  # whether its speed level is timed (phase "all" with --no-speed: not)
    refused_by: set[str] = field(default_factory=set)


class Fleet:
    """A Dask client: a cluster of its own in this process when address is None."""

    def __init__(self, address: str | None = None, *, timing_host: str | None = None, device: str = "cpu",
                 threads: int = 1, kata_timeout: float = 900.0, kata_memory: float = 8.0, slots: int | None = None,
                 check_timeout: float | None = None, certificates: Path | None = None):
        from distributed import Client, LocalCluster  # here: a learner's score.py needs no Dask

        self.device, self.threads, self.kata_timeout, self.kata_memory = device, threads, kata_timeout, kata_memory
        self.check_timeout = check_timeout
        self.cluster = None
        if address is None:
            # Threads, not processes: a job only starts and watches its grading subprocess, so the worker
            # needs no process of its own (no second Python, no second import), and it dies with us.
            # In-process transport; the dashboards Dask starts all the same listen on loopback only (given
            # None, LocalCluster opened one on 0.0.0.0:8787 and the worker's on another port of 0.0.0.0).
            self.cluster = LocalCluster(n_workers=1, threads_per_worker=slots or len(os.sched_getaffinity(0)),
                                        processes=False, dashboard_address="127.0.0.1:0",
                                        worker_dashboard_address="127.0.0.1:0")
            self.client = Client(self.cluster)
        else:
            warning = plain_warning(address)
            if warning:
                print(warning, file=sys.stderr, flush=True)
            self.client = Client(address, timeout=30, **({"security": security(certificates)} if certificates else {}))
        try:  # every machine starts its zygote while the jobs are being prepared; only a head start
            self.client.run(warm_up, on_error="ignore")
        except Exception:  # noqa: BLE001 - a worker that cannot (another version) refuses its jobs later, with a sentence
            pass
        self.timing_host = timing_host
        self._timing_workers = self._resolve(timing_host) if timing_host else None
        self.refusals: dict[str, str] = {}  # worker address: its sentence

    def _resolve(self, host: str) -> list[str]:
        """The workers on `host` (a host name, an address or a worker's name)."""
        try:
            ip = socket.gethostbyname(host)
        except OSError:
            ip = None
        hosts = self.client.run(socket.gethostname)  # worker address: its host name
        found = [address for address, info in self.client.scheduler_info(n_workers=-1)["workers"].items()
                 if host in (address, info.get("host"), str(info.get("name")), hosts.get(address)) or info.get("host") == ip]
        if not found:
            raise ValueError(f"--timing-host {host}: no worker of this cluster runs there (workers: "
                             f"{', '.join(sorted(set(hosts.values()))) or 'none'})")
        return found

    def workers(self) -> list[str]:
        return list(self.client.scheduler_info(n_workers=-1)["workers"])

    def phases(self, speed: bool) -> list[str]:
        """The jobs of one kata: all levels in one, or with a timing host its correctness and its speed level."""
        return ["correctness", "speed"] if speed and self.timing_host else ["all"]

    def submit(self, job: Job, seed: int):
        """A Dask future for one job."""
        payload = make_job(job.team, job.kata, job.files, job.phase, seed, speed=job.speed, device=self.device,
                           threads=self.threads, kata_timeout=self.kata_timeout, kata_memory=self.kata_memory,
                           check_timeout=self.check_timeout)
        options: dict = {"pure": False, "key": f"grade-{job.phase}-{job.kata}-{job.team}-{os.urandom(4).hex()}"}
        if job.phase == "speed" and self._timing_workers:
            options["workers"] = self._timing_workers
        if job.refused_by:
            others = [w for w in (options.get("workers") or self.workers()) if w not in job.refused_by]
            options["workers"] = others
        return self.client.submit(grade_job, payload, **options)

    def run_jobs(self, jobs: list[Job], seed: int) -> Iterator[tuple[Job, dict]]:
        """Grade `jobs` (phase "all", or "correctness" and then each kata's speed job, submitted when its
        correctness job is back); yields (job, result) as each job's result arrives. A result holds
        "records" or "failed" (a failed_grading dict)."""
        from distributed import as_completed
        from distributed.scheduler import KilledWorker

        stubs, pending = [], {}
        for job in jobs:
            if is_shipped_stub(job.kata, job.files.get(f"{job.kata}/solution.py")):
                stubs.append(job)
            else:
                pending[self.submit(job, seed)] = job
        for job in stubs:  # judged here, from the bytes alone: no grading process, no sandbox, nothing runs
            yield job, stub_result(job)
            if job.phase == "correctness" and job.speed:
                follow = Job(job.team, job.kata, "speed", job.files, job.speed)
                yield follow, stub_result(follow)
        if not pending:
            return
        flow = as_completed(list(pending))
        for future in flow:
            job = pending.pop(future)
            try:
                result = future.result()
            except KilledWorker as exc:
                result = {"failed": failed_grading(
                    "crashed the grader", f"{job.kata}'s solution took down the machine grading it again and again "
                    f"({exc}); the team's other katas are unaffected.")}
            except Exception as exc:  # noqa: BLE001 - a refusal, or anything else that went wrong on a worker
                if type(exc).__name__ == "WrongVersion":
                    sentence = str(exc)
                    worker = sentence.split()[1]
                    if worker not in self.refusals:
                        self.refusals[worker] = sentence
                        print(f"REFUSED: {sentence}", file=sys.stderr, flush=True)
                    job.refused_by.add(worker)
                    if [w for w in self.workers() if w not in job.refused_by]:
                        again = self.submit(job, seed)
                        pending[again] = job
                        flow.add(again)
                        continue
                    result = {"failed": failed_grading("refused", sentence)}
                elif type(exc).__name__ in LOST or self.client.status not in ("running", "connecting"):
                    raise FleetLost(f"the fleet's scheduler was lost ({type(exc).__name__}: {exc}) with "
                                    f"{len(pending) + 1} job(s) still to grade") from exc
                else:
                    result = {"failed": failed_grading("crashed", f"the grading job failed: {type(exc).__name__}: {exc}")}
            finally:
                future.release()
            yield job, result
            if job.phase == "correctness" and job.speed:
                reason = did_not_load(result)
                if reason is None:
                    follow = Job(job.team, job.kata, "speed", job.files, job.speed)
                    again = self.submit(follow, seed)
                    pending[again] = follow
                    flow.add(again)
                else:
                    yield Job(job.team, job.kata, "speed"), speed_not_run(job.kata, reason)

    def grade(self, team: str, files: dict[str, bytes], katas: list[str], seed: int, *, speed: bool = True,
              on_result: Callable[[str, str, dict], None] | None = None) -> dict[str, dict]:
        """Grade one team's files ({"03_conv_bn/solution.py": b"..."}) for `katas`; returns {kata: summary
        dict as graders.batch.summary.summarise makes it, plus the machine}, calling on_result(team, kata,
        summary) as each kata finishes."""
        phases = self.phases(speed)
        parts: dict[str, dict[str, dict]] = {kata: {} for kata in katas}
        summaries: dict[str, dict] = {}
        for job, result in self.run_jobs([Job(team, kata, phases[0], files, speed) for kata in katas], seed):
            parts[job.kata][job.phase] = result
            if len(parts[job.kata]) == len(phases):
                summaries[job.kata] = combine(job.kata, parts[job.kata])
                if on_result:
                    on_result(team, job.kata, summaries[job.kata])
        return summaries

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()

    def __enter__(self) -> "Fleet":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def stub_result(job: Job) -> dict:
    """A job whose file is the kata's shipped stub, judged without grading (batch.summary.stub_records)."""
    records = stub_records(job.kata, PHASES[job.phase], speed=job.speed)
    return {"records": [r.to_dict() for r in records], "machine": None, "worker": None, "seconds": 0.0}


def combine(kata: str, parts: dict[str, dict]) -> dict:
    """A kata's summary from its jobs' results ({phase: result}), with the machine each phase ran on:
    "machine" is the one its speed level was timed on (or its only job's, without speed)."""
    summary = summarise_phases(kata, [p["failed"] if "failed" in p else [CheckResult.from_dict(r) for r in p["records"]]
                                      for p in parts.values()])
    machines = {phase: p.get("machine") for phase, p in parts.items()}
    summary["machine"] = machines.get("speed") or machines.get("all") or machines.get("correctness")
    summary["machines"] = machines
    summary["seconds"] = sum(p.get("seconds") or 0.0 for p in parts.values())
    return summary
