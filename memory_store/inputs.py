"""What callers pass to a bank, checked and converted before it reaches the native core or the disk: a
search's k and speaker, open's mode and fsync, a bank config, bulk-loaded rows, apply_batch's ops.
Each check raises InvalidInput with what was expected and what came."""
import operator
import re
import typing

import msgspec
import numpy as np

from memr1.memory_store.errors import InvalidInput
from memr1.memory_store.schema import MAX_NORM, MAX_SPEAKER_BYTES, MAX_TIMESTAMP_BYTES, MIN_NORM, BankConfig, Memory
from memr1.memory_store.storage import SYNC

_FIELD = re.compile(r"at `\$\.(\w+)`")
_CHOICES = ("fsync", "hnsw_dtype")  # the Literal fields, whose msgspec error does not list the choices


def check_k(k) -> int:
    """k of a search: an int (not a bool) in [0, 2**31)."""
    if type(k) is not int:
        if isinstance(k, bool) or not hasattr(type(k), "__index__"):
            raise InvalidInput(f"k must be an int in [0, 2**31), got {type(k).__name__} {k!r}")
        k = operator.index(k)
    if not 0 <= k < 2**31:
        raise InvalidInput(f"k must be an int in [0, 2**31), got {k}")
    return k


def check_search(k, speaker) -> int:
    """A search's k (check_k) and speaker (a str or None); returns k as an int."""
    k = check_k(k)
    if speaker is not None and not isinstance(speaker, str):
        raise InvalidInput(f"speaker must be a str or None, got {type(speaker).__name__}")
    return k


def check_open(mode, fsync) -> None:
    """MemoryBank.open's mode ("r" or "rw") and fsync (None: the bank's own policy)."""
    if mode not in ("r", "rw"):
        raise InvalidInput(f'mode must be "r" or "rw", got {mode!r}')
    if fsync is not None and not (isinstance(fsync, str) and fsync in SYNC):
        raise InvalidInput(f"fsync must be None or one of {', '.join(map(repr, SYNC))}, got {fsync!r}")


def iter_ops(ops) -> typing.Iterator:
    """An iterator over apply_batch's ops (each op is checked when it is applied)."""
    try:
        return iter(ops)
    except TypeError:
        raise InvalidInput(f"ops must be an iterable of Add, Update, Delete or Noop, got {type(ops).__name__}") from None


def make_config(dim, config, overrides) -> BankConfig:
    if config is None:
        if dim is None:
            raise InvalidInput("give the vector dim (dim=...) or a BankConfig")
        config = BankConfig(dim=dim)
    elif not isinstance(config, BankConfig):
        raise InvalidInput(f"config must be a BankConfig, got {type(config).__name__}")
    elif dim is not None and dim != config.dim:
        raise InvalidInput(f"dim={dim!r} disagrees with config.dim={config.dim!r}")
    unknown = sorted(set(overrides) - set(BankConfig.__struct_fields__))
    if unknown:
        raise InvalidInput(f"unknown bank setting {unknown[0]!r}; the settings are {', '.join(BankConfig.__struct_fields__)}")
    config = msgspec.structs.replace(config, **overrides) if overrides else config
    try:
        return msgspec.convert(msgspec.to_builtins(config), BankConfig)  # checks types, literals and ranges
    except msgspec.ValidationError as e:
        field = _FIELD.search(str(e))
        name = field.group(1) if field else "?"
        choices = typing.get_args(BankConfig.__annotations__.get(name)) if name in _CHOICES else ()
        allowed = f"; one of {', '.join(choices)}" if choices else ""
        raise InvalidInput(f"bad bank config {name}={getattr(config, name, '?')!r}: "
                           f"{_FIELD.sub('', str(e)).rstrip(' -')}{allowed}") from None


def bulk_rows(vectors, texts, speakers, timestamps, dim, config, overrides) -> tuple[BankConfig, np.ndarray, list[Memory]]:
    """MemoryBank.from_arrays' arguments as (config, vectors, the memories with ids 0..n-1); dim, when
    neither it nor a config is given, is the vectors' width."""
    try:
        vectors = np.array(vectors)  # a copy: checked here, written later, whatever the caller does meanwhile
    except (ValueError, TypeError) as e:
        raise InvalidInput(f"vectors must be a float32 array of shape (n, dim): {e}") from None
    if dim is None and config is None and vectors.ndim == 2:
        dim = vectors.shape[1]
    config = make_config(dim, config, overrides)
    validate_rows(config, vectors, texts, speakers, timestamps)
    if not (len(texts) == len(speakers) == len(timestamps) == len(vectors)):
        raise InvalidInput("vectors, texts, speakers and timestamps must have the same length")
    return config, vectors, [Memory(i, t, s, ts, i, i) for i, (t, s, ts) in enumerate(zip(texts, speakers, timestamps))]


def validate_rows(config: BankConfig, vectors: np.ndarray, texts, speakers, timestamps) -> None:
    """The checks an Add makes, vectorised for bulk loads."""
    if vectors.dtype != np.float32 or vectors.ndim != 2 or vectors.shape[1] != config.dim:
        raise InvalidInput(f"vectors must be float32 of shape (n, {config.dim}), got {vectors.dtype} {vectors.shape}")
    bad = np.flatnonzero(~np.isfinite(vectors).all(axis=1) | ~(vectors != 0).any(axis=1))
    if len(bad):
        raise InvalidInput(f"vector of row {bad[0]} is non-finite or all zeros")
    norms = np.sqrt(np.square(vectors, dtype=np.float64).sum(axis=1))
    bad = np.flatnonzero((norms < MIN_NORM) | (norms > MAX_NORM))
    if len(bad):
        raise InvalidInput(f"vector of row {bad[0]} has norm {norms[bad[0]]:.3g}, outside [2**-32, 2**32]; its "
                           f"float32 scores would overflow or underflow (rescale it, e.g. to unit length)")
    for name, column in (("texts", texts), ("speakers", speakers), ("timestamps", timestamps)):
        if not isinstance(column, (list, tuple)):
            raise InvalidInput(f"{name} must be a list of str, got {type(column).__name__}")
        for i, x in enumerate(column):
            if type(x) is not str:
                raise InvalidInput(f"{name}[{i}] must be a str, got {type(x).__name__}")
            try:
                n = len(x.encode())
            except UnicodeEncodeError:
                raise InvalidInput(f"{name}[{i}] is not encodable as UTF-8 (it holds a lone surrogate)") from None
            if name == "texts" and not 1 <= n <= config.max_text_bytes:
                raise InvalidInput(f"texts[{i}] is {n} bytes; a text must be 1..{config.max_text_bytes} "
                                   f"bytes (BankConfig.max_text_bytes)")
            if name == "speakers" and not n:
                raise InvalidInput(f"speakers[{i}] is empty")
            limit = {"speakers": MAX_SPEAKER_BYTES, "timestamps": MAX_TIMESTAMP_BYTES}.get(name)
            if limit is not None and n > limit:
                raise InvalidInput(f"{name}[{i}] is {n} bytes, over the limit of {limit}")
