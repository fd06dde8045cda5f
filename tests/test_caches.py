"""Cache keys: a cached bank is reused only when everything that shapes it, its file format included, is
the same."""
from memr1.engine.config import caches
from memr1.engine.config.run import RunConfig

IDS = {"extract": "m@1", "manager": "m@1"}


def test_bank_key_follows_the_bank_format(monkeypatch):
    facts, bank = caches.cache_keys(RunConfig(), IDS)
    monkeypatch.setattr(caches, "BANK_FORMAT", caches.BANK_FORMAT + 1)
    facts2, bank2 = caches.cache_keys(RunConfig(), IDS)
    assert facts2 == facts  # extractions hold no bank, so they are kept
    assert bank2 != bank


def test_bank_key_follows_the_manager_model():
    assert caches.cache_keys(RunConfig(), IDS)[1] != caches.cache_keys(RunConfig(), {**IDS, "manager": "m@2"})[1]
