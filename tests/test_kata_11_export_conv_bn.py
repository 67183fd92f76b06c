"""Kata 11's bad inputs each get one sentence naming what is wrong, not a traceback: a pass that returns a
GraphModule where a program is expected, a program that does not validate, a node without meta['val'], a
guard the pass added (a symbolic batch read as an int: the same sentence for a program exported afresh or loaded
from an earlier export's bytes, in process or isolated), an output returned in another layout. Each solution is
the reference with an ending of its own."""
import re
import sys

import pytest

from graders.frame.catalogue import REPO_ROOT, load_grader
from graders.isolation import torch_private
from graders.run import exported
from graders.run.session import GradingSession

pytestmark = pytest.mark.locks_per_check  # grades in process: tests/conftest.py

KATA = "11_export_conv_bn"
REFERENCE = (REPO_ROOT / "reference" / KATA / "solution.py").read_text()


def verdict(tmp_path, ending: str, check: str = "single_pair", level: int = 1, isolate: bool = False) -> str:
    """The message of one check of the reference whose fuse_conv_bn result goes through `ending` first (graded in a
    worker where `isolate`)."""
    folder = tmp_path / KATA
    folder.mkdir(parents=True)
    (folder / "solution.py").write_text(REFERENCE.replace("def fuse_conv_bn(", "def _fuse_conv_bn(") + f"""

def fuse_conv_bn(ep):
    new = _fuse_conv_bn(ep)
{ending}
""")
    session = GradingSession(tmp_path, seed=0, isolate=isolate)
    try:
        result = session.run(next(c for c in load_grader(KATA).checks_at(level) if c.name == check))
    finally:
        session.close()
    assert not result.passed
    assert "Traceback" not in result.message and "could not finish" not in result.message, result.message
    return result.message


def test_a_graph_module_where_a_program_is_expected(tmp_path):
    message = verdict(tmp_path, "    return new.module()")
    assert "fuse_conv_bn returned a GraphModule; the kata asks for fuse_conv_bn(ep: torch.export.ExportedProgram)" \
           in message, message


def test_a_program_that_does_not_validate(tmp_path):
    message = verdict(tmp_path, "    new.state_dict.pop(next(iter(new.state_dict)))\n    return new")
    assert "the program fuse_conv_bn returned" in message and ("does not validate" in message
                                                               or "cannot be turned into a module" in message), message


def test_a_node_without_meta_val(tmp_path):
    message = verdict(tmp_path, "    del next(n for n in new.graph.nodes if n.op == 'call_function').meta['val']\n"
                                "    return new")
    # torch's verifier names it first (ExportedProgram.validate: "Node.meta convolution is missing val field").
    assert "carry no meta['val']" in message or ("does not validate" in message and "convolution" in message
                                                  and "val" in message), message


@pytest.mark.parametrize("isolate", [False, True], ids=["in_process", "isolated"])
def test_a_guard_the_pass_added(tmp_path, monkeypatch, isolate):
    # The structure's first program is a fresh export, the second a copy loaded from its bytes, whose symbols have
    # no sources: torch writes no guards code for them, but the ShapeEnv records the guard all the same, and the
    # run path reads the ShapeEnv around the call, where the pass ran (a worker always gets a loaded copy).
    monkeypatch.setattr(exported, "_SAVED", {})
    exports, export = [], torch_private.export
    monkeypatch.setattr(torch_private, "export", lambda *a, **k: exports.append(a) or export(*a, **k))
    for program in ("fresh", "loaded"):
        message = verdict(tmp_path / program, "    int(next(n for n in ep.graph.nodes if n.op == 'call_function')"
                                              ".meta['val'].shape[0])\n    return _fuse_conv_bn(ep)",
                          check="dynamic_batch", level=2, isolate=isolate)
        assert re.search(r"fuse_conv_bn added the guard\(s\) Eq\(s\d+, 2\) to the ShapeEnv of the program it was "
                         r"given: reading a size symbol's value", message), (program, message)
        assert "Hint: a rewrite keeps the program's shapes general" in message, message
    assert len(exports) == 1, "the second program was exported afresh, not loaded from the first one's bytes"


def test_an_output_in_another_layout_than_the_given_programs(tmp_path, monkeypatch):
    # A contiguous folded weight for a channels_last model: the values agree, the returned layout does not.
    contiguous = REFERENCE.replace("return weight.to(dtype), bias.to(dtype)",
                                   "return weight.to(dtype).contiguous(), bias.to(dtype)")
    assert contiguous != REFERENCE
    monkeypatch.setattr(sys.modules[__name__], "REFERENCE", contiguous)
    message = verdict(tmp_path, "    return new", check="channels_last", level=2)
    assert ("gives its output 0 with strides (648, 81, 9, 1); the program it was given returns it with strides "
            "(648, 1, 72, 8)") in message, message
    assert "Hint: keep the folded weight in the layout of the weight it replaces" in message, message
