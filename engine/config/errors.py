"""Config errors: `ConfigError`, unknown keys refused at every depth, and messages for values msgspec
refuses: the dotted key, the value given, what is allowed (the whole range from the field's `Meta`,
not only the bound that failed), and who gave it: the file, or the `key=value` override that set it."""
from __future__ import annotations

import re

import msgspec
import msgspec.inspect as mi


class ConfigError(ValueError):
    """A config file or override is malformed; the message names the file, key and value."""


def check_keys(raw: dict, struct_type, where: str, prefix: str = "") -> None:
    """Every key must be a field of the Struct it lands in (recursively)."""
    fields = {f.encode_name: f for f in msgspec.structs.fields(struct_type)}
    for key, value in raw.items():
        dotted = f"{prefix}{key}"
        if key not in fields:
            raise ConfigError(f"{where}: unknown key {dotted!r}; known here: {', '.join(sorted(fields))}")
        sub = _struct_type(fields[key].type)
        if sub is not None:
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: {dotted!r} is a section; got the value {value!r}")
            check_keys(value, sub, where, dotted + ".")
        elif isinstance(value, dict) and not _allows_table(fields[key].type):
            raise ConfigError(f"{where}: {dotted!r} is a value, not a section; got {value!r}")


def _allows_table(tp) -> bool:
    return tp is dict or getattr(tp, "__origin__", None) is dict


def _struct_type(tp):
    return tp if isinstance(tp, type) and issubclass(tp, msgspec.Struct) else None


def _parts(path: str) -> list:
    """"stage.manager.group_size" / "learner.betas[0]" -> ["stage", "manager", "group_size"] / [..., 0]."""
    return [int(p[1:-1]) if p.startswith("[") else p for p in re.findall(r"\[\d+\]|[^.\[\]]+", path)]


def _value(raw, parts: list):
    node = raw
    for p in parts:
        try:
            node = node[p]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def _type_at(tp, parts: list):
    """The msgspec.inspect type at a path of a Struct type (None when the path leaves it)."""
    t = mi.type_info(tp)
    for p in parts:
        while isinstance(t, mi.UnionType):   # "X | None": follow the non-None member
            t = next((u for u in t.types if not isinstance(u, mi.NoneType)), None)
        if isinstance(p, int) and isinstance(t, (mi.TupleType, mi.VarTupleType, mi.ListType)):
            t = t.item_types[p] if isinstance(t, mi.TupleType) else t.item_type
        elif isinstance(p, str) and isinstance(t, mi.StructType):
            t = next((f.type for f in t.fields if f.encode_name == p), None)
        else:
            return None
    return t


def allowed_range(t) -> str | None:
    """"in (0, 1]", ">= 1", ...: the bounds a numeric field's Meta sets, or None."""
    if not isinstance(t, (mi.IntType, mi.FloatType)):
        return None
    # A float bound prints alike whether written 0 or 0.0: typing caches equal Annotated types, so which
    # spelling a field's Meta carries depends on which module made it first.
    num = (lambda v: f"{float(v):g}") if isinstance(t, mi.FloatType) else str
    low = ("[", num(t.ge)) if t.ge is not None else ("(", num(t.gt)) if t.gt is not None else None
    high = ("]", num(t.le)) if t.le is not None else (")", num(t.lt)) if t.lt is not None else None
    if low and high:
        return f"in {low[0]}{low[1]}, {high[1]}{high[0]}"
    if low:
        return f"{'>=' if low[0] == '[' else '>'} {low[1]}"
    if high:
        return f"{'<=' if high[0] == ']' else '<'} {high[1]}"
    return None


def validation_message(e: msgspec.ValidationError, raw: dict, root_type, where: str, by_key: dict) -> str:
    """One line for a ValidationError of `msgspec.convert(raw, root_type)`. `by_key`: dotted key ->
    the override item that set it."""
    text = str(e)
    m = re.fullmatch(r"(?s)(.*) - at `\$\.?(.*)`", text)
    if not m:
        return f"{where}: {text}"
    body, path = m.group(1), m.group(2)
    parts = _parts(path)
    key = ".".join(p for p in parts if isinstance(p, str)) + "".join(f"[{p}]" for p in parts if isinstance(p, int))
    t = _type_at(root_type, parts)
    if isinstance(t, mi.StructType):   # a component's own check (__post_init__): its message names the key
        src = next((item for k, item in by_key.items() if k.startswith(key + ".") and k.rsplit(".", 1)[1] in body),
                   where)
        return f"{src}: {body}"
    src = next((item for k, item in by_key.items() if key == k or key.startswith(k + ".") or key.startswith(k + "[")),
               where)
    value = _value(raw, parts)
    rng = allowed_range(t)
    if rng and re.match(r"Expected `\w+` [<>]", body):
        problem = f"must be {rng}"
    elif isinstance(t, mi.LiteralType):
        problem = f"must be one of {', '.join(repr(v) for v in t.values)}"
    else:
        problem = body[:1].lower() + body[1:]
    return f"{src}: {key} = {value!r}: {problem}"
