"""Chapter 2's exporter (graders/run/exported.py): one torch.export per model structure, its wiring included,
later models of the structure loaded from the saved bytes with their own weights, and copies of a program it
handed out loaded from the same bytes (no save) yet as independent as a saved and loaded one."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from graders.isolation import torch_private
from graders.run import exported
from graders.run.models import Program

X = (torch.randn(2, 3, 6, 6),)


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch):
    monkeypatch.setattr(exported, "_SAVED", {})


def conv_bn(program) -> Program:
    return Program(program, conv=nn.Conv2d(3, 4, 3), bn=nn.BatchNorm2d(4)).eval()


def targets(program) -> list[str]:
    return [str(n.target) for n in program.graph.nodes if n.op == "call_function"]


def test_two_wirings_of_the_same_modules_are_two_programs():
    # Same modules, same repr, same shapes: only forward differs. Keyed by repr alone, the second model got
    # the first one's program (no relu) with its own weights.
    plain, with_relu = conv_bn(lambda m, x: m.bn(m.conv(x))), conv_bn(lambda m, x: F.relu(m.bn(m.conv(x))))
    assert repr(plain) == repr(with_relu)
    trace = exported.exporter(lambda: X)
    a, b = trace(plain), trace(with_relu)
    assert "aten.relu.default" not in targets(a) and "aten.relu.default" in targets(b)
    x = torch.randn(2, 3, 6, 6)
    assert torch.allclose(a.module()(x), plain(x)) and torch.allclose(b.module()(x), with_relu(x))
    assert len(exported._SAVED) == 2


def test_a_model_of_a_known_structure_is_loaded_not_exported(monkeypatch):
    trace = exported.exporter(lambda: X)
    first = conv_bn(lambda m, x: F.relu(m.bn(m.conv(x))))
    trace(first)
    monkeypatch.setattr(torch_private, "export", lambda *a, **k: pytest.fail("exported again"))
    second = conv_bn(lambda m, x: F.relu(m.bn(m.conv(x))))
    program = trace(second)
    x = torch.randn(2, 3, 6, 6)
    assert torch.allclose(program.module()(x), second(x)) and not torch.allclose(program.module()(x), first(x))


def test_a_model_symbolic_trace_cannot_trace_is_exported_every_time(monkeypatch):
    model = conv_bn(lambda m, x: m.bn(m.conv(x)) if x.shape[-1] > 1 else x)  # fx cannot branch on a Proxy
    assert exported.structure(model, X) is None
    exports = []
    real = torch_private.export
    monkeypatch.setattr(torch_private, "export", lambda *a, **k: exports.append(1) or real(*a, **k))
    trace = exported.exporter(lambda: X)
    trace(model), trace(model)
    assert len(exports) == 2 and exported._SAVED == {}


def equal(a, b, guards: bool = True) -> None:
    assert exported.program_text(a) == exported.program_text(b)
    assert str(a.graph_signature) == str(b.graph_signature)
    assert str(a.range_constraints) == str(b.range_constraints)
    # A loaded program's guards are what torch writes for a program without sources (a fresh export's may differ).
    assert not guards or torch_private.guards_code(a) == torch_private.guards_code(b)
    assert a.state_dict.keys() == b.state_dict.keys() and a.constants.keys() == b.constants.keys()
    for name, t in a.state_dict.items():
        u = b.state_dict[name]
        assert type(t) is type(u) and t.requires_grad == u.requires_grad and t.stride() == u.stride()
        assert torch.equal(t, u) and t.data_ptr() != u.data_ptr()


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("exports_first", [True, False], ids=["exported", "loaded"])
def test_a_handed_out_program_is_copied_from_its_bytes_equal_and_independent(monkeypatch, dynamic, exports_first):
    shapes = ({0: torch.export.Dim("batch", min=1, max=16)},) if dynamic else None
    trace = exported.exporter(lambda: X, shapes)
    if not exports_first:
        trace(conv_bn(lambda m, x: F.relu(m.bn(m.conv(x)))))
    given = trace(conv_bn(lambda m, x: F.relu(m.bn(m.conv(x)))))
    saved_and_loaded = torch_private.load_program(torch_private.save_program(given))
    monkeypatch.setattr(torch_private, "save_program", lambda p: pytest.fail("copied by a save"))
    copy = exported.copy_program(given)
    equal(copy, given, guards=not exports_first)
    equal(copy, saved_and_loaded)
    # Independent: what a pass does to the program it was given leaves the copy as it was.
    next(n for n in given.graph.nodes if n.op == "call_function").target = torch.ops.aten.sigmoid.default
    next(iter(given.state_dict.values())).data.add_(1)
    equal(copy, saved_and_loaded)
    x = torch.randn(3 if dynamic else 2, 3, 6, 6)
    assert torch.allclose(copy.module()(x), saved_and_loaded.module()(x))


def test_a_program_changed_since_it_was_handed_out_is_saved_and_loaded(monkeypatch):
    given = exported.exporter(lambda: X)(conv_bn(lambda m, x: F.relu(m.bn(m.conv(x)))))
    relu = next(n for n in given.graph.nodes if n.target is torch.ops.aten.relu.default)
    relu.target = torch.ops.aten.sigmoid.default
    saves = []
    real = torch_private.save_program
    monkeypatch.setattr(torch_private, "save_program", lambda p: saves.append(1) or real(p))
    copy = exported.copy_program(given)
    assert saves == [1] and "aten.sigmoid.default" in targets(copy) and "aten.relu.default" not in targets(copy)
