# Remembers the output for the very tensor object it saw last, and recomputes when the tensor is
# changed in place (its version counter moves): never wrong, but the timing loop measures a
# lookup, not the model. Only the implausible-speedup ceiling can tell.
import weakref


class _Remember(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner, self.last = inner, (lambda: None, -1, None)

    def forward(self, x):
        ref, version, out = self.last
        if ref() is x and version == x._version:
            return out
        out = self.inner(x)
        self.last = (weakref.ref(x), x._version, out)
        return out


def fuse_conv_bn(gm):
    return _served_by(_Remember(_honest_fuse(gm)))
