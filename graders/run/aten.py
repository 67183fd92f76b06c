"""Chapter 2's make_fx graphs (kata 13): what Inductor's post-grad passes see, and the checks of a graph a pass
rewrote there.

- `aten_tracer(example, dynamic)` makes a `Case.trace`: the model traced by make_fx with Inductor's
  decomposition table on fake inputs whose chosen dimensions are size symbols (the rest static). Every node
  carries `meta['val']`; the GraphModule's `meta["fake_inputs"]` says how its inputs were made (so a worker
  can make them again: graders/isolation/channel.py);
- `val_descriptions(gm)`: each node's `meta['val']` as text (shape with its symbols, stride, dtype), from the
  fake tensors themselves, or from what a worker's record described (graders/isolation/records/).

The guards a pass added to the ShapeEnv are measured around its call (`Run.added_guards`: graders/run/harness.py).

May import: graders.frame, graders.isolation (torch_private, records, channel's `travelling_fakes`).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.fx as fx
import torch.nn as nn

from graders.frame.lifetimes import FIRST_TRACE, long_lived
from graders.isolation import torch_private
from graders.isolation.channel import travelling_fakes
from graders.isolation.records import describe_value


def aten_tracer(example: Callable[[], tuple], dynamic: tuple) -> Callable[[nn.Module], fx.GraphModule]:
    """A `Case.trace`: `model` traced on fakes of `example()` whose dimensions `dynamic[i]` (per input, a tuple of
    dimension indices) are symbolic."""

    def trace(model: nn.Module) -> fx.GraphModule:
        tensors = example()
        device = next(iter(model.parameters()), torch.empty(0)).device
        tensors = tuple(t.to(device) for t in tensors)
        dims = [set(dynamic[i]) if i < len(dynamic) else set() for i in range(len(tensors))]
        # A process's first trace imports sympy (the fakes' ShapeEnv), Dynamo and Inductor's decompositions. No grad:
        # an inference graph, as Inductor's (with grad, softmax's saved output adds an alias).
        with long_lived(FIRST_TRACE), torch.no_grad():
            fakes, described = travelling_fakes(list(tensors), dims)
            gm = torch_private.aten_graph(model, tuple(fakes), decompositions=torch_private.inductor_decompositions(),
                                          tracing_mode="symbolic")
        gm.meta["fake_inputs"] = described
        return gm

    return trace


def val_descriptions(gm: fx.GraphModule) -> dict[str, str]:
    """{node name: its meta['val'] as text} for every node that carries one (or a worker's description of it)."""
    found = {}
    for node in gm.graph.nodes:
        if "recorded_val" in node.meta:
            found[node.name] = node.meta["recorded_val"]
        elif "val" in node.meta:
            found[node.name] = describe_value(node.meta["val"])
    return found
