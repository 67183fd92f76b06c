"""The worker process: the only place a solution's code runs when grading is isolated (--isolate, and
always in organiser mode). `python -m graders.isolation.serve SOLUTION KATA THREADS`, started by the
judge (graders/isolation/worker.py), usually inside the sandbox (graders/isolation/sandbox.py).

It imports the solution, says hello, then answers requests until its channel closes: each request is a
call of a learner function on arguments the judge built; each reply is data only (records of modules and
tensors, graders/isolation/records/), never code. Whatever the solution does to this process stays here.
The learner's pass computes here (on the judge's device: a fold, a folded constant), in full float32 as
the judge does (graders/isolation/precision.py: TF32 off; on a CPU torch's defaults anyway).

Around the call it measures the guards the pass added to the ShapeEnvs behind the fake values of its arguments
and result (torch_private.guards_added: a pass that specialised a size symbol, chapter 2) and sends them as text.

May import: graders.frame, graders.isolation (channel, records, precision, torch_private), and a kata's models (by
name, to warm up).
"""
from __future__ import annotations

import io
import os
import pickle
import sys
from pathlib import Path

from graders.isolation import precision
from graders.isolation.channel import read_frame, write_frame


def _reply(**fields) -> bytes:
    """A reply the judge loads with weights_only=True: strings, bools, lists of strings, and record bytes."""
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

    from graders.frame.levels import CheckFailed
    from graders.frame.solution import describe_exception, kind_of, load_solution
    from graders.isolation import records, torch_private

    try:
        solution = load_solution(solution_path, kata)
    except CheckFailed as failure:
        write_frame(channel_out, _reply(ok=False, message=str(failure)))
        return
    write_frame(channel_out, _reply(ok=True))
    while True:
        try:
            request = pickle.loads(read_frame(channel_in))
        except EOFError:
            return
        if request["kind"] == "defines":
            write_frame(channel_out, _reply(ok=True, kind=kind_of(getattr(solution, request["name"], None))))
            continue
        function, args, watch = request["function"], request["args"], request["watch"]
        fn = getattr(solution, function, None)
        if not callable(fn):
            write_frame(channel_out, _reply(ok=False, failure="missing"))
            continue
        guards = torch_private.shape_guards(args)
        try:
            result = fn(*args, **request.get("kwargs", {}))
        except NotImplementedError:
            write_frame(channel_out, _reply(ok=False, failure="stub"))
            continue
        except Exception as exc:  # noqa: BLE001 - the learner's exception, told as a sentence
            write_frame(channel_out, _reply(ok=False, failure="raised", message=describe_exception(exc, solution_path)))
            continue
        # Modules and tensors among the arguments come back (a pass may rewrite the module it is given);
        # anything else (a function the grader passed) the judge still holds. Watched objects, and argument
        # modules that are not GraphModules, come back as their state, never traced: the judge inspects
        # them, it does not run them (and tracing runs forward, which may update buffers).
        values = {"result": result, **{f"arg{i}": a for i, a in enumerate(args) if isinstance(a, (nn.Module, torch.Tensor))},
                  **{f"watch{i}": w for i, w in enumerate(watch)}}
        try:
            added_guards = torch_private.guards_added(guards, (args, result))  # before anything else touches them
            _without_hooks(list(values.values()))
            state_only = [name for name, value in values.items() if name != "result" and isinstance(value, nn.Module)
                          and not isinstance(value, torch.fx.GraphModule)]
            blob = records.record_values(values, structure=tuple(state_only))
        except Exception as exc:  # noqa: BLE001 - a RecordError, or e.g. an attribute torch.save cannot pickle
            message = str(exc) if isinstance(exc, records.RecordError) else f"{type(exc).__name__}: {exc}"
            write_frame(channel_out, _reply(ok=False, failure="record", message=message))
            continue
        write_frame(channel_out, _reply(ok=True, values=blob, type=type(result).__name__, guards=added_guards))


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
    precision.apply()  # before any solution code: full float32, as the judge (graders/run/session.py)
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


if __name__ == "__main__":
    main(sys.argv[1:])
