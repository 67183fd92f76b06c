"""The run path: how one check of one kata runs, and the vocabulary every kata grader speaks.

A kata grader (graders/katas/kata_<name>/) imports only this package: the frame's declarations (`Kata`,
`CheckFailed`, `Mutant`), the harness's records (`Case`, `Pass`, `Run`) and the measurements (numerics,
structure, timing, model helpers). The modules behind it:

- session.py: a grading session (one solution tree, seed, device), a check's `Context`, `grade`;
- harness.py: the one run path (a case placed on the device, copied, traced, passed, linted, compared);
- numerics.py, structure.py, timing.py: what a check measures (outputs, graphs, speed and exact costs);
- models.py: building graded models with random names (hidden models) and models as data;
- aten.py: chapter 2's make_fx graphs as Inductor's post-grad passes see them (kata 13) and their meta['val'];
- exported.py: chapter 2's torch.export programs (exported once per model structure, copied from bytes) and
  the checks of a program a pass returned.

May import: graders.frame, graders.isolation (a session runs solution code in a worker when isolated).
"""
from graders.frame.catalogue import REPO_ROOT, manifest, reference_source
from graders.frame.mutant import Mutant, Variant
from graders.run import aten, exported, harness
from graders.run.aten import aten_tracer
from graders.run.exported import ExportedProgram, assert_program_sound, copy_program, exporter
from graders.run.harness import Case, Pass, Run, apply, assert_model_unchanged, assert_sendable, build, on_device
from graders.run.models import (PathChain, Program, Program2, bn2d, conv2d, nest_under, random_identifier,
                                random_identifiers, random_path)
from graders.run.numerics import (
    ATOL,
    RTOL,
    assert_bit_identical,
    assert_same_outputs,
    cloned,
    describe_difference,
    input_sets,
    manual_seed,
    run_module,
    seeded,
)
from graders.frame.kata import Kata
from graders.frame.levels import CheckFailed
from graders.frame.solution import Called, describe_exception
from graders.run.context import Context
from graders.run.structure import call_module_nodes, graph_table
from graders.run.timing import CountingMode, alone, measure_speedup

__all__ = [
    "ATOL", "RTOL", "REPO_ROOT", "reference_source", "aten", "aten_tracer", "Called", "ExportedProgram", "assert_program_sound", "copy_program", "exported", "exporter", "CountingMode", "Case", "CheckFailed", "Context", "Kata", "Mutant", "Pass", "PathChain",
    "Program", "Program2", "Run", "Variant", "alone", "apply", "assert_bit_identical", "assert_model_unchanged",
    "assert_same_outputs", "assert_sendable", "bn2d", "build", "conv2d", "call_module_nodes", "cloned", "describe_difference", "describe_exception",
    "graph_table", "harness", "input_sets", "manifest", "manual_seed", "measure_speedup", "nest_under", "on_device",
    "random_identifier", "random_identifiers", "random_path", "run_module", "seeded",
]
