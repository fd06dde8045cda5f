"""The resolved run config written back as TOML (tomllib reads TOML but cannot write it): the copy in
each run directory that `memr1 train --config RUN_DIR/config.toml` and `memr1 eval` read again."""
import math
import re

import msgspec


def dump_toml(cfg: msgspec.Struct) -> str:
    """The resolved config as TOML (None values are left out: TOML has no null, and absent = None)."""
    lines: list[str] = []
    _emit_table(msgspec.to_builtins(cfg), [], lines)
    return "\n".join(lines).strip() + "\n"


def _emit_table(table: dict, path: list[str], lines: list[str]) -> None:
    scalars = {k: v for k, v in table.items() if not isinstance(v, dict) and v is not None}
    tables = {k: v for k, v in table.items() if isinstance(v, dict)}
    if path:
        lines.append("")
        lines.append("[" + ".".join(_key(p) for p in path) + "]")
    lines.extend(f"{_key(k)} = {_value(v)}" for k, v in scalars.items())
    for k, v in tables.items():
        _emit_table(v, path + [k], lines)


def _key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else _string(k)


def _string(s: str) -> str:
    out = s.replace("\\", "\\\\").replace('"', '\\"')
    out = re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\u{ord(m.group()):04x}", out)
    return f'"{out}"'


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items() if x is not None) + "}"
    raise TypeError(f"dump_toml: cannot write {type(v).__name__} value {v!r}")
