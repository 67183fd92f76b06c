"""Structure: what the rewritten graph contains, and whether it is a valid, freshly compiled GraphModule.

May import: graders.frame.
"""
from __future__ import annotations

import contextlib
import io

import torch.fx as fx

from graders.frame.levels import CheckFailed


def call_module_nodes(gm: fx.GraphModule, module_type: type) -> list[fx.Node]:
    modules = dict(gm.named_modules())
    return [n for n in gm.graph.nodes if n.op == "call_module" and isinstance(modules.get(n.target), module_type)]


def graph_table(gm: fx.GraphModule) -> str:
    """The graph as `Graph.print_tabular` shows it."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        gm.graph.print_tabular()
    return out.getvalue().rstrip()


def before_after(before: fx.GraphModule, after: fx.GraphModule) -> str:
    return f"\n\nGraph before the pass:\n{graph_table(before)}\n\nGraph after the pass:\n{graph_table(after)}"


def assert_valid_graph_module(gm, function: str, *, in_place: bool = False) -> None:
    """A GraphModule whose graph passes `Graph.lint()` and whose generated code matches the graph.

    `in_place`: the pass rewrites the GraphModule it was given rather than returning one."""
    whose = f"{function} was given, after the call," if in_place else f"{function} returned"
    if not isinstance(gm, fx.GraphModule):
        raise CheckFailed(f"{function} returned a {type(gm).__name__}, not a torch.fx.GraphModule.")
    try:
        gm.graph.lint()
    except Exception as exc:
        raise CheckFailed(f"Graph.lint() rejects the graph {function} {whose.split(' ', 1)[1]}: {exc}") from None
    if getattr(gm, "recorded_stale_code", False) or gm.code != gm.graph.python_code(root_module="self").src:
        raise CheckFailed(
            f"the GraphModule {whose} runs stale code: its graph was edited but its forward was "
            "not regenerated. Call gm.recompile() after editing gm.graph."
        )
