"""PrefixCache: longest-prefix restore, LRU eviction within its token budget, no shared writes."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from support.helpers import needs_model

pytestmark = needs_model  # mlx-lm's cache classes


def _filled_cache(tokens: list[int], layers: int = 2):
    """KVCache layers whose keys and values encode each token id (so restores can be checked)."""
    from mlx_lm.models.cache import KVCache

    cache = []
    for layer in range(layers):
        c = KVCache()
        kv = mx.array(tokens, dtype=mx.float32).reshape(1, 1, len(tokens), 1) + layer
        c.update_and_fetch(mx.broadcast_to(kv, (1, 2, len(tokens), 4)), mx.broadcast_to(-kv, (1, 2, len(tokens), 4)))
        cache.append(c)
    return cache


def _fresh(layers: int = 2):
    from mlx_lm.models.cache import KVCache

    return [KVCache() for _ in range(layers)]


def test_restore_takes_the_longest_common_prefix_and_leaves_the_last_token():
    from emlx_async.llm import PrefixCache

    store = PrefixCache(100)
    store.save([1, 2, 3, 4], _filled_cache([1, 2, 3, 4]))
    store.save([1, 2, 9, 9, 9], _filled_cache([1, 2, 9, 9, 9]))
    cache = _fresh()
    assert store.restore([1, 2, 9, 9, 7, 8], cache) == 4
    assert cache[1].offset == 4
    np.testing.assert_array_equal(np.array(cache[1].keys[0, 0, :, 0]), [2, 3, 10, 10])
    assert store.restore([1, 2, 3, 4], _fresh()) == 3  # the whole prompt is kept: its last token still runs
    assert store.restore([5, 6], _fresh()) == 0
    assert (store.hits, store.reused_tokens) == (2, 7)


def test_lru_eviction_keeps_the_token_budget():
    from emlx_async.llm import PrefixCache

    store = PrefixCache(10)
    store.save([1, 1, 1, 1], _filled_cache([1, 1, 1, 1]))
    store.save([2, 2, 2, 2], _filled_cache([2, 2, 2, 2]))
    assert store.restore([1, 1, 1, 1, 5], _fresh()) == 4   # 1s are now the most recently used
    store.save([3, 3, 3, 3], _filled_cache([3, 3, 3, 3]))  # 12 tokens > 10: the 2s go
    assert store.tokens == 8
    assert store.restore([2, 2, 2, 2, 5], _fresh()) == 0
    assert store.restore([1, 1, 1, 1, 5], _fresh()) == 4
    store.save(list(range(11)), _filled_cache(list(range(11))))  # larger than the whole budget: not kept
    assert store.tokens == 8


def test_restored_caches_never_write_into_the_kept_arrays():
    from emlx_async.llm import PrefixCache

    store = PrefixCache(100)
    store.save([1, 2, 3], _filled_cache([1, 2, 3]))
    cache = _fresh()
    assert store.restore([1, 2, 3, 4], cache) == 3
    new = mx.full((1, 2, 1, 4), 99.0)
    cache[0].update_and_fetch(new, new)
    again = _fresh()
    store.restore([1, 2, 3, 4], again)
    np.testing.assert_array_equal(np.array(again[0].keys[0, 0, :, 0]), [1, 2, 3])


def test_mismatched_or_unsupported_caches_are_not_kept():
    from mlx_lm.models.cache import RotatingKVCache

    from emlx_async.llm import PrefixCache

    store = PrefixCache(100)
    store.save([1, 2], _filled_cache([1, 2, 3]))  # holds 3 tokens, not 2
    assert store.tokens == 0
    assert store.restore([1, 2, 3], [RotatingKVCache(8)]) == 0
    with pytest.raises(ValueError):
        PrefixCache(0)


def test_kept_entries_own_their_buffers():
    """A kept slice would share its source's buffer and keep all of it alive (a
    whole batch's cache, or a cache grown past the tokens kept)."""
    from mlx_lm.models.cache import KVCache

    from emlx_async.llm import PrefixCache

    from support.helpers import buffer_address

    big = mx.zeros((4, 2, 256, 8))  # a batch of 4 rows of 256 positions
    mx.eval(big)
    start, end = buffer_address(big), buffer_address(big) + big.nbytes
    layer = KVCache()
    layer.keys, layer.values, layer.offset = big[1:2, :, :5, :], big[2:3, :, :5, :], 5
    cache = PrefixCache(100)
    cache.save([1, 2, 3, 4, 5], [layer])
    for kept in cache._entries[(1, 2, 3, 4, 5)].layers[0]:
        assert kept.shape == (1, 2, 5, 8) and kept.nbytes == 1 * 2 * 5 * 8 * 4
        assert not start <= buffer_address(kept) < end, "the entry is a view into the source cache"


def test_a_kept_prefix_gives_way_to_its_extension():
    from emlx_async.llm import PrefixCache

    store = PrefixCache(100)
    store.save([1, 2, 3], _filled_cache([1, 2, 3]))
    store.save([1, 2, 3, 4, 5], _filled_cache([1, 2, 3, 4, 5]))
    assert (len(store), store.tokens) == (1, 5)  # [1, 2, 3] is served by the longer entry
    store.save([1, 2], _filled_cache([1, 2]))  # already covered: not kept twice
    assert (len(store), store.tokens) == (1, 5)
    assert store.restore([1, 2, 3, 7], _fresh()) == 3


def test_the_bound_holds_in_bytes():
    from emlx_async.llm import PrefixCache

    per_token = 2 * 2 * (2 * 4 * 4)  # 2 layers of keys and values, 2 heads of 4 float32 each
    store = PrefixCache(1000, max_bytes=10 * per_token)
    for start in range(0, 40, 4):
        tokens = list(range(100 + start, 104 + start))
        store.save(tokens, _filled_cache(tokens))
        assert store.nbytes <= 10 * per_token
    assert (store.tokens, store.nbytes) == (8, 8 * per_token)  # two entries of 4 tokens
    store.save(list(range(11)), _filled_cache(list(range(11))))  # more bytes than the whole bound: not kept
    assert store.tokens == 8
    with pytest.raises(ValueError):
        PrefixCache(10, max_bytes=0)


def test_lookups_agree_with_a_scan_of_the_kept_sequences():
    """The trie against the plain definition: the longest common prefix with any kept sequence."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from emlx_async.llm import PrefixCache

    sequences = st.lists(st.integers(0, 3), min_size=1, max_size=8)
    steps = st.lists(st.tuples(st.booleans(), sequences), min_size=1, max_size=30)

    @settings(max_examples=150, deadline=None)
    @given(steps=steps)
    def check(steps):
        store = PrefixCache(20)
        for is_save, tokens in steps:
            if is_save:
                store.save(tokens, _filled_cache(tokens, layers=1))
                assert store.tokens == sum(len(k) for k in store._entries) <= 20
                continue
            kept = list(store._entries)
            longest = max((next((i for i, (a, b) in enumerate(zip(k, tokens)) if a != b), min(len(k), len(tokens)))
                           for k in kept), default=0)
            cache = _fresh(1)
            reused = store.restore(tokens, cache)
            assert reused == min(longest, len(tokens) - 1)
            if reused:
                np.testing.assert_array_equal(np.array(cache[0].keys[0, 0, :, 0]), tokens[:reused])

    check()
