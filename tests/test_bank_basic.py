"""Forks, compaction, HNSW search and the embedders."""
import numpy as np
import pytest

from memr1.memory_store import Add, Delete, HashEmbedder, MemoryBank, Noop, Update

DIM = 16


def clustered(n, dim=DIM, centers=20, seed=0):
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((centers, dim)).astype(np.float32)
    return (c[rng.integers(0, centers, n)] + 0.3 * rng.standard_normal((n, dim))).astype(np.float32)


def test_forks_are_independent():
    v = clustered(10)
    base = MemoryBank.create(None, dim=DIM)
    for i in range(5):
        base.apply(Add(f"m{i}", v[i], "A", "t"))
    kids = [base.fork() for _ in range(3)]
    kids[0].apply(Add("only in kid 0", v[5], "A"))
    kids[1].apply(Update(1, "changed in kid 1", v[6]))
    kids[2].apply(Delete(2))
    grandkid = kids[1].fork()
    grandkid.apply(Delete(1))
    texts = lambda b: {m.id: m.text for m in b}
    assert texts(base) == {i: f"m{i}" for i in range(5)}
    assert texts(kids[0])[5] == "only in kid 0" and len(kids[0]) == 6
    assert texts(kids[1])[1] == "changed in kid 1" and 5 not in kids[1]
    assert 2 not in kids[2] and 2 in kids[1]
    assert 1 not in grandkid and kids[1].get(1).text == "changed in kid 1"
    # A sibling's new id does not exist elsewhere; each fork hands out ids on its own.
    assert kids[2].apply(Add("kid 2 add", v[7], "B")) == 5
    assert kids[0].get(5).text == "only in kid 0"


def test_ids_survive_compaction_and_reopen(tmp_path):
    v = clustered(50)
    bank = MemoryBank.create(tmp_path / "b", dim=DIM)
    for i in range(30):
        bank.apply(Add(f"m{i}", v[i], "AB"[i % 2], f"day {i}"))
    for i in range(0, 30, 3):
        bank.apply(Delete(i))
    bank.apply(Update(4, "m4 v2", v[40], "day 99"))
    before = list(bank)
    bank.compact()
    assert list(bank) == before
    assert bank.apply(Add("after", v[41], "A")) == 30  # deleted ids are never reused
    bank.close()
    bank = MemoryBank.open(tmp_path / "b", "r")
    assert list(bank)[:-1] == before and bank.get(4).previous_text == "m4"


def test_hnsw_search_matches_exact_and_reflects_ops(tmp_path):
    v = clustered(3000, seed=1)
    n = 2000
    bank = MemoryBank.from_arrays(tmp_path / "b", v[:n], [f"m{i}" for i in range(n)],
                                  ["AB"[i % 2] for i in range(n)], ["t"] * n, hnsw_threshold=500)
    assert bank.stats()["hnsw_speakers"] == ["A", "B"]
    q = v[2500:2520]
    hits = sum(len(set(bank.search(x, 10).ids) & set(bank.search(x, 10, exact=True).ids)) for x in q)
    assert hits / (10 * len(q)) >= 0.95
    # Ops show at once, across base and delta.
    top = int(bank.search(q[0], 1).ids[0])
    bank.apply(Delete(top))
    assert top not in bank.search(q[0], 10).ids
    new = bank.apply(Add("exact copy", q[0].copy(), "B"))
    assert bank.search(q[0], 1).ids[0] == new
    assert all(bank.get(int(i)).speaker == "A" for i in bank.search(q[0], 10, speaker="A").ids)
    assert new not in bank.search(q[0], 10, speaker="A").ids
    bank.apply(Update(new, "moved", -q[0]))
    assert new not in bank.search(q[0], 10).ids
    fork = bank.fork()
    fork.apply(Delete(int(bank.search(q[1], 1).ids[0])))
    assert fork.search(q[1], 1).ids[0] != bank.search(q[1], 1).ids[0]
    bank.close()


def test_items_for_prompt_and_iteration():
    emb = HashEmbedder(256)
    facts = ["Andrew has two dogs", "Andrew likes hiking", "Maria works as a nurse", "Maria has a cat"]
    bank = MemoryBank.create(None, dim=emb.dim)
    vecs = emb.embed(facts)
    for f, v in zip(facts, vecs):
        bank.apply(Add(f, v, f.split()[0], "8 May 2023"))
    bank.apply(Noop())
    assert bank.items_for_prompt() == [(i, f, "8 May 2023") for i, f in enumerate(facts)]
    assert [r[0] for r in bank.items_for_prompt(speaker="Maria")] == [2, 3]
    top = bank.items_for_prompt(emb.embed(["how many dogs does Andrew have"])[0], k=1)
    assert top == [(0, "Andrew has two dogs", "8 May 2023")]


def test_hash_embedder_is_deterministic_and_normalised():
    e = HashEmbedder(64)
    a, b = e.embed(["the cat sat", "the cat sat"]), HashEmbedder(64).embed(["the cat sat", ""])
    assert np.array_equal(a[0], b[0]) and a.dtype == np.float32
    assert np.allclose(np.linalg.norm(b, axis=1), 1)


@pytest.mark.slow
def test_default_embedder_is_the_real_minilm():
    from memr1.memory_store import default_embedder

    e = default_embedder()
    v = e.embed(["cat", "kitten", "stock markets"])
    assert v.shape == (3, 384) and e.dim == 384
    assert v[0] @ v[1] > 0.6 > 0.3 > v[0] @ v[2]
