"""Key/value caches the hf backend keeps between ``generate`` calls.

An episode's next turn is its previous prompt + the reply + an observation,
and a search's children extend their parent's prompt + reply: without a
cache each turn prefills its whole conversation again (2k tokens by turn 30)
for a reply of a few dozen. vLLM reuses such prefixes by itself; this gives
the hf backend the same, with transformers' own ``DynamicCache``.

How a batch reuses entries without changing what the model computes: the
batch keeps its usual left padding, and the cache it is given covers the
first ``C`` columns of that padded batch, where ``C`` is the most columns
that are, in every row, either padding or tokens that row has cached. The
rows' cached keys/values are copied into those columns (zeros under the
padding, which the attention mask hides); ``generate`` then computes only
the columns from ``C`` on, with the same input ids, mask and positions as
without a cache. Computed width is the longest uncached tail of any row:
what a per-row cache with padding in the middle would compute as well.
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

log = logging.getLogger(__name__)


@dataclass
class Entry:
    tokens: np.ndarray                  # the token ids whose keys/values are kept, no padding
    layers: list[tuple[Any, Any]]       # per layer (keys, values), each [heads, len(tokens), head_dim]
    nbytes: int


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def cache_layers(cache: Any) -> list[tuple[Any, Any]] | None:
    """(keys, values) per layer of a plain full-attention ``DynamicCache``;
    None for any other cache (sliding windows, linear attention, quantized,
    static), whose columns do not map one to one onto the tokens."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    if type(cache) is not DynamicCache or not getattr(cache, "layers", None):
        return None
    if any(type(layer) is not DynamicLayer for layer in cache.layers):
        return None
    return [(layer.keys, layer.values) for layer in cache.layers]


class PrefixCache:
    """Least-recently-used entries of (token ids, keys/values), at most
    ``budget_bytes`` in all. An entry that is a prefix of a newer one is
    dropped: the newer one serves every lookup the old one could."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.entries: OrderedDict[int, Entry] = OrderedDict()
        self.nbytes = 0
        self.reused_tokens = 0      # prompt tokens not computed again, over the run
        self.prompt_tokens = 0      # prompt tokens asked for, over the run
        self._next_id = 0

    def longest(self, ids: np.ndarray) -> tuple[int | None, int]:
        """The entry sharing the longest prefix with ``ids``, and that length
        (at most ``len(ids) - 1``: the last prompt token is always computed,
        its logits give the first new token)."""
        best, best_len = None, 0
        for key, entry in self.entries.items():
            n = common_prefix(entry.tokens, ids)
            if n > best_len:
                best, best_len = key, n
        best_len = min(best_len, len(ids) - 1)
        if best is not None and best_len > 0:
            self.entries.move_to_end(best)
            return best, best_len
        return None, 0

    def add(self, tokens: np.ndarray, layers: list[tuple[Any, Any]]) -> None:
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        if nbytes > self.budget_bytes or len(tokens) == 0:
            return
        for key in [k for k, e in self.entries.items()
                    if len(e.tokens) <= len(tokens) and common_prefix(e.tokens, tokens) == len(e.tokens)]:
            self._drop(key)
        while self.entries and self.nbytes + nbytes > self.budget_bytes:
            self._drop(next(iter(self.entries)))
        self.entries[self._next_id] = Entry(tokens, layers, nbytes)
        self._next_id += 1
        self.nbytes += nbytes

    def _drop(self, key: int) -> None:
        self.nbytes -= self.entries.pop(key).nbytes

    def clear(self) -> None:
        self.entries.clear()
        self.nbytes = 0

    def batch_cache(self, rows: Sequence[np.ndarray], width: int, like: Any) -> tuple[Any, int]:
        """A ``DynamicCache`` for the first columns of a left-padded batch of
        ``rows`` (unpadded prompt ids) of ``width`` columns, and how many
        columns it covers (0: nothing to reuse; then no cache is returned).
        ``like`` is a tensor of the model's dtype and device."""
        import torch
        from transformers.cache_utils import DynamicCache

        found = [self.longest(ids) for ids in rows]
        pads = [width - len(ids) for ids in rows]
        covered = min(pad + reused for pad, (_, reused) in zip(pads, found))
        self.prompt_tokens += sum(len(ids) for ids in rows)
        if covered <= 0 or all(key is None for key, _ in found):
            return None, 0
        some = next(self.entries[key] for key, _ in found if key is not None)
        cache = DynamicCache()
        for layer, (k0, v0) in enumerate(some.layers):
            heads, _, dim = k0.shape
            keys = torch.zeros((len(rows), heads, covered, dim), dtype=k0.dtype, device=like.device)
            values = torch.zeros((len(rows), heads, covered, v0.shape[-1]), dtype=v0.dtype, device=like.device)
            for row, (pad, (key, _)) in enumerate(zip(pads, found)):
                take = covered - pad
                if take > 0:
                    k, v = self.entries[key].layers[layer]
                    keys[row, :, pad:] = k[:, :take]
                    values[row, :, pad:] = v[:, :take]
            cache.update(keys, values, layer)
        self.reused_tokens += sum(max(0, covered - pad) for pad in pads)
        return cache, covered

    def keep(self, rows: Sequence[np.ndarray], generated: Any, width: int, cache: Any, stop_ids: set[int]) -> bool:
        """Store each row's prompt + generated tokens with their keys/values
        from the batch's final ``cache``; False when that cache is not a kind
        this reuses (the caller then stops trying). Every column of that cache
        is a token fed at its position, so any prefix of a row is a valid
        entry; a row keeps its tokens up to its first stop or padding token
        (what follows is padding no later prompt holds), and only those fed
        back to the model (the last new token has no keys/values yet)."""
        layers = cache_layers(cache)
        if layers is None:
            return False
        columns = layers[0][0].shape[2]
        for row, ids in enumerate(rows):
            new = [int(t) for t in generated[row].tolist()]
            end = next((i for i, t in enumerate(new) if t in stop_ids), len(new))
            fed = min(end, columns - width)
            start = width - len(ids)
            tokens = np.concatenate([ids, np.asarray(new[:fed], dtype=ids.dtype)])
            kept = [(k[row, :, start:width + fed].clone(), v[row, :, start:width + fed].clone()) for k, v in layers]
            self.add(tokens, kept)
        return True
