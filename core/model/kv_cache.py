"""Preallocated per-layer key/value storage, reused across requests and turns."""
from __future__ import annotations

import torch

_GROW = 256  # grow capacity in steps so a chat does not reallocate every turn


def rounded_capacity(positions: int) -> int:
    """The capacity the cache allocates to hold ``positions`` (a multiple of its growth step)."""
    return -(-positions // _GROW) * _GROW


def static_capacity(positions: int, limit: int) -> int:
    """The capacity of a static cache holding ``positions``: a power of two (at least one
    growth step, at most ``limit`` rounded up), so a growing conversation changes the
    shapes of a compiled step, and re-captures it, only O(log n) times."""
    cap = max(_GROW, 1 << max(positions - 1, 1).bit_length())
    return min(cap, rounded_capacity(limit))


class KVCache:
    """Keys and values of every layer for ``batch`` rows of up to ``capacity`` positions.

    Stored as [B, Hkv, capacity, D] per layer in the model's dtype and device. The cache
    remembers which token ids each row holds (``tokens``) so a new prompt that extends
    them only needs its new tokens prefilled.
    """

    def __init__(self, *, n_layers: int, n_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str, batch: int = 1, capacity: int = 0):
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.dtype, self.device = dtype, torch.device(device)
        self.batch, self.capacity = 0, 0
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.tokens: list[list[int]] = []
        self.static_addresses = False  # see mark_static
        self._row_index: torch.Tensor | None = None  # see _rows
        self.ensure(batch, capacity)

    @classmethod
    def for_model(cls, model, *, batch: int = 1, capacity: int = 0) -> "KVCache":
        """A cache matching ``model``'s layers, heads, dtype and device."""
        a = model.args
        w = model.tok_embeddings.weight
        return cls(n_layers=a.n_layers, n_kv_heads=a.n_kv_heads, head_dim=a.head_dim,
                   dtype=w.dtype, device=w.device, batch=batch, capacity=capacity)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def ensure(self, batch: int, capacity: int) -> None:
        """Make room for ``batch`` rows of ``capacity`` positions, keeping what is held."""
        if batch <= self.batch and capacity <= self.capacity:
            return
        new_b = max(batch, self.batch)
        # Grow by at least a quarter so a long reply copies the cache O(log n) times.
        want = max(capacity, self.capacity + self.capacity // 4) if capacity > self.capacity else capacity
        new_c = max(self.capacity, rounded_capacity(want))
        shape = (new_b, self.n_kv_heads, new_c, self.head_dim)
        for store in (self.k, self.v):
            for i in range(self.n_layers):
                fresh = torch.zeros(shape, dtype=self.dtype, device=self.device)
                if i < len(store):
                    old = store[i]
                    fresh[: old.shape[0], :, : old.shape[2]] = old
                    store[i] = fresh
                else:
                    store.append(fresh)
        self.tokens += [[] for _ in range(new_b - len(self.tokens))]
        self.batch, self.capacity = new_b, new_c
        if self.static_addresses:
            self.mark_static()

    def mark_static(self) -> None:
        """Tell torch.compile that the K/V tensors keep their addresses between steps, now
        and after every growth: CUDA graphs then write into them in place instead of copying
        the whole cache in and out of a graph's own buffers. A growth allocates new tensors,
        which CUDA graphs notice (and re-record for), so a longer conversation stays correct."""
        self.static_addresses = True
        for t in self.k + self.v:
            if getattr(t, "_dynamo_static_input_type", None) is None:
                torch._dynamo.mark_static_address(t)

    def span(self, pos: torch.Tensor) -> int:
        """How many positions the keys of a step at per-row positions ``pos`` cover."""
        return int(pos.max()) + 1

    def reset(self) -> None:
        """Forget what every row holds (the memory stays allocated)."""
        self.tokens = [[] for _ in range(self.batch)]

    def update(self, layer: int, pos: int | torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Write k, v [B, Hkv, T, D] at positions pos.. and return all keys/values so far.

        Args:
            layer: layer index.
            pos: start position shared by the B rows, or positions [B, T] per row.

        Returns:
            (keys, values), each [B, Hkv, end, D] where end is one past the last position.
        """
        B, _, T, _ = k.shape
        kc, vc = self.k[layer], self.v[layer]
        if isinstance(pos, torch.Tensor):
            rows = self._rows(B, T, pos.device)
            kc[rows, :, pos] = k.transpose(1, 2)  # advanced dims first: [B, T, Hkv, D]
            vc[rows, :, pos] = v.transpose(1, 2)
            end = int(pos.max()) + 1
        else:
            end = pos + T
            kc[:B, :, pos:end] = k
            vc[:B, :, pos:end] = v
        return kc[:B, :, :end], vc[:B, :, :end]

    def _rows(self, B: int, T: int, device: torch.device) -> torch.Tensor:
        """Row indices [B, T] (row b in every column) for a scatter at per-row positions,
        kept between layers and steps: three tensor calls fewer per layer of a decode step."""
        got = self._row_index
        if got is None or got.shape != (B, T) or got.device != device:
            got = self._row_index = torch.arange(B, device=device).view(B, 1).expand(B, T)
        return got

    def copy_row(self, src: int, dst: int, length: int) -> None:
        """Duplicate the first ``length`` positions of row src into row dst."""
        for store in (self.k, self.v):
            for t in store:
                t[dst, :, :length] = t[src, :, :length]
        self.tokens[dst] = list(self.tokens[src][:length])

    def reorder(self, index: torch.Tensor, length: int) -> None:
        """Rows become rows ``index`` of before (beam search); positions < length kept."""
        n = index.numel()
        for store in (self.k, self.v):
            for t in store:
                t[:n, :, :length] = t[index, :, :length]
        old = self.tokens
        idx = index.tolist()
        self.tokens[:n] = [list(old[i][:length]) for i in idx]

    def rollback(self, row: int, length: int) -> None:
        """Forget row's positions from ``length`` on (drafted tokens the model rejected).

        Only what the row holds can be rolled back: ``length`` must lie within
        ``0..len(tokens[row])``. The dropped slots are zeroed, so no rejected key or value
        can be read again before it is overwritten.
        """
        if not 0 <= row < self.batch:
            raise IndexError(f"row {row} is outside the cache's {self.batch} rows")
        held = len(self.tokens[row])
        if not 0 <= length <= held:
            raise ValueError(f"cannot roll row {row} back to {length} positions: it holds {held}")
        if length < held:
            for store in (self.k, self.v):
                for t in store:
                    t[row, :, length:held] = 0
            del self.tokens[row][length:]

    def reusable_prefix(self, row: int, tokens: list[int]) -> int:
        """How many leading ``tokens`` row already holds (always leaves one to run)."""
        held = self.tokens[row]
        n = 0
        limit = min(len(held), len(tokens) - 1)
        while n < limit and held[n] == tokens[n]:
            n += 1
        return n

    def row(self, index: int) -> "RowView":
        """A view with the same ``update`` that reads and writes row ``index`` alone."""
        return RowView(self, index)


class StaticRows:
    """The first rows of a KVCache at full capacity, for a decode step whose shapes never
    change between steps (what CUDA graphs need): every step attends over all ``capacity``
    slots with a mask from the positions, and writes its keys/values at positions read on
    the device, so no step asks the host anything. Slots a row has not written hold zeros
    or stale values; the mask (keys at or before the row's own position) hides them.

    Built inside the compiled step from the cache's tensors (see core.model.decode_step), so it
    carries nothing between steps.
    """

    def __init__(self, k: list[torch.Tensor], v: list[torch.Tensor]):
        self.k, self.v = k, v

    def span(self, pos: torch.Tensor) -> int:
        return self.k[0].shape[2]

    def update(self, layer: int, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Write k, v [B, Hkv, T, D] at positions pos [B, T]; return every slot [B, Hkv, C, D]."""
        B, H, T, D = k.shape
        at = pos.view(B, 1, T, 1).expand(B, H, T, D)
        kc, vc = self.k[layer], self.v[layer]
        kc.scatter_(2, at, k)
        vc.scatter_(2, at, v)
        return kc, vc


class RowView:
    """One row of a KVCache, presented as a batch of one (for per-row prefill)."""

    def __init__(self, cache: KVCache, index: int):
        self.cache, self.index = cache, index

    def update(self, layer: int, pos: int, k: torch.Tensor, v: torch.Tensor):
        r, end = self.index, pos + k.shape[2]
        kc, vc = self.cache.k[layer], self.cache.v[layer]
        kc[r:r + 1, :, pos:end] = k
        vc[r:r + 1, :, pos:end] = v
        return kc[r:r + 1, :, :end], vc[r:r + 1, :, :end]
