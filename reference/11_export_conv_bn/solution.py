"""Kata 11, reference solution: fold eval-mode BatchNorm into the convolution before it, in a torch.export
ExportedProgram, returning a new program and leaving the one given as it was."""
from __future__ import annotations

import contextlib
import copy
import operator
from dataclasses import replace

import torch
import torch.fx as fx
import torch.nn as nn
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, InputKind, InputSpec, TensorArgument

aten = torch.ops.aten
CONVOLUTION = aten.convolution.default
BATCH_NORM = aten._native_batch_norm_legit_no_training.default  # eval mode, running statistics
STATE = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def fold_weights(conv_w, conv_b, mean, var, eps, gamma, beta):
    """Weight and bias of one convolution computing bn(conv(x)) (kata 03's formula), in float64 on the way."""
    dtype = conv_w.dtype
    conv_b = torch.zeros_like(mean) if conv_b is None else conv_b
    gamma = torch.ones_like(mean) if gamma is None else gamma
    beta = torch.zeros_like(mean) if beta is None else beta
    scale = gamma.double() * torch.rsqrt(var.double() + eps)
    weight = conv_w.double() * scale.reshape(-1, *([1] * (conv_w.dim() - 1)))
    bias = (conv_b.double() - mean.double()) * scale + beta.double()
    return weight.to(dtype), bias.to(dtype)


def _tensor(ep: ExportedProgram, specs: dict, node) -> torch.Tensor | None:
    """The real tensor behind a lifted placeholder (a parameter, buffer or constant), or None."""
    spec = specs.get(node)
    if spec is None or spec.kind not in STATE:
        return None
    return ep.state_dict.get(spec.target, ep.constants.get(spec.target))


def _foldable(ep: ExportedProgram, specs: dict, bn: fx.Node):
    """The convolution and the folded (weight, bias) if `bn` may be folded into the convolution feeding it."""
    conv = bn.args[0]
    if not (isinstance(conv, fx.Node) and conv.target is CONVOLUTION and len(conv.users) == 1):
        return None  # not a convolution, or another user would see the normalisation folded in
    if conv.args[6]:  # transposed: its output channels are dimension 1 of the weight
        return None
    weight, bias = _tensor(ep, specs, conv.args[1]), conv.args[2]
    if weight is None or (bias is not None and _tensor(ep, specs, bias) is None):
        return None  # the weight is computed in the graph, not a lifted state
    tensors = [_tensor(ep, specs, a) for a in bn.args[1:5]]
    if any(t is None and (a is not None or i >= 2) for i, (a, t) in enumerate(zip(bn.args[1:5], tensors))):
        return None  # gamma and beta may be absent (affine=False); the running statistics may not
    bias = None if bias is None else _tensor(ep, specs, bias)
    return conv, fold_weights(weight, bias, tensors[2], tensors[3], bn.args[6], tensors[0], tensors[1])


def rederive_meta(graph: fx.Graph, rewired: set, fake_mode) -> None:
    """meta['val'] is what a node's op computes on its arguments' meta['val']: compute it again for each rewired
    node, and for each node that reads a value whose meta['val'] changed. A bias where there was none can change
    the layout torch's fake convolution gives (on CUDA, for a channels_last input and weight: contiguous without
    one, channels_last with one), and its users' layouts follow."""
    changed = set()
    shape_env = fake_mode.shape_env
    for node in graph.nodes:
        if node.op != "call_function" or not (node in rewired or changed.intersection(node.all_input_nodes)):
            continue
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda a: a.meta["val"])
        # A fake kernel may read a size symbol's hint and record a guard (the convolution's picks its kernel by
        # the batch: s0 > 1); a pass must add none, so guards are suppressed while it runs.
        with fake_mode, (shape_env.suppress_guards() if shape_env is not None else contextlib.nullcontext()):
            value = node.target(*args, **kwargs)
        if _layout(value) != _layout(node.meta["val"]):
            node.meta["val"] = value  # the copy's own meta dict: the given graph keeps its value
            changed.add(node)


