# Returns the module it was given: passes nothing that looks at the graph or the clock.
def fuse_conv_bn(gm):
    return gm
