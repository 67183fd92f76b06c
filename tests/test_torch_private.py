"""Chapter 2's footing: every private torch API the graders use still exists with the parameters they pass
(graders/isolation/torch_private.py), and a worker's torch.export program reaches the judge only as checked
data (graders/isolation/records/programs.py): no call target, expression, tensor file or guard of its own
choosing runs in the judge."""
import importlib
import io
import json
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from graders.frame.catalogue import REPO_ROOT
from graders.isolation import records, torch_private
from graders.isolation.records import programs
from graders.run import exported


def test_every_private_api_the_graders_call_is_there_with_its_parameters():
    assert torch_private.chapter_2_problem() is None, torch_private.chapter_2_problem()
    assert torch_private.signature_problems() == []
    # Attributes rather than callables: a program's guards code (compiled by ExportedProgram.module()), an
    # operator's schema (the exporter sets a BatchNorm's eps by its argument's name: graders/run/exported.py).
    assert isinstance(torch_private.guards_code(program()), list)
    assert torch_private.argument_names(torch.ops.aten._native_batch_norm_legit_no_training.default)[-2:] == \
        ["momentum", "eps"]
    # The one-trace export and run_decompositions() go by one table: export's own default one, as made now.
    assert set(torch_private._core_table()) == set(torch.export.default_decompositions().materialize())
    # The modules a zygote loads for katas 10-13 (graders/batch/zygote.py): a renamed one fails here, not in every
    # forked grading process.
    for name in torch_private.FIRST_USE_MODULES:
        importlib.import_module(name)


TABLE_AFTER_AN_IMPORT = """
import importlib
import torch
from graders.isolation import torch_private
torch_private._core_table()
importlib.import_module("torch._inductor.pattern_matcher")  # registers 13 more decompositions
print(set(torch_private._core_table()) == set(torch.export.default_decompositions().materialize()))
"""


def test_the_one_trace_and_run_decompositions_go_by_one_table_whatever_is_imported_between():
    """Importing Dynamo or Inductor registers more core decompositions: a table kept by the one-trace export from
    before such an import disagreed with the one run_decompositions() materialized after it. In a fresh process,
    as a grading process meets them: kata 11's exports first, kata 13's pattern matcher later."""
    out = subprocess.run([sys.executable, "-c", TABLE_AFTER_AN_IMPORT], capture_output=True, text=True, timeout=120,
                         cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert out.stdout.split() == ["True"], out.stderr[-2000:]


def test_exports_materialize_the_core_table_at_most_once_while_no_operator_is_registered(monkeypatch):
    """Materializing the default decomposition table costs 40-150 ms. The one-trace export asks, for each node,
    whether its op is in that table: a table made for each question (stop 55 to 57) made kata 11's grading 4x slower
    (12 s to 46 s of CPU, 531 materializations). Three exports of a 13-node program: one materialization at most."""
    from torch.export.decomp_utils import CustomDecompTable

    made = []
    materialize = CustomDecompTable.materialize
    monkeypatch.setattr(CustomDecompTable, "materialize", lambda self: (made.append(1), materialize(self))[1])
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU()).eval()
    for _ in range(3):
        program = torch_private.export(model, (torch.randn(1, 3, 8, 8),))
    assert len(program.graph.nodes) > 10 and len(made) <= 1, len(made)


def test_a_load_evaluates_each_schema_class_s_type_hints_once():
    """torch.export's deserializer evaluated the type hints of a schema class for every object it read, a third of a
    load (torch_private._hints_kept): they are kept per class. A second load of a program asks for no new class's
    hints, and both loads give the same program, which computes what the model does. If torch stops calling
    typing.get_type_hints through its module, nothing is kept and this fails: the loads are then as slow as before,
    not wrong."""
    from torch._export.serde import serialize

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8)
    program = torch_private.export(model, (x,))
    first = torch_private.load_program(torch_private.save_program(program))
    kept = serialize.typing.hints
    assert isinstance(serialize.typing, torch_private._TypingWithHintsKept) and kept
    classes = len(kept)
    second = torch_private.load_program(torch_private.save_program(program))
    assert len(kept) == classes
    assert str(first.graph) == str(second.graph)
    torch.testing.assert_close(second.module()(x), model(x))


def test_the_block_timer_times_one_block_of_the_calls_it_chose():
    """What the speed level relies on in torch.utils.benchmark (graders/run/timing.py): blocked_autorange with no
    minimum time runs exactly one block, of the size the private _estimate_block_size gives."""
    calls = []
    timer = torch_private.block_timer("fn()", globals={"fn": lambda: calls.append(1)})
    timer.calls = 7
    measurement = timer.blocked_autorange(min_run_time=0)
    assert (measurement.number_per_run, len(measurement.raw_times), len(calls)) == (7, 1, 7)
    timer.choose_calls(0.01)
    assert timer.calls > 7  # a call of a few microseconds: a block of 10 ms holds thousands


def test_a_missing_or_changed_api_is_named_in_a_sentence(monkeypatch):
    monkeypatch.setattr(torch_private, "USED", [("torch._guards", "no_such_function", ()),
                                                ("torch._guards", "detect_fake_mode", ("inputs", "renamed"))])
    first, second = torch_private.signature_problems()
    assert first.startswith("torch._guards.no_such_function is gone in torch ")
    assert "the graders pass renamed" in second


@pytest.fixture(scope="module")
def saved():
    return torch_private.program_parts(program())


