"""The channel between the judge and a worker: length-prefixed frames over a pair of pipes, and requests
pickled by cloudpickle (the judge's own objects: models whose classes the grader made on the fly
included). Replies are not pickled: the worker sends data the judge loads with torch.load(weights_only=True)
(graders/isolation/serve.py, graders/isolation/records/).

An ATen graph traced on fake inputs (kata 12: graders/run/functionalized.py; kata 13: graders/run/aten.py) holds
fake tensors in its nodes' meta['val'], which no pickler can carry: the judge traces it on `travelling_fakes` and
keeps their description in `gm.meta["fake_inputs"]`; it travels without them and the worker makes them again from
that description (the same size symbols, by name: graders/isolation/torch_private.py, `symbolic_fakes`).

May import: the standard library, torch, cloudpickle, graders.isolation.torch_private.
"""
from __future__ import annotations

import io
import os
import select
import struct
import time

_HEADER = struct.Struct("<Q")
MAX_REPLY_BYTES = 2**31  # a reply larger than this is an attack on the judge's memory, not a rewritten graph


def write_frame(fd: int, data: bytes) -> None:
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


def read_frame(fd: int, deadline: float | None = None, limit: int = MAX_REPLY_BYTES) -> bytes:
    (size,) = _HEADER.unpack(_read_exactly(fd, _HEADER.size, deadline))
    if size > limit:
        raise EOFError(f"a frame of {size} bytes")
    return _read_exactly(fd, size, deadline)


# A GraphModule travels as its graph and attributes, not as the code it regenerates from (GraphModule's own
# pickling re-traces that code, which fails for graphs built by hand).

def _new_graph_module(class_name: str):
    import torch.fx as fx

    gm = fx.GraphModule.__new__(fx.GraphModule)  # an instance of a fresh subclass, as GraphModule makes
    type(gm).__name__ = class_name
    return gm


def _set_graph_module_state(gm, state: dict) -> None:
    gm.__dict__.update(state)
    if gm.meta.get("fake_inputs"):
        _refake(gm)
    gm.recompile()


def _without_fakes(gm) -> dict:
    """The GraphModule's state with a copy of its graph whose nodes keep no fake tensor in their meta."""
    import copy

    graph = copy.deepcopy(gm.graph)
    for node in graph.nodes:
        node.meta = {key: value for key, value in node.meta.items() if key in ("stack_trace", "seq_nr")}
    return {**{k: v for k, v in gm.__dict__.items() if k != "shape_env"}, "_graph": graph}


def _op_overload(name: str):
    """An ATen or prims operator overload by its name ("aten.bmm.default"): cloudpickle cannot pickle one."""
    import torch

    namespace, packet, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)


def travelling_fakes(tensors: list, dynamic: list) -> tuple[list, list]:
    """Fake copies of `tensors` to trace a graph on (`dynamic[i]`: the dimensions of tensor i that are size symbols,
    the rest static: torch_private.symbolic_fakes), and their description for the GraphModule's
    `meta["fake_inputs"]`, from which a worker makes the same fakes again (`_refake`)."""
    from graders.isolation import torch_private

    fakes = torch_private.symbolic_fakes(list(tensors), [set(d) for d in dynamic])
    described = [(tuple(t.shape), tuple(t.stride()), str(t.dtype).removeprefix("torch."), str(t.device),
                  tuple(sorted(d))) for t, d in zip(tensors, dynamic)]
    return fakes, described


def _refake(gm) -> None:
    """meta['val'] on every node again: the graph run on fake inputs made as the judge made them."""
    import torch

    from graders.isolation import torch_private

    gm.graph = gm.__dict__["_graph"]  # the setter: the copy's owning module is this GraphModule
    inputs = gm.meta["fake_inputs"]
    tensors = [torch.empty_strided(shape, stride, dtype=getattr(torch, dtype), device=device)
               for shape, stride, dtype, device, _ in inputs]
    fakes = torch_private.symbolic_fakes(tensors, [set(dims) for *_, dims in inputs])
    torch_private.propagate_fake(gm, fakes, torch_private.fake_mode(fakes))


def _load_program(data: bytes):
    """A torch.export program the judge saved (torch_private.save_program): cloudpickle cannot pickle one (its
    fake tensors' mode holds weak references). The judge's own bytes: the worker may load them."""
    from graders.isolation import torch_private

    return torch_private.load_program(data)


def dumps_request(request: dict) -> bytes:
    import cloudpickle
    import torch
    import torch.fx as fx

    from graders.isolation import torch_private

    class Pickler(cloudpickle.Pickler):
        def reducer_override(self, obj):
            if torch_private.is_op_overload(obj):
                return _op_overload, (str(obj),)
            if isinstance(obj, torch.export.ExportedProgram):
                return _load_program, (torch_private.save_program(obj),)
            if isinstance(obj, fx.GraphModule):
                state = _without_fakes(obj) if obj.meta.get("fake_inputs") else dict(obj.__dict__)
                return _new_graph_module, (type(obj).__name__,), state, None, None, _set_graph_module_state
            return super().reducer_override(obj)

    buffer = io.BytesIO()
    Pickler(buffer).dump(request)
    return buffer.getvalue()
