"""Calibrate the speed thresholds: grade every kata's reference and no-op N times on a device, propose a threshold.

    uv run bench/calibrate.py --device cuda              # on a GPU: 20 gradings per side and kata, prints only
    uv run bench/calibrate.py --device cuda --write      # ... and records the proposals in the manifests
    uv run bench/calibrate.py --device cpu -n 3 --kata 03_conv_bn --kata 04_dce

The readings come from bench/speed_fidelity.py (`collect`: the speed level, L3, graded exactly as
`pytest katas/<name>` grades it, alternately for the reference and the kata's no-op, a new seed each time).
Per kata it prints the readings, the current threshold and whether it was calibrated on this device, and a
proposal: the reference's slowest reading less a margin (default 20%, `--margin`), rounded down to 0.05,
kept at least 10% above the no-op's fastest reading (`--headroom`) where the no-op is timed (katas whose
no-op fails on the exact byte count need only the reference's side). Where no threshold fits between the
two it proposes none and says why. It writes nothing unless asked: `--write` sets `threshold.<device>`
and `calibrated.<device> = "<device name>, <date>, <N> gradings"` in each proposed kata's kata.toml
([speed] only, the rest of the file as it was); the kata's README must then quote the new threshold
(`uv run python -m graders.devcheck` lists what is left).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from tabulate import tabulate

from speed_fidelity import Readings, collect, spread  # this folder: `uv run bench/calibrate.py` puts it on the path

from graders.competition.organiser import device_name
from graders.frame.catalogue import KATAS, grader_folder, load_grader

STEP = 0.05  # thresholds are proposed in steps of 0.05x


@dataclass(frozen=True)
class Proposal:
    threshold: float | None
    margin: float | None    # the reference's slowest reading over the threshold, less 1
    headroom: float | None  # the threshold over the no-op's fastest timed reading, less 1
    note: str


def propose(found: Readings, margin: float = 0.2, headroom: float = 0.1) -> Proposal:
    """A threshold the reference clears by `margin` at its slowest reading and a timed no-op misses by `headroom`
    at its fastest; the closest compromise where both do not fit, or none where the two overlap."""
    if not found.reference:
        return Proposal(None, None, None, "the reference read no speedup (did its speed level fail before timing?)")
    ref_min, ref_max = min(found.reference), max(found.reference)
    wanted = math.floor(ref_min / (1 + margin) / STEP + 1e-9) * STEP
    notes = []
    if found.no_op:
        floor = max(found.no_op) * (1 + headroom)
        if wanted < floor:
            if ref_min <= floor:
                return Proposal(None, None, None, f"cannot tell the reference (slowest {ref_min:.2f}x) from a no-op "
                                f"(fastest {max(found.no_op):.2f}x) by time: count bytes, or a larger benchmark")
            wanted = math.ceil(floor / STEP - 1e-9) * STEP
            if wanted >= ref_min:  # the 0.05 grid has no room: the midpoint
                wanted = round(math.sqrt(floor * ref_min), 2)
            notes.append(f"thin: under the {margin:.0%} margin, to stay {headroom:.0%} over the no-op")
    elif found.no_op_on_bytes:
        notes.append("the no-op fails on bytes: only the reference bounds the time threshold")
    if wanted <= 0:
        return Proposal(None, None, None, f"the reference is slower than the original ({ref_min:.2f}x)")
    if wanted < 1.0:
        notes.append("under 1.0x: the byte count carries this level" if found.no_op_on_bytes
                     else "under 1.0x: the rewrite is not faster here")
    if ref_max > 4 * wanted:
        notes.append(f"the reference's fastest reading {ref_max:.2f}x is over 4x the threshold: check the "
                     "implausibility ceiling (graders/run/timing.py)")
    return Proposal(round(wanted, 2), ref_min / wanted - 1, wanted / max(found.no_op) - 1 if found.no_op else None,
                    "; ".join(notes))


def calibration_record(device: str, n: int, today: datetime.date | None = None) -> str:
    """"<device name>, <date>, <N> gradings": what the manifest's `calibrated` keeps per device."""
    name = device_name(device) + (f" ({len(os.sched_getaffinity(0))} cores, 1 thread)" if device == "cpu" else "")
    return f"{name}, {(today or datetime.date.today()).isoformat()}, {n} gradings"


_INLINE = re.compile(r"^(?P<key>threshold|calibrated)(?P<eq>\s*=\s*)(?P<table>\{[^}]*\})(?P<rest>.*)$")


