"""Kata 11: fold eval-mode BatchNorm into the convolution before it, in a torch.export ExportedProgram.

Read README.md beside this file first. Grade your work with:  uv run pytest katas/11_export_conv_bn
"""
from __future__ import annotations

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
    """Weight and bias of one convolution computing bn(conv(x)): kata 03's formula, given (computed in float64,
    returned in conv_w's dtype). conv_b, gamma and beta may be None."""
    dtype = conv_w.dtype
    conv_b = torch.zeros_like(mean) if conv_b is None else conv_b
    gamma = torch.ones_like(mean) if gamma is None else gamma
    beta = torch.zeros_like(mean) if beta is None else beta
    scale = gamma.double() * torch.rsqrt(var.double() + eps)
    weight = conv_w.double() * scale.reshape(-1, *([1] * (conv_w.dim() - 1)))
    bias = (conv_b.double() - mean.double()) * scale + beta.double()
    return weight.to(dtype), bias.to(dtype)


def fuse_conv_bn(ep: ExportedProgram) -> ExportedProgram:
    """A new program with every foldable convolution -> BatchNorm pair folded; `ep` is left as it was.

    Leave a pair alone when folding would change what the program computes (README: "When the fold is not
    allowed"). The result must validate, keep torch.export's input order, carry meta['val'] on every node (made
    in the graph's own fake mode), and hold no state that nothing reads.
    """
    # TODO(human): copy the graph (the caller keeps `ep`) and pair each placeholder of the copy with its input
    #   spec, by position (a copy may rename nodes). Find the graph's fake mode (any meta['val'].fake_mode).
    # TODO(human): for each BATCH_NORM node whose input is a convolution it may be folded into:
    #   - read the real tensors behind the placeholders (ep.state_dict or ep.constants, at the spec's target)
    #     and fold them with fold_weights;
    #   - add a PARAMETER placeholder for the new weight and one for the new bias, before the first buffer or user
    #     input, each with its meta['val'], its InputSpec and an nn.Parameter in a new state dict;
    #   - point the convolution at them, the users of the BN's getitem at the convolution, and erase the getitem
    #     and the BN.
    # TODO(human): derive meta['val'] again (in the fake mode, from the arguments' meta['val']) for each rewired
    #   convolution and each node that reads a value whose meta['val'] changed: a new bias can change the layout.
    # TODO(human): erase the placeholders nothing reads any more (with their specs and state), build the signature
    #   (input specs in placeholder order; output specs naming the output node's arguments) and return
    #   ExportedProgram(root=..., graph=..., graph_signature=..., state_dict=..., range_constraints=...,
    #   module_call_graph=..., example_inputs=..., constants=..., verifiers=...).
    raise NotImplementedError("TODO(human): fuse_conv_bn")
