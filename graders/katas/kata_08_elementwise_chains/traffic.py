"""Kata 08's exact cost: the bytes a model moves between memory and a modelled cache, counted per aten op.

An elementwise op does almost no arithmetic: its time is the memory it moves. Fusing a chain saves traffic
only when a step reads what the step before it wrote while that is still in the cache, so the count needs a
cache, not just the sizes of the tensors each op touches (an op on one tile of a tensor touches a tile's
bytes; the tiles of all the ops add up to the whole tensors again). The model:

- a least-recently-used cache of CACHE_BYTES, in blocks of BLOCK_BYTES, keyed by storage and offset in
  it, not by address: the count is the same whichever addresses the allocator hands out, and in every
  process (keyed by address, the reference read 27%-30% of the original, a tiled pass with its steps out
  of place 50%-65%, from one run or allocator to the next);
- an op reads its tensor arguments (a block not in the cache is loaded: +BLOCK_BYTES), then writes its
  results and the arguments it mutates (the block is put in the cache, dirty; a write fetches nothing);
- a dirty block that leaves the cache is stored (+BLOCK_BYTES), and so is every dirty block left at the end
  of the call (results have to reach memory), unless its storage was freed by then: a dead temporary's
  lines are dropped, never written back (a cache would write them; its program no longer needs them, and
  the count charges what the program needs, not what one allocator's reuse of addresses happens to save);
- views (view, reshape of a contiguous tensor, expand, slices, tensor_split) and fresh allocations
  (empty, new_empty) move nothing.

So an unfused op on B bytes moves 2B (load its input, store its result), and so does an op in place
(`add_` loads the buffer and stores it back): the seed's formula, bytes saved = sum of size(intermediate)
x 2, is what a fused chain saves when its intermediates stay in the cache. The count is the same on every
machine, unlike a time.
"""
from __future__ import annotations

import weakref
from collections import OrderedDict

import torch
from torch.utils._pytree import tree_leaves

from graders.run import CountingMode

# 4 MiB: a core's share of the last-level cache (the AMD EPYC of the README's timings: 1 MiB of L2 per core,
# 32 MiB of L3 shared by up to 8 cores). A tile that fits it is read from the cache, not from memory.
CACHE_BYTES = 4 << 20
BLOCK_BYTES = 4096

aten = torch.ops.aten
# Ops that write their mutated argument without reading it first.
_WRITE_ONLY = {aten.copy_.default, aten.fill_.Scalar, aten.fill_.Tensor, aten.zero_.default}
# Ops that allocate without touching the memory.
_ALLOCATE = {aten.empty.memory_format, aten.empty_like.default, aten.new_empty.default,
             aten.empty_strided.default, aten.new_empty_strided.default}


class _Traffic(CountingMode):
    def __init__(self):
        super().__init__()
        self.cache: OrderedDict[tuple[int, int], bool] = OrderedDict()  # (storage, block) -> dirty, LRU first
        self.loaded = self.stored = 0
        self.storages: dict[int, int] = {}  # a storage's address -> its number, while it lives
        self.holders: list[list[weakref.ref]] = []  # by number: the tensors seen on that storage

    def _storage(self, t: torch.Tensor) -> int:
        """The number of t's storage: a new one when its address is new, or was another storage's that died."""
        address = t.untyped_storage().data_ptr()
        number = self.storages.get(address)
        if number is None or not self._alive(number):
            number = self.storages[address] = len(self.holders)
            self.holders.append([])
        self.holders[number].append(weakref.ref(t))
        return number

    def _alive(self, number: int) -> bool:
        """A storage lives while a tensor on it does (every tensor an op makes passes through here)."""
        return any(ref() is not None for ref in self.holders[number])

    def _blocks(self, t: torch.Tensor) -> list[tuple[int, int]]:
        if t.numel() == 0:
            return []
        extent = (sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride())) + 1) * t.element_size()
        number, start = self._storage(t), t.storage_offset() * t.element_size()
        return [(number, block) for block in range(start // BLOCK_BYTES, (start + extent - 1) // BLOCK_BYTES + 1)]

    def _touch(self, t: torch.Tensor, write: bool) -> None:
        cache = self.cache
        for block in self._blocks(t):
            if block in cache:
                cache.move_to_end(block)
                if write:
                    cache[block] = True
                continue
            if not write:
                self.loaded += BLOCK_BYTES
            cache[block] = write
            if len(cache) * BLOCK_BYTES > CACHE_BYTES:
                (number, _), dirty = cache.popitem(last=False)
                self.stored += BLOCK_BYTES * (dirty and self._alive(number))

    def flush(self) -> None:
        """The end of the call: every dirty block of a storage still alive (the results) reaches memory."""
        alive = {number for number, _ in self.cache if self._alive(number)}
        self.stored += BLOCK_BYTES * sum(dirty for (number, _), dirty in self.cache.items() if number in alive)
        self.cache.clear()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in _ALLOCATE:
            for t in tree_leaves(out):  # its storage is born here: a number of its own from now on
                if isinstance(t, torch.Tensor) and t.numel():
                    self._storage(t)
            return out
        schema = func._schema
        named = {a.name: (args[i] if i < len(args) else kwargs.get(a.name)) for i, a in enumerate(schema.arguments)}
        mutated, write_only, viewed = [], set(), False
        for argument in schema.arguments:
            alias = argument.alias_info
            if alias is not None:
                if alias.is_write:
                    tensors = [t for t in tree_leaves(named[argument.name]) if isinstance(t, torch.Tensor)]
                    mutated.extend(tensors)
                    if func in _WRITE_ONLY or argument.is_out:  # copy_'s destination, an `out=` tensor
                        write_only.update(map(id, tensors))
                else:
                    viewed = True
        if viewed and not mutated:
            for t in tree_leaves(out):  # a view: nothing is moved, but it keeps its storage alive
                if isinstance(t, torch.Tensor) and t.numel():
                    self._storage(t)
            return out
        for t in tree_leaves(list(named.values())):
            if isinstance(t, torch.Tensor) and id(t) not in write_only:
                self._touch(t, write=False)
        written = {id(t): t for t in mutated}
        written.update((id(t), t) for t in tree_leaves(out) if isinstance(t, torch.Tensor))
        for t in written.values():
            self._touch(t, write=True)
        return out


def memory_traffic(model, inputs: tuple) -> int:
    """Bytes `model(*inputs)` moves between memory and the modelled cache (module docstring), under no_grad."""
    counter = _Traffic()
    with torch.no_grad(), counter:
        outputs = model(*inputs)
    counter.flush()  # while the outputs live: their blocks are written back, the temporaries' dropped
    del outputs
    return counter.loaded + counter.stored
