"""memory_store.CachedEmbedder: the inner embedder's vectors, each distinct text embedded once, and a
bounded cache that never serves a stale or missing row."""
import numpy as np

from memr1.memory_store import CachedEmbedder, HashEmbedder


class Counting(HashEmbedder):
    def __init__(self):
        super().__init__(32)
        self.texts = []

    def embed(self, texts):
        self.texts += list(texts)
        return super().embed(texts)


def test_same_vectors_each_text_embedded_once():
    inner = Counting()
    cached = CachedEmbedder(inner)
    texts = ["a dog", "two cats", "a dog", "rain"]
    np.testing.assert_array_equal(cached.embed(texts), HashEmbedder(32).embed(texts))
    np.testing.assert_array_equal(cached.embed(["rain", "a dog"]), HashEmbedder(32).embed(["rain", "a dog"]))
    assert sorted(inner.texts) == ["a dog", "rain", "two cats"]
    out = cached.embed(["rain"])
    out[:] = 0                                        # callers may write to what they get
    assert cached.embed(["rain"]).any()
    assert cached.embed([]).shape == (0, 32)


def test_a_full_cache_starts_over_and_still_answers_every_row():
    inner = Counting()
    cached = CachedEmbedder(inner, max_entries=3)
    cached.embed(["a", "b", "c"])
    got = cached.embed(["a", "d", "e"])               # "a" was cached, but the cache must clear for d, e
    np.testing.assert_array_equal(got, HashEmbedder(32).embed(["a", "d", "e"]))
    assert inner.texts == ["a", "b", "c", "a", "d", "e"]   # the new batch is embedded whole, once
