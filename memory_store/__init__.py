"""memr1.memory_store: a memory bank with O(1) ops, O(1) copy-on-write forks and a crash-safe op log."""
from memr1.memory_store.bank import MemoryBank, SearchResult
from memr1.memory_store.embed import CachedEmbedder, Embedder, HashEmbedder, MiniLMEmbedder, default_embedder
from memr1.memory_store.errors import (BankBusy, BankError, BankFormatError, BankIOError, BankLocked, CorruptLog,
                                       InvalidInput, ReadOnlyBank, UnknownMemoryId)
from memr1.memory_store.forks import search_forks
from memr1.memory_store.schema import Add, BankConfig, Delete, Memory, Noop, Op, Update

__all__ = ["MemoryBank", "SearchResult", "search_forks", "CachedEmbedder", "Embedder", "HashEmbedder", "MiniLMEmbedder", "default_embedder",
           "BankBusy", "BankError", "BankFormatError", "BankIOError", "BankLocked", "CorruptLog", "InvalidInput", "ReadOnlyBank",
           "UnknownMemoryId", "Add", "BankConfig", "Delete", "Memory", "Noop", "Op", "Update"]
