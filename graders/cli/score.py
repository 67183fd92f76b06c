"""Grade a solution tree kata by kata, print the table, and regenerate LEADERBOARD.md.

    uv run graders/score.py                                   # grade your work in katas/
    uv run graders/score.py --solutions reference --kata 03_conv_bn
    uv run graders/score.py --solutions ../team_a --team team_a   # store the run for the leaderboard

    uv run graders/score.py --hint 03_conv_bn                      # the next hint for a kata
    uv run graders/score.py --submissions teams/                    # organiser: grade every team
    uv run graders/score.py --submissions teams/ --cluster tls://HOST:8786 --certificates fleet-tls/  # many machines

Katas are graded in pytest subprocesses (the katas' test files, with --solutions pointing at the tree),
kata after kata; a kata whose process crashed, hung or was tampered with is graded again in a process
of its own, so what one kata's solution does costs that kata only. Every solution file is also read by
a static scan (graders/scan.py) that flags attempts to change the grader rather than the graph.

Organiser mode (--submissions DIR) grades every team folder in DIR with one secret seed: only the
teams' NN_name/solution.py files are read, and every (team, kata) is graded as jobs of the fleet
(graders/competition/fleet.py, Dask): on a cluster of its own in this process by default (--jobs N
correctness jobs at once), or on a running scheduler and its workers (--cluster tls://HOST:8786 --certificates DIR). A speed
job runs alone on its machine (--timing-host HOST: all on that one). Each job's result is saved as it
arrives; --resume RUN grades only what a run is missing. Each team's run is stored and LEADERBOARD.md
regenerated.
Solution code runs only in sandboxed worker processes (graders/isolation/, --isolate): the grading
process never imports it and trusts only the data the workers send back.

The command line (graders/score.py is its entry point): arguments, and the dispatch between a learner's
run (graders.learner), an organiser's (graders.competition) and a team's upload to a live competition
(--submit URL --token TOKEN: graders.arena.client). May import: everything below it (graders.arena,
graders.learner, graders.competition, graders.batch, graders.isolation, graders.frame).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from graders.batch.processes import grade_tree
from graders.batch.summary import failed_grading
from graders.competition.leaderboard import regenerate
from graders.competition.organiser import apply_scan, grade_teams, make_run, print_teams, read_files, stage_submissions
from graders.competition.store import RunFolder, locked, store_run
from graders.frame.catalogue import KATAS, REPO_ROOT, is_available
from graders.frame.levels import resolve_seed
from graders.frame.scratch import claimed_folder
from graders.isolation.sandbox import sandbox_problem
from graders.isolation.scan import scan_tree
from graders.learner.progress import next_hint, remember, reset_hints
from graders.learner.report import next_step, print_table


def _cuda_available() -> bool:
    import torch  # only when CUDA is asked for: the other commands need no tensor library

    return torch.cuda.is_available()


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--solutions", type=Path, default=REPO_ROOT / "katas", metavar="DIR",
                        help="solution tree to grade: DIR/<kata>/solution.py (default: katas/)")
    parser.add_argument("--kata", action="append", choices=list(KATAS), metavar="KATA",
                        help="grade only this kata (repeatable), e.g. --kata 03_conv_bn")
    parser.add_argument("--hint", choices=list(KATAS), metavar="KATA",
                        help="show the next hint for KATA (one more each time you ask; the ones seen before too) "
                             "and grade nothing")
    parser.add_argument("--hints-reset", choices=list(KATAS), metavar="KATA",
                        help="start KATA's hints again at hint 1, and grade nothing")
    parser.add_argument("--team", help="store this run as the team's and regenerate the leaderboard")
    parser.add_argument("--submissions", type=Path, metavar="DIR",
                        help="organiser mode: grade every team folder DIR/<team>/ (a solution tree) and rank them")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)), metavar="N",
                        help="grade the correctness levels in N processes at once (default: one per core; speed "
                             "levels always run alone); organiser mode without --cluster: N jobs at once")
    parser.add_argument("--cluster", metavar="tls://HOST:8786",
                        help="organiser mode: grade on this Dask scheduler's workers (default: a cluster of its own "
                             "on this machine); tls:// with --certificates, or tcp:// unencrypted, admitting anyone")
    parser.add_argument("--certificates", type=Path, metavar="DIR",
                        help="organiser mode: the fleet's certificates (ca.pem, fleet.pem) for a tls:// --cluster")
    parser.add_argument("--make-certificates", type=Path, metavar="DIR",
                        help="write a new fleet's certificates into DIR (ca.pem, and fleet.pem with its key: copy "
                             "DIR to every grading machine), print how to start the fleet with them, grade nothing")
    parser.add_argument("--timing-host", metavar="HOST",
                        help="organiser mode: time every speed level on this one machine of the cluster")
    parser.add_argument("--resume", metavar="RUN",
                        help="organiser mode: finish run RUN (named at its start), grading only what it is missing, "
                             "with its seed")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the run's raw results to FILE")
    parser.add_argument("--no-speed", action="store_true", help="skip the speed levels (L3)")
    parser.add_argument("--isolate", action="store_true",
                        help="run solution code only in sandboxed worker processes, judged by the data they send "
                             "back (always on with --submissions)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads while timing (default 1)")
    parser.add_argument("--seed", type=int, help="grading seed (default: random, printed)")
    parser.add_argument("--kata-timeout", type=float, default=900.0, metavar="S",
                        help="seconds one kata may take in all before it is stopped (default 900)")
    parser.add_argument("--check-timeout", type=float, metavar="S",
                        help="seconds one check may take, loading the solution included (default: each check's "
                             "own, 60 s or 300 s for speed)")
    parser.add_argument("--kata-memory", type=float, default=8.0, metavar="GB",
                        help="memory one kata's grading process may use, and each worker process that runs its "
                             "solution (default 8 GiB): its address space on the CPU, its data segment on CUDA")
    parser.add_argument("--submit", metavar="URL",
                        help="live competition: upload the tree's NN_name/solution.py files to the arena at URL, "
                             "follow the grading and print the team's points and rank (with --token)")
    parser.add_argument("--token", default=os.environ.get("ARENA_TOKEN"),
                        help="the team's token for --submit (default: env ARENA_TOKEN)")
    parser.add_argument("--follow-timeout", type=float, default=3600.0, metavar="S", help=argparse.SUPPRESS)
    parser.add_argument("--retry-for", type=float, default=60.0, metavar="S",
                        help="live competition: keep trying an arena that cannot be reached (a server restarting) for "
                             "up to S seconds, backing off (default 60)")
    parser.add_argument("--results-dir", type=Path, default=REPO_ROOT / "results", help=argparse.SUPPRESS)
    parser.add_argument("--leaderboard", type=Path, default=REPO_ROOT / "LEADERBOARD.md", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.submit is not None:
        if not args.token:
            parser.error("--submit needs the team's token: --token TOKEN (or env ARENA_TOKEN)")
        if args.submissions is not None or args.team:
            parser.error("--submit uploads one tree: it takes neither --submissions nor --team")
    if args.submissions is not None:
        if args.team or "--solutions" in (argv if argv is not None else sys.argv):
            parser.error("--submissions grades every team folder: it takes neither --solutions nor --team")
        if not args.submissions.is_dir():
            parser.error(f"--submissions {args.submissions}: no such folder")
    elif args.cluster or args.timing_host or args.resume or args.certificates:
        parser.error("--cluster, --certificates, --timing-host and --resume are for organiser mode (--submissions DIR)")
    if args.certificates and not (args.cluster or "").startswith("tls://"):
        parser.error("--certificates is for a tls:// --cluster")
    elif not args.solutions.is_dir():
        parser.error(f"--solutions {args.solutions}: no such folder")
    args.isolate = args.isolate or args.submissions is not None
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.device == "cuda" and not _cuda_available():
        parser.error("--device cuda: torch sees no CUDA device on this machine")
    return args


def resume_settings(args: argparse.Namespace) -> RunFolder:
    """The run folder of an organiser's run: a new one, or --resume's, whose settings (seed included) win."""
    if not args.resume:
        settings = {"seed": resolve_seed(args.seed), "katas": args.kata, "no_speed": args.no_speed,
                    "device": args.device, "threads": args.threads, "submissions": str(args.submissions.resolve())}
        return RunFolder.create(args.results_dir, settings)
    folder = RunFolder(args.results_dir, args.resume)
    settings = folder.settings()
    if args.seed is not None and args.seed != settings["seed"]:
        raise SystemExit(f"--resume {args.resume}: that run was graded with another seed; leave --seed out.")
    args.kata, args.no_speed, args.device, args.threads = (settings["katas"], settings["no_speed"],
                                                           settings["device"], settings["threads"])
    return folder


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.hint:
        print(next_hint(args.hint))
        return 0
    if args.hints_reset:
        print(reset_hints(args.hints_reset))
        return 0
    if args.make_certificates:
        from graders.competition.certificates import make

        ca, fleet = make(args.make_certificates)
        tls = f"--tls-ca-file {ca} --tls-cert {fleet} --tls-key {fleet}"
        print(f"Wrote {ca} and {fleet} (the fleet's key: copy {args.make_certificates} to every grading machine, and "
              f"to no one else). Then:\n  uv run dask scheduler --protocol tls --port 8786 {tls}\n"
              f"  uv run dask worker tls://HOST:8786 {tls} --nthreads $(nproc) --name $(hostname)\n"
              f"  uv run graders/score.py --submissions submissions/ --cluster tls://HOST:8786 "
              f"--certificates {args.make_certificates}")
        return 0
    if args.submit:
        from graders.arena.client import submit  # the live competition's client: no grading here

        return submit(args.submit, args.token, args.solutions, args.follow_timeout, retry_for=args.retry_for)
    organiser = args.submissions is not None
    folder = resume_settings(args) if organiser else None
    seed = folder.settings()["seed"] if organiser else resolve_seed(args.seed)
    selected = list(dict.fromkeys(args.kata or KATAS))
    available = [k for k in selected if is_available(k)]
    if args.isolate and sandbox_problem():
        print(f"WARNING: {sandbox_problem()}", file=sys.stderr, flush=True)
    with claimed_folder("fx-katas-staging-") as staging:  # removed by the next run if this one is killed
        if organiser:
            trees = stage_submissions(args.submissions, available, Path(staging))
            print(f"Grading {len(trees)} teams from {args.submissions} on {args.device}, one secret seed for all; "
                  f"run {folder.run} (if this process dies: --resume {folder.run}).", flush=True)
            from graders.competition.fleet import Fleet, FleetLost  # here: a learner's run needs no Dask

            try:
                with Fleet(args.cluster, timing_host=args.timing_host, device=args.device, threads=args.threads,
                           kata_timeout=args.kata_timeout, kata_memory=args.kata_memory, slots=args.jobs,
                           check_timeout=args.check_timeout, certificates=args.certificates) as fleet:
                    graded = grade_teams(fleet, {team: read_files(tree) for team, tree in trees.items()}, available,
                                         seed, not args.no_speed, folder)
            except FleetLost as lost:
                again = " ".join(["--resume", folder.run] + (["--cluster", args.cluster] if args.cluster else [])
                                 + (["--certificates", str(args.certificates)] if args.certificates else []))
                print(f"Stopped: {lost}. Nothing was stored as a team's result and {args.leaderboard} is unchanged; "
                      f"the jobs graded before are kept in run {folder.run}. Start the scheduler and its workers "
                      f"again, then run the same command with {again} to grade the rest.", file=sys.stderr, flush=True)
                return 3
        else:
            trees = {args.team or "": args.solutions}
            print(f"Grading {args.solutions} on {args.device} with seed {seed} (reproduce with --seed {seed}).", flush=True)
            graded = {args.team or "": grade_tree(args.solutions, available, args, seed)}
        runs = []
        for team, tree in trees.items():
            katas = {k: graded[team][k] if k in available else failed_grading("not available", "not yet available")
                     for k in selected}
            apply_scan(katas, scan_tree(tree, available))
            source = args.submissions / team if organiser else tree
            runs.append(make_run(team, tree, source, katas, seed, args))

    if organiser:
        print_teams(runs)
        print(f"The seed was {seed}: publish it after the competition so teams can reproduce their hidden models.")
    else:
        run = runs[0]
        print_table(run["katas"], run["total_points"], run["possible_points"])
        remember(args.solutions, run["katas"])
    if args.json:
        args.json.write_text(json.dumps(runs if organiser else runs[0], indent=1))
    with locked(args.results_dir):
        for run in runs:
            if run["team"]:
                print(f"Stored {run['team']}'s run as {store_run(args.results_dir, run)}.")
        for problem in regenerate(args.results_dir, args.leaderboard):
            print(f"warning: {problem}", file=sys.stderr)
    print(f"Wrote {args.leaderboard}.")
    hint = None if organiser else next_step(runs[0]["katas"], args)
    if hint:
        print(hint)
    return 0