def program(dynamic: bool = True):
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).eval()
    shapes = ({0: torch.export.Dim("batch", min=1, max=16)},) if dynamic else None
    return torch_private.export(model, (torch.randn(2, 3, 6, 6),), shapes)


def rebuilt(parts: dict, edit=None):
    data = json.loads(parts["program"])
    if edit:
        edit(data)
    return programs.rebuild({**parts, "program": json.dumps(data).encode()})


def test_a_program_travels_as_checked_data_and_computes_what_it_did(saved):
    original = program()
    blob = records.record_values({"result": original})
    back = records.rebuild_values(blob)["result"]
    assert isinstance(back, torch.export.ExportedProgram)
    x = torch.randn(5, 3, 6, 6)
    assert torch.equal(back.module()(x), original.module()(x))
    assert str(back.range_constraints) == str(original.range_constraints)
    assert all("val" in n.meta for n in back.graph.nodes if n.op != "output")


@pytest.mark.parametrize("edit, refusal", [
    (lambda d: d["graph_module"]["graph"]["nodes"][0].update(target="torch.os.system"), "calls 'torch.os.system'"),
    (lambda d: d["graph_module"]["graph"]["nodes"][0].update(target="torch.ops.aten.from_file.default"), "from_file"),
    (lambda d: d["graph_module"]["graph"]["nodes"][0].update(target="torch.ops.higher_order.cond"), "higher_order"),
    (lambda d: d.update(range_constraints={"__import__('os').getcwd()": {"min_val": 1, "max_val": 2}}),
     "holds characters no size expression has"),
    (lambda d: d["graph_module"]["graph"]["sym_int_values"].update(
        s={"as_expr": {"expr_str": "Symbol('os.getcwd()')", "hint": None}}), "quotes 'os.getcwd()'"),
    (lambda d: d["graph_module"]["graph"]["sym_int_values"].update(
        s={"as_expr": {"expr_str": "exec(Symbol('s1'))", "hint": None}}), "names 'exec'"),
    (lambda d: d["graph_module"]["graph"]["nodes"][0]["inputs"].append({"name": "g", "arg": {"as_graph": {}}, "kind": 1}),
     "no nested graph"),
    (lambda d: d["graph_module"]["graph"].update(custom_obj_values={"obj0": {"name": "obj0", "class_fqn": "a.B"}}),
     "holds script objects"),
])
def test_the_judge_refuses_what_torch_would_run_or_evaluate(saved, edit, refusal):
    with pytest.raises(records.RecordError, match=None) as raised:
        rebuilt(saved, edit)
    assert refusal in str(raised.value), str(raised.value)


def test_tensors_load_weights_only_and_must_be_tensors(saved):
    buffer = io.BytesIO()
    torch.save({"0.weight": "not a tensor"}, buffer)
    with pytest.raises(records.RecordError, match="holds something other than named tensors"):
        programs.rebuild({**saved, "state_dict": buffer.getvalue()})


def test_a_workers_guards_code_is_dropped_and_the_given_programs_compiled(saved):
    planted = "__import__('os').system('touch /tmp/fx-katas-guard-ran')"
    back = rebuilt(saved, lambda d: d.update(guards_code=[planted]))
    assert torch_private.guards_code(back) == []  # never compiled by back.module()
    given = program()
    torch_private.set_guards_code(given, ["L['input'].size()[0] <= 16"])
    assert isinstance(exported.settle(back, given, "fuse_conv_bn"), torch.fx.GraphModule)
    assert torch_private.guards_code(back) == ["L['input'].size()[0] <= 16"]


@pytest.mark.parametrize("loaded", [False, True], ids=["fresh_export", "loaded_from_bytes"])
def test_the_shape_env_records_a_guard_whether_a_program_was_exported_or_loaded(loaded):
    # torch writes guards code only for a fresh export's symbols (they have sources); the ShapeEnv behind the
    # fake values records what int() specialises either way, and shape_guards finds it from the program.
    given = program()
    if loaded:
        given = torch_private.load_program(torch_private.save_program(given))
    before = torch_private.shape_guards(given)
    conv = next(n for n in given.graph.nodes if n.op == "call_function")
    int(conv.meta["val"].shape[0])
    added = torch_private.guards_added(before, [{"result": given}])
    assert len(added) == 1 and re.fullmatch(r"Eq\(s\d+, 2\)", added[0]), added
    assert torch_private.shape_guards(program(dynamic=False)) == [] and torch_private.shape_guards(["no graph", 3]) == []


def test_an_aten_graph_travels_as_a_graph_record():
    def attention(q, k):
        return torch.softmax(q @ k.transpose(-1, -2) * 0.5, -1) @ k

    q, k = torch.randn(2, 4, 8), torch.randn(2, 4, 8)
    gm = torch_private.aten_graph(attention, (q, k), decompositions=torch_private.inductor_decompositions())
    assert any(str(n.target).startswith("aten.") for n in gm.graph.nodes if n.op == "call_function")
    back = records.rebuild(records.record(gm))
    assert torch.equal(back(q, k), gm(q, k))


def test_the_exporter_copies_a_structure_from_bytes_with_the_new_models_weights():
    def make():
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).eval()

    trace = exported.exporter(lambda: (torch.randn(2, 3, 6, 6),))
    first, second = make(), make()
    a, b = trace(first), trace(second)
    x = torch.randn(2, 3, 6, 6)
    assert torch.allclose(a.module()(x), first(x)) and torch.allclose(b.module()(x), second(x))
    assert not torch.equal(a.module()(x), b.module()(x))