def _inline(values: dict) -> str:
    return "{ " + ", ".join(f"{k} = {json.dumps(v) if isinstance(v, str) else repr(float(v))}" for k, v in values.items()) + " }"


def updated_manifest(text: str, device: str, threshold: float, record: str) -> str:
    """kata.toml's text with threshold.<device> and calibrated.<device> set in [speed], every other line,
    comment and section as it was."""
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.strip() == "[speed]")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("[")), len(lines))
    found = {}
    for i in range(start + 1, end):
        match = _INLINE.match(lines[i].rstrip("\n"))
        if match:
            found[match["key"]] = (i, match)
    if "threshold" not in found:
        raise ValueError(f"no `threshold = {{ ... }}` line in [speed] (lines {start + 1}-{end})")
    for key, value in (("threshold", threshold), ("calibrated", record)):
        if key in found:
            i, match = found[key]
            table = {**tomllib.loads(f"t = {match['table']}")["t"], device: value}
            lines[i] = f"{key}{match['eq']}{_inline(table)}{match['rest']}\n"
        else:
            lines.insert(found["threshold"][0] + 1, f"calibrated = {_inline({device: value})}\n")
    updated = "".join(lines)
    speed = tomllib.loads(updated)["speed"]  # still valid TOML, and says what was meant
    assert speed["threshold"][device] == threshold and speed["calibrated"][device] == record
    return updated


def row(found: Readings, proposal: Proposal) -> list:
    grader = load_grader(found.kata)
    current = grader.thresholds.get(found.device)
    no_op = "-" if not found.has_no_op else spread(found.no_op) + (
        f", bytes {found.no_op_on_bytes} of {found.n}" if found.no_op_on_bytes else "") if found.no_op else (
        f"bytes ({found.no_op_on_bytes} of {found.n})")
    return [found.kata, f"{current}x" if current else "-", "yes" if found.device in grader.calibrated else "no",
            spread(found.reference), f"{found.wrong_ref}/{found.n}", no_op, f"{found.wrong_no_op}/{found.n}"
            if found.has_no_op else "-", f"{proposal.threshold:g}x" if proposal.threshold else "none",
            f"{proposal.margin:+.0%}" if proposal.margin is not None else "-",
            f"{proposal.headroom:+.0%}" if proposal.headroom is not None else "-", proposal.note]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], required=True, help="grade and time on this device")
    parser.add_argument("-n", type=int, default=20, help="gradings of each side per kata (default 20)")
    parser.add_argument("--kata", action="append", choices=list(KATAS), help="only this kata (repeatable)")
    parser.add_argument("--margin", type=float, default=0.2,
                        help="the reference's slowest reading must clear the threshold by this much (default 0.2)")
    parser.add_argument("--headroom", type=float, default=0.1,
                        help="the threshold must clear a timed no-op's fastest reading by this much (default 0.1)")
    parser.add_argument("--write", action="store_true",
                        help="record each proposal in its kata.toml: threshold and calibrated (device, date, N)")
    args = parser.parse_args(argv)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error("--device cuda: torch sees no CUDA device on this machine")
    record = calibration_record(args.device, args.n)
    print(f"Calibrating on {args.device} ({record}).", file=sys.stderr, flush=True)
    rows, proposals, started = [], {}, time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        for kata in args.kata or list(KATAS):
            found = collect(kata, args.n, Path(scratch) / kata, args.device)
            proposals[kata] = propose(found, args.margin, args.headroom)
            if not found.reference and args.device not in load_grader(kata).thresholds:
                proposals[kata] = Proposal(None, None, None, f"no time threshold on {args.device}: L3 is the exact "
                                           "count alone there (the kata.toml says why)")
            rows.append(row(found, proposals[kata]))
            print(f"{kata} done in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    print(tabulate(rows, headers=["kata", "threshold", "calibrated", "reference min / median / max", "reference failed",
                                  "no-op min / median / max", "no-op passed", "proposed", "margin", "no-op headroom",
                                  "note"]))
    print(f"\n{args.n} gradings per side and kata on {args.device}, {time.monotonic() - started:.0f} s in all.")
    if not args.write:
        print("Nothing written (--write records the proposals in the manifests).")
        return 0
    for kata, proposal in proposals.items():
        if proposal.threshold is None:
            print(f"{kata}: no proposal, manifest left as it was.")
            continue
        path = grader_folder(kata) / "kata.toml"
        path.write_text(updated_manifest(path.read_text(), args.device, proposal.threshold, record))
        print(f"{kata}: {path} now holds threshold.{args.device} = {proposal.threshold:g} ({record}); "
              f"katas/{kata}/README.md must quote it.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
