"""TokenIds reads as the list of its IDs does: slices, concatenation, equality, hashing, pickling."""

import pickle

import numpy as np

from actors.engine.kv_cache.block_hash import hash_blocks
from actors.engine.request import Request
from messages import EngineRequest, token_ids_valid
from messages.token_ids import TokenIds, bytes_of, span

IDS = [5, 0, 127_999, 42, 7, 7, 9, 1, 3]


def test_token_ids_read_as_their_list():
    t = TokenIds(np.array(IDS))
    assert len(t) == len(IDS) and list(t) == IDS and t[2] == 127_999 and type(t[2]) is int
    assert t[1:4] == IDS[1:4] and type(t[1:4]) is list
    assert t == IDS and IDS == t  # noqa: SIM300  # the list on the left: its comparison defers
    assert t == TokenIds(np.array(IDS)) and t != IDS[:-1] and t != [*IDS[:-1], 8]
    assert t + [1] == [*IDS, 1] and [1] + t == [1, *IDS] and type(t + [1]) is list  # noqa: RUF005
    assert t.startswith(TokenIds(np.array(IDS[:3]))) and not t.startswith(TokenIds(np.array([5, 1])))
    assert pickle.loads(pickle.dumps(t)) == IDS  # crosses actors as its array
    assert token_ids_valid(t, 128_000) and not token_ids_valid(t, 127_999)


def test_token_ids_hash_and_span_as_lists_do():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 128_000, 1000).tolist()
    t = TokenIds(np.array(ids))
    assert bytes_of(t, 3, 700) == bytes_of(ids, 3, 700)
    assert hash_blocks(t, 16) == hash_blocks(ids, 16)
    assert hash_blocks(span(t, 32, 500), 16, b"p" * 16, start=32) == hash_blocks(
        ids[32:500], 16, b"p" * 16, start=32
    )
    req, ref = (Request(EngineRequest(r, p, 4), 0.0) for r, p in (("t", t), ("l", ids)))
    req.output_token_ids = ref.output_token_ids = [1, 2, 3]
    for lo, hi in [(0, 16), (500, 1000), (990, 1003)]:
        assert list(req.token_span(lo, hi)) == ref.token_ids(lo, hi) == req.token_ids(lo, hi)
