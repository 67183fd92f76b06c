"""Records: a rewritten torch.fx GraphModule as data, and the judge's rebuild of it from that data.

In a competition the learner's pass runs in a worker process, and the judging process must never import
or run learner code. So the worker sends back DATA (`record`), and the judge rebuilds a GraphModule from
it (`rebuild`) and runs every check on the rebuilt module:

- the graph travels as a JSON record: per node its op, name, target by name, args and kwargs
  (`graph_record`), and for an ATen graph a text description of each node's meta['val'] (`describe_value`:
  the judge checks them as text); never pickled code. (The guards a pass added to the ShapeEnv travel beside
  the record, as text the worker measured around the call: graders/isolation/serve.py);
- modules of the torch.nn classes in SAFE_MODULES, and every tensor, travel through torch.save and come
  back through torch.load(weights_only=True) with only those classes allowed (`module_record`);
- a module of any other class (a learner's fused module) and a learner's helper function used as a
  call_function target are traced by torch.fx in the worker into a nested graph record, so the judge
  rebuilds them as GraphModules without their code;
- the judge resolves every call_function target through an allow-list of tensor operations
  (`allowed_function`) and every call_method name against the Tensor methods on it (`allowed_method`),
  and refuses anything else with a sentence naming the node and the target.

The checks that guard the judge are the ones in `rebuild`; the worker runs the same ones early so that
a learner reads the same sentence before a competition does.

The package: rules.py (formats, SAFE_MODULES, the allow-list, the per-node checks), encode.py (the
worker's side), decode.py (the judge's side: rebuild) and programs.py (torch.export programs, both sides).

- a torch.export program (chapter 2) travels as torch's JSON schema and tensors, checked by the judge before
  torch's deserializer builds it (programs.py).

May import: the standard library, torch, and graders.isolation.torch_private (programs.py).
"""
from graders.isolation.records.encode import graph_record, module_record, record, record_values
from graders.isolation.records.decode import RecordedStructure, rebuild, rebuild_values
from graders.isolation.records.rules import (
    FORMAT,
    SAFE_MODULES,
    VALUES_FORMAT,
    RecordError,
    allowed_function,
    allowed_method,
    describe_value,
    target_name,
)

__all__ = ["FORMAT", "SAFE_MODULES", "VALUES_FORMAT", "RecordError", "RecordedStructure", "allowed_function",
           "allowed_method", "describe_value", "graph_record", "module_record", "rebuild", "rebuild_values", "record", "record_values",
           "target_name"]
