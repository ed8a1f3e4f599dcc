"""The encoder cache: image embeddings by `mm_hash`, least recently used first out, budget in embeddings.

As vLLM's `EncoderCacheManager` counts it: an entry costs its visual tokens, and the cache holds at
most `capacity` of them (vLLM: `encoder_cache_size`, by default the encoder compute budget). A request
keeps its own references to the embeddings it was given, so evicting an entry never takes them from a
running request; it only means the next request with that image encodes (or loads) it again. With
compute skip the entries hold no array (None), only the fact that the image was encoded.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np


class EncoderCache:
    def __init__(self, capacity: int) -> None:
        """`capacity`: embeddings (visual tokens) it holds at most."""
        self.capacity = capacity
        self._entries: OrderedDict[str, tuple[int, np.ndarray | None]] = OrderedDict()
        self.num_embeds = 0
        self.num_queries = 0
        self.num_hits = 0

    def lookup(self, mm_hash: str) -> tuple[bool, np.ndarray | None]:
        """Whether `mm_hash` is cached (counted as a query, and a hit), and its embeddings."""
        self.num_queries += 1
        entry = self._entries.get(mm_hash)
        if entry is None:
            return False, None
        self.num_hits += 1
        self._entries.move_to_end(mm_hash)
        return True, entry[1]

    def put(self, mm_hash: str, num_tokens: int, embeds: np.ndarray | None) -> None:
        """Cache an image's embeddings, evicting the least recently used entries to make room (one
        larger than the whole cache is not kept)."""
        if mm_hash in self._entries or num_tokens > self.capacity:
            return
        while self.num_embeds + num_tokens > self.capacity:
            _, (n, _) = self._entries.popitem(last=False)
            self.num_embeds -= n
        self._entries[mm_hash] = (num_tokens, embeds)
        self.num_embeds += num_tokens
