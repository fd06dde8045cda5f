"""Every error the bank raises derives from BankError, whether Python or the native core raised it."""


class BankError(Exception):
    """Base class of memory_store errors."""


class UnknownMemoryId(BankError, KeyError):
    """UPDATE, DELETE or get() named an id that was never added or is deleted."""

    def __init__(self, memory_id: int):
        super().__init__(memory_id)
        self.memory_id = memory_id

    def __str__(self) -> str:
        return f"unknown memory id {self.memory_id}: it was never added or it was deleted"


class InvalidInput(BankError, ValueError):
    """A vector of the wrong dim or dtype, a non-finite vector, empty or oversized text."""


class ReadOnlyBank(BankError):
    """A write to a bank opened with mode="r"."""


class BankLocked(BankError):
    """Another writer holds the bank."""


class BankBusy(BankError):
    """An op waited auto_compact_wait_s for a background compaction to catch up (BankConfig's
    back-pressure) and was not applied. Retry it; nothing changed."""


class BankFormatError(BankError):
    """The path is not a memr1 bank of a version this code reads, or one of its files is damaged."""


class BankIOError(BankError, OSError):
    """The file system refused a read or write (a full disk, permissions, an I/O error). `errno` says
    which. The op or compaction that raised it changed nothing; retry once the cause is gone."""

    def __init__(self, message: str, errno: int = 0):
        super().__init__(errno, message)

    def __str__(self) -> str:
        return self.strerror

    def __reduce__(self):  # OSError's would pass (errno, message) back in the wrong order
        return type(self), (self.strerror, self.errno)


class CorruptLog(BankError):
    """A record in the middle of the op log fails its checksum. Never skipped silently."""

    def __init__(self, message: str, offset: int):
        super().__init__(message)
        self.offset = offset
