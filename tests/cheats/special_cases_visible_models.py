# Folds only modules whose names appear in the visible models, and leaves the rest alone: the
# visible levels pass, the hidden models (random names) do not.
VISIBLE_NAMES = {"conv", "bn", "conv1", "bn1", "conv2", "bn2", "features", "stage_1", "unit0", "unit1"}


def fuse_conv_bn(gm):
    names = {part for node in gm.graph.nodes if node.op == "call_module" for part in str(node.target).split(".")}
    if all(name.isdigit() or name in VISIBLE_NAMES for name in names):
        return _honest_fuse(gm)
    return gm