def _layout(value):
    return torch.utils._pytree.tree_map(
        lambda t: (tuple(t.shape), t.dtype, t.stride()) if isinstance(t, torch.Tensor) else t, value)


def _output_node(graph: fx.Graph) -> fx.Node:
    return next(n for n in reversed(graph.nodes) if n.op == "output")


def fuse_conv_bn(ep: ExportedProgram) -> ExportedProgram:
    """A new program with every foldable convolution -> BatchNorm pair folded; `ep` is left as it was."""
    graph = copy.deepcopy(ep.graph)  # new nodes (meta shared: meta['val'] stays the graph's own fake tensor)
    # A copy may rename nodes (a placeholder `input` becomes `input_1`: it shadows a builtin), so the signature
    # is matched to the copy by position, not by name.
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    specs = dict(zip(placeholders, ep.graph_signature.input_specs))
    unread = {n for n in placeholders if not n.users}  # a BN's num_batches_tracked: left as it was
    # New parameters go after the program's own, before its buffers and user inputs (torch's order).
    after_parameters = next(n for n in placeholders if specs[n].kind != InputKind.PARAMETER)
    fake_mode = placeholders[-1].meta["val"].fake_mode  # the graph's own: new meta['val']s are made in it
    state_dict, taken = dict(ep.state_dict), {s.target for s in specs.values()}

    def parameter(name: str, value: torch.Tensor) -> fx.Node:
        target = name
        while target in taken:
            target += "_"
        taken.add(target)
        with graph.inserting_before(after_parameters):
            node = graph.placeholder("p_" + target.replace(".", "_"))
        node.meta["val"] = fake_mode.from_tensor(value, static_shapes=True)
        state_dict[target] = nn.Parameter(value, requires_grad=False)
        specs[node] = InputSpec(InputKind.PARAMETER, TensorArgument(node.name), target)
        return node

    rewired = set()
    for bn in list(graph.nodes):
        if bn.target is not BATCH_NORM:  # eval mode: running statistics read, nothing written back
            continue
        if not all(u.target is operator.getitem and (u.args[1] == 0 or not u.users) for u in bn.users):
            continue  # only the normalised output may be read (a loaded program has getitems for all three)
        if not (found := _foldable(ep, specs, bn)):
            continue
        conv, (weight, bias) = found
        name = specs[conv.args[1]].target
        conv.args = (conv.args[0], parameter(f"{name}_folded", weight),
                     parameter(f"{name.rpartition('.')[0] or name}.bias_folded", bias), *conv.args[3:])
        rewired.add(conv)
        for getitem in list(bn.users):
            getitem.replace_all_uses_with(conv)  # a model output included: the output specs follow below
            graph.erase_node(getitem)
        graph.erase_node(bn)

    rederive_meta(graph, rewired, fake_mode)
    # The folded BNs' state, and a weight no convolution reads any more, is dead: drop its placeholders.
    for node in placeholders:
        if not node.users and node not in unread and specs[node].kind in STATE:
            graph.erase_node(node)
            del specs[node]
    input_specs = [replace(specs[n], arg=TensorArgument(n.name)) if isinstance(specs[n].arg, TensorArgument)
                   else specs[n] for n in graph.nodes if n.op == "placeholder"]
    outputs = _output_node(graph).args[0]
    output_specs = [replace(s, arg=TensorArgument(out.name)) if isinstance(s.arg, TensorArgument) else s
                    for s, out in zip(ep.graph_signature.output_specs, outputs)]
    kept = {s.target for s in input_specs if s.kind in STATE}
    gm = fx.GraphModule(ep.graph_module, graph)
    return ExportedProgram(
        root=gm, graph=gm.graph, graph_signature=ExportGraphSignature(input_specs, output_specs),
        state_dict={k: v for k, v in state_dict.items() if k in kept},
        range_constraints=ep.range_constraints, module_call_graph=ep.module_call_graph,
        example_inputs=ep.example_inputs, constants={k: v for k, v in ep.constants.items() if k in kept},
        verifiers=ep.verifiers)
