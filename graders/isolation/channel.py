"""The channel between the judge and a worker: length-prefixed frames over a pair of pipes, and requests
pickled by cloudpickle (the judge's own objects: models whose classes the grader made on the fly
included). Replies are not pickled: the worker sends data the judge loads with torch.load(weights_only=True)
(graders/isolation/serve.py, graders/isolation/records/).

May import: the standard library, torch, cloudpickle.
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
    gm.recompile()


def dumps_request(request: dict) -> bytes:
    import cloudpickle
    import torch.fx as fx

    class Pickler(cloudpickle.Pickler):
        def reducer_override(self, obj):
            if isinstance(obj, fx.GraphModule):
                return _new_graph_module, (type(obj).__name__,), dict(obj.__dict__), None, None, _set_graph_module_state
            return super().reducer_override(obj)

    buffer = io.BytesIO()
    Pickler(buffer).dump(request)
    return buffer.getvalue()
