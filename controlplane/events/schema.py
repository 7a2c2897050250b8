"""Typed payload fields: validation with precise reasons, and JSON Schema.

Payloads are frozen dataclasses whose fields carry metadata made by `spec(...)`
(documentation, unit, bounds, allowed values). From the type hints and that
metadata this module validates a decoded msgpack map and builds the dataclass,
and it writes the JSON Schema that `rubick schema` prints and docs/events.md
documents. Pure code: no I/O.
"""

from __future__ import annotations

import dataclasses
import reprlib
import math
import re
import types
import typing
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Union, get_args, get_origin, get_type_hints


@dataclass(eq=False)
class Invalid(Exception):
    """Why a message was refused: which field, what was expected, what came."""

    reason: str
    field: str = ""
    expected: str = ""
    got: str = ""

    def __str__(self) -> str:
        where = f"{self.field}: " if self.field else ""
        detail = ""
        if self.expected or self.got:
            detail = f" (expected {self.expected or '?'}, got {self.got or '?'})"
        return f"{where}{self.reason}{detail}"


def spec(
    doc: str,
    *,
    unit: str = "",
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    choices: tuple[Any, ...] | None = None,
    pattern: str | None = None,
    max_len: int | None = None,
    default: Any = MISSING,
    default_factory: Any = MISSING,
    example: Any = None,
) -> Any:
    """A dataclass field with documentation and constraints."""
    meta = {"doc": doc, "unit": unit, "ge": ge, "gt": gt, "le": le, "choices": choices,
            "pattern": pattern, "max_len": max_len, "example": example}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=meta)
    if default is not MISSING:
        return field(default=default, metadata=meta)
    return field(metadata=meta)


def _short(value: Any, limit: int = 60) -> str:
    try:
        text = repr(value)
    except RecursionError:  # nested deeper than repr goes: show its first levels
        text = reprlib.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        inner = " or ".join(_type_name(a) for a in args)
        return f"{inner} or nil" if len(args) < len(get_args(tp)) else inner
    if origin in (tuple, list):
        return f"array of {_type_name(get_args(tp)[0])}"
    if origin is dict:
        return f"map of {_type_name(get_args(tp)[1])}"
    if dataclasses.is_dataclass(tp):
        return f"map ({tp.__name__})"
    return {str: "string", int: "integer", float: "number", bool: "boolean", bytes: "binary"}.get(tp, str(tp))


def _got(value: Any) -> str:
    kind = {str: "string", int: "integer", float: "number", bool: "boolean", bytes: "binary",
            list: "array", tuple: "array", dict: "map", type(None): "nil"}.get(type(value), type(value).__name__)
    return f"{kind} {_short(value)}"


_HINTS: dict[type, dict[str, Any]] = {}


def hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = get_type_hints(cls)
    return _HINTS[cls]


_BOUND_KEYS = ("choices", "max_len", "pattern", "ge", "gt", "le")


def convert(tp: Any, value: Any, path: str, meta: typing.Mapping[str, Any] | None = None) -> Any:
    """Check `value` (as msgpack decoded it) against type `tp`; return the typed value."""
    return converter(tp, meta)(value, path)


Converter = typing.Callable[[Any, str], Any]
_CONVERTERS: dict[Any, Converter] = {}


def converter(tp: Any, meta: typing.Mapping[str, Any] | None = None) -> Converter:
    """`convert` for one type (and field metadata), worked out once: what to check is decided here,
    not again for every value. Without metadata the result is cached per type."""
    if meta and any(meta.get(k) is not None for k in _BOUND_KEYS):
        return _compile(tp, meta)
    conv = _CONVERTERS.get(tp)
    if conv is None:
        conv = _CONVERTERS[tp] = _compile(tp, {})
    return conv


def _compile(tp: Any, meta: typing.Mapping[str, Any]) -> Converter:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        nullable = type(None) in args
        inner = [a for a in args if a is not type(None)]
        name = _type_name(tp)
        if len(inner) != 1:
            def inner_conv(value: Any, path: str) -> Any:
                raise TypeError(f"unsupported union at {path}")
        else:
            inner_conv = _compile(inner[0], meta)

        def union(value: Any, path: str) -> Any:
            if value is None:
                if nullable:
                    return None
                raise Invalid("must not be nil", path, name, "nil")
            return inner_conv(value, path)
        return union
    if origin in (tuple, list):
        (item_tp,) = get_args(tp)[:1]
        item = converter(item_tp)
        name = _type_name(tp)

        def sequence(value: Any, path: str) -> Any:
            if not isinstance(value, (list, tuple)):
                raise Invalid("wrong type", path, name, _got(value))
            return tuple([item(v, f"{path}[{i}]") for i, v in enumerate(value)])
        return sequence
    if origin is dict:
        key_tp, val_tp = get_args(tp)
        val = converter(val_tp)
        name, key_name = _type_name(tp), _type_name(key_tp)

        def mapping(value: Any, path: str) -> Any:
            if not isinstance(value, dict):
                raise Invalid("wrong type", path, name, _got(value))
            out = {}
            for k in sorted(value, key=str):
                if not isinstance(k, key_tp):
                    raise Invalid("wrong key type", f"{path}.{_short(k, 20)}", key_name, _got(k))
                out[k] = val(value[k], f"{path}.{k}")
            return out
        return mapping
    if dataclasses.is_dataclass(tp):
        return lambda value, path: build(tp, value, path)
    if tp is Any:
        return lambda value, path: value
    bounds = _bounds(meta)
    if tp is float:
        if bounds is not None and meta.get("choices") is None:
            return _bounded_number(meta)
        finite = _bounded_number({})  # the type and finiteness checks alone
        if bounds is None:
            return finite

        def number(value: Any, path: str) -> Any:
            value = finite(value, path)
            bounds(value, path)
            return value
        return number
    if bounds is not None and tp in (int, str):
        return _bounded_plain(tp, meta)
    checks = {int: "integer", bool: "boolean", str: "string", bytes: "binary"}
    if tp not in checks:
        def unsupported(value: Any, path: str) -> Any:
            raise TypeError(f"unsupported type {tp!r} at {path}")
        return unsupported
    expected = checks[tp]
    accepted = (bytes, bytearray) if tp is bytes else tp

    def plain(value: Any, path: str) -> Any:
        if not isinstance(value, accepted) or (tp is int and isinstance(value, bool)):
            raise Invalid("wrong type", path, expected, _got(value))
        if tp is bytes:
            value = bytes(value)
        if bounds is not None:
            bounds(value, path)
        return value
    return plain


def _bounded_number(meta: typing.Mapping[str, Any]) -> Converter:
    """The converter of a float field with bounds (`ge`, `gt`, `le`; no choices): the checks `number` and `_bounds`
    make, in their order and with their words, in one call (most event fields are bounded, and every event is
    checked)."""
    _, _, _, ge, gt, le = (meta.get(k) for k in _BOUND_KEYS)
    ranged = ge is not None or gt is not None or le is not None

    def bounded_number(value: Any, path: str) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise Invalid("wrong type", path, "number", _got(value))
        value = float(value)
        if not math.isfinite(value):
            raise Invalid("number must be finite", path, "a finite number", _short(value))
        if ranged:
            _in_range(value, path, ge, gt, le)
        return value
    return bounded_number


def _bounded_plain(tp: type, meta: typing.Mapping[str, Any]) -> Converter:
    """The converter of an int or str field with bounds: the checks `plain` and `_bounds` make, in their order and
    with their words, in one call. An integer is held to `ge`, `gt` and `le`; a string to `max_len` and `pattern`;
    either to `choices`, first."""
    choices, max_len, pattern, ge, gt, le = (meta.get(k) for k in _BOUND_KEYS)
    rx = re.compile(pattern) if pattern is not None else None
    allowed = "one of " + ", ".join(map(str, choices)) if choices is not None else ""
    ranged = ge is not None or gt is not None or le is not None

    if tp is int:
        def bounded_int(value: Any, path: str) -> Any:
            if not isinstance(value, int) or isinstance(value, bool):
                raise Invalid("wrong type", path, "integer", _got(value))
            if choices is not None and value not in choices:
                raise Invalid("value not allowed", path, allowed, _short(value))
            if ranged:
                _in_range(value, path, ge, gt, le)
            return value
        return bounded_int

    def bounded_str(value: Any, path: str) -> Any:
        if not isinstance(value, str):
            raise Invalid("wrong type", path, "string", _got(value))
        if choices is not None and value not in choices:
            raise Invalid("value not allowed", path, allowed, _short(value))
        _in_text(value, path, max_len, rx, pattern)
        return value
    return bounded_str


def _in_range(value: int | float, path: str, ge: Any, gt: Any, le: Any) -> None:
    """Refuse a number outside the bounds a field's metadata sets (None: no such bound)."""
    if ge is not None and value < ge:
        raise Invalid("out of range", path, f">= {ge}", _short(value))
    if gt is not None and value <= gt:
        raise Invalid("out of range", path, f"> {gt}", _short(value))
    if le is not None and value > le:
        raise Invalid("out of range", path, f"<= {le}", _short(value))


def _in_text(value: str, path: str, max_len: int | None, rx: re.Pattern | None, pattern: str | None) -> None:
    """Refuse a string longer than `max_len` or not matching `pattern` (compiled as `rx`)."""
    if max_len is not None and len(value) > max_len:
        raise Invalid("string too long", path, f"at most {max_len} characters", f"{len(value)} characters")
    if rx is not None and not rx.fullmatch(value):
        raise Invalid("string does not match the pattern", path, pattern, _short(value))


def _bounds(meta: typing.Mapping[str, Any]) -> Converter | None:
    """The checks the field metadata asks for (`spec`: choices, max_len, pattern, ge, gt, le), or
    None where it asks for none (a float's finiteness is checked by its converter)."""
    choices, max_len, pattern, ge, gt, le = (meta.get(k) for k in _BOUND_KEYS)
    if choices is None and max_len is None and pattern is None and ge is None and gt is None and le is None:
        return None
    rx = re.compile(pattern) if pattern is not None else None
    numeric = ge is not None or gt is not None or le is not None

    def check(value: Any, path: str) -> None:
        if choices is not None and value not in choices:
            raise Invalid("value not allowed", path, "one of " + ", ".join(map(str, choices)), _short(value))
        if isinstance(value, str):
            _in_text(value, path, max_len, rx, pattern)
        elif numeric and isinstance(value, (int, float)) and not isinstance(value, bool):
            if isinstance(value, float) and not math.isfinite(value):
                raise Invalid("number must be finite", path, "a finite number", _short(value))
            _in_range(value, path, ge, gt, le)
    return check


class _Never:
    """A type no value has: the fast-path type of a field that always needs its converter."""


_PLANS: dict[type, tuple[frozenset[str], tuple[tuple[str, Any, Converter, Any, bool], ...], str]] = {}


def _plan(cls: type):
    plan = _PLANS.get(cls)
    if plan is None:
        th = hints(cls)
        items = []
        for f in fields(cls):
            tp, meta = th[f.name], f.metadata
            constrained = any(meta.get(k) is not None for k in _BOUND_KEYS)
            # a plain value of exactly the declared type with nothing to check is taken as it is
            fast = tp if tp is not float and not constrained else _Never
            items.append((f.name, tp, converter(tp, meta), fast,
                          f.default is MISSING and f.default_factory is MISSING))
        names = frozenset(f.name for f in fields(cls))
        plan = (names, tuple(items), ", ".join(sorted(names)))
        _PLANS[cls] = plan
    return plan


class _Fallback(Exception):
    """A map the fast builder leaves to `build`'s checks (an unknown or missing field, not a map)."""


_FALLBACK = _Fallback()
_ABSENT = object()
_FAST: dict[type, typing.Callable[[Any, str], Any]] = {}


_INF = math.inf


def _accepts(tp: Any, meta: typing.Mapping[str, Any], var: str, env: dict[str, Any]) -> str | None:
    """A Python expression, true only where `converter(tp, meta)` would hand `var` back as it is (the same object,
    every check passed), for the fast builder to take it without the call; None where no such test is written for
    the type. A value the test does not take still goes to the converter, which accepts it or says why not."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:
            return None
        test = _accepts(inner[0], meta, var, env)
        if test is None:
            return None
        return f"({var} is None or {test})" if type(None) in args else test
    if tp is Any:
        return "True"
    if tp not in (int, str, float, bool):
        return None
    choices, max_len, pattern, ge, gt, le = (meta.get(k) for k in _BOUND_KEYS)
    n = len(env)
    env[f"cls{n}"] = tp
    terms = [f"{var}.__class__ is cls{n}"]
    if tp is float:
        terms.append(f"-INF < {var} < INF")  # finite: NaN compares false
    if choices is not None:
        env[f"choices{n}"] = choices
        terms.append(f"{var} in choices{n}")
    if tp is str:
        if max_len is not None:
            terms.append(f"len({var}) <= {int(max_len)}")
        if pattern is not None:
            env[f"rx{n}"] = re.compile(pattern)
            terms.append(f"rx{n}.fullmatch({var}) is not None")
    elif tp is not bool:
        for bound, key, op in ((ge, "ge", ">="), (gt, "gt", ">"), (le, "le", "<=")):
            if bound is not None:
                env[f"{key}{n}"] = bound
                terms.append(f"{var} {op} {key}{n}")
    elif pattern is not None or max_len is not None or any(b is not None for b in (ge, gt, le)):
        return None  # a bool with bounds of another kind: left to its converter
    return "(" + " and ".join(terms) + ")"


def _take(tp: Any, meta: typing.Mapping[str, Any], i: int, where: str, env: dict[str, Any], pad: str,
          building: set[type]) -> list[str]:
    """The fast builder's lines that set `a{i}`, field `i`'s value (`v`, known present), to what its converter
    `conv{i}` gives: checked inline where `_accepts` writes the test, a nested map built by its own fast builder, an
    array taken item by item; anything they do not take goes to the converter."""
    slow = f"conv{i}(v, {where})"
    test = _accepts(tp, meta, "v", env)
    if test is not None:
        return [f"{pad}a{i} = v if {test} else {slow}"]
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1 and type(None) in args:  # nil is nil; anything else is the inner type's
            return ([f"{pad}if v is None:", f"{pad}    a{i} = None", f"{pad}else:"]
                    + _take(inner[0], meta, i, where, env, pad + "    ", building))
    elif origin in (tuple, list):
        item_tp = get_args(tp)[0]
        item = _accepts(item_tp, {}, "x", env)  # an array's items are held to their type alone (`converter`)
        if item is not None:
            return [f"{pad}if v.__class__ is list or v.__class__ is tuple:",
                    f"{pad}    for x in v:",
                    f"{pad}        if not {item}:",
                    f"{pad}            a{i} = {slow}",
                    f"{pad}            break",
                    f"{pad}    else:",
                    f"{pad}        a{i} = tuple(v)",
                    f"{pad}else:",
                    f"{pad}    a{i} = {slow}"]
        if dataclasses.is_dataclass(item_tp) and item_tp not in building:
            env[f"nested{i}"] = _fast_for(item_tp, building)
            return _tried(pad, ["if v.__class__ is not list and v.__class__ is not tuple:", "    raise FALLBACK",
                                f"a{i} = tuple([nested{i}(x, path) for x in v])"], i, slow)
    elif dataclasses.is_dataclass(tp) and tp not in building:
        env[f"nested{i}"] = _fast_for(tp, building)
        return _tried(pad, [f"a{i} = nested{i}(v, path)"], i, slow)
    return [f"{pad}a{i} = v if v.__class__ is type{i} else {slow}"]


def _tried(pad: str, body: list[str], i: int, slow: str) -> list[str]:
    """Lines that set `a{i}` by `body` (nested maps built by their own fast builders), or by the converter (`slow`)
    where a nested builder leaves its map to the checks or refuses it: the converter then names the right path."""
    return ([f"{pad}try:"] + [f"{pad}    {line}" for line in body]
            + [f"{pad}except (Fallback, Invalid):", f"{pad}    a{i} = {slow}"])


def _fast_for(cls: type, building: set[type] | None = None) -> typing.Callable[[Any, str], Any]:
    fast = _FAST.get(cls)
    if fast is None:
        fast = _FAST[cls] = _fast_builder(cls, building)
    return fast


def _fast_builder(cls: type, building: set[type] | None = None) -> typing.Callable[[Any, str], Any]:
    """`build` of `cls` for a map that passes every check, written out field by field (every event read is built, and
    most pass): the same conversions, in the same order, giving the same values. The common checks (a bounded
    number or name, an array of them, a nested map) are written inline (`_take`), so a value that passes costs no
    call. Anything it does not take as it is (not a plain dict, an unknown or a missing required field, a value the
    inline checks do not take and its converter refuses) is handed back to `build`'s own checks, which give the
    refusal with its path. A nested map's own builder is handed the map's path: it is read only where the map is
    refused, and then the map is built again by its converter, which names the right path."""
    building = set() if building is None else building
    building.add(cls)
    names, items, _ = _plan(cls)
    hinted = hints(cls)
    declared = {f.name: f for f in fields(cls)}
    metas = {name: f.metadata for name, f in declared.items()}
    env: dict[str, Any] = {"names_within": names.issuperset, "FALLBACK": _FALLBACK, "ABSENT": _ABSENT, "cls": cls,
                           "Fallback": _Fallback, "Invalid": Invalid, "INF": _INF}
    lines = ["def fast(data, path):",
             "    if data.__class__ is not dict or not names_within(data):",
             "        raise FALLBACK"]
    for i, (name, _, conv, plain_type, required) in enumerate(items):
        env[f"conv{i}"], env[f"type{i}"], env[f"name{i}"] = conv, plain_type, name
        where = f"(path + {'.' + name!r} if path else {name!r})"
        lines.append(f"    v = data.get(name{i}, ABSENT)")
        if required:
            lines += ["    if v is ABSENT:", "        raise FALLBACK"]
            lines += _take(hinted[name], metas[name], i, where, env, "    ", building)
            continue
        default = declared[name]
        if default.default_factory is not MISSING:
            env[f"made{i}"] = default.default_factory
            lines += ["    if v is ABSENT:", f"        a{i} = made{i}()"]
        else:
            env[f"default{i}"] = default.default
            lines += ["    if v is ABSENT:", f"        a{i} = default{i}"]
        lines += ["    else:"] + _take(hinted[name], metas[name], i, where, env, "        ", building)
    # the fields given by position where they may be (a call by keyword costs about twice), in their order, then the
    # others by name
    named = [declared[name].kw_only for name, *_ in items]
    args = ([f"a{i}" for i, kw in enumerate(named) if not kw]
            + [f"{items[i][0]}=a{i}" for i, kw in enumerate(named) if kw])
    lines.append("    obj = cls(" + ", ".join(args) + ")")
    if hasattr(cls, "check"):
        lines.append("    obj.check(path)")
    lines.append("    return obj")
    exec("\n".join(lines), env)  # noqa: S102 - the source is made here from the dataclass's own field names
    building.discard(cls)
    return env["fast"]


def build(cls: type, data: Any, path: str = "") -> Any:
    """Validate a decoded map against dataclass `cls` and build it.

    Unknown keys, missing required keys, wrong types and out-of-range values
    raise `Invalid` naming the field.
    """
    fast = _FAST.get(cls)
    if fast is None:
        fast = _fast_for(cls)
    try:
        return fast(data, path)
    except (_Fallback, Invalid):
        pass  # the checks below find what the fast builder did not take, and say why
    if not isinstance(data, dict):
        raise Invalid("wrong type", path or "data", f"map ({cls.__name__})", _got(data))
    names, items, names_text = _plan(cls)
    for key in data:
        if key not in names:
            if not isinstance(key, str):
                raise Invalid("field names must be strings", path or "data", "string", _got(key))
            raise Invalid("unknown field", _join(path, key), "one of " + names_text, _short(data[key]))
    kwargs = {}
    for name, tp, conv, fast, required in items:
        if name not in data:
            if required:
                raise Invalid("missing required field", _join(path, name), _type_name(tp), "nothing")
            continue
        value = data[name]
        kwargs[name] = value if type(value) is fast else conv(value, _join(path, name))
    obj = cls(**kwargs)
    check = getattr(obj, "check", None)
    if check is not None:
        check(path)
    return obj


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


_PRIMITIVES = (str, int, float, bool, bytes, type(None))
_FIELD_NAMES: dict[type, tuple[str, ...] | None] = {}
_PLAIN: dict[type, typing.Callable[[Any], Any]] = {}
"""dataclass -> `to_plain` of an instance, written out field by field (`_plain_writer`)"""


def to_plain(obj: Any) -> Any:
    """A dataclass tree as plain maps/lists, keys in field order (stable bytes)."""
    t = type(obj)
    if t in _PRIMITIVES:
        return obj
    writer = _PLAIN.get(t)
    if writer is not None:
        return writer(obj)
    names = _FIELD_NAMES.get(t, ())
    if names == ():
        names = tuple(f.name for f in fields(obj)) if dataclasses.is_dataclass(obj) and t is not type else None
        _FIELD_NAMES[t] = names
        if names is not None and all(n.isidentifier() for n in names):
            _PLAIN[t] = _plain_writer(t, names)
    if names is not None:
        return {name: to_plain(getattr(obj, name)) for name in names}
    if t is list or t is tuple:
        return [to_plain(v) for v in obj]
    if t is dict:
        return {k: to_plain(obj[k]) for k in sorted(obj, key=str)}
    return obj


def _plain_writer(cls: type, names: tuple[str, ...]) -> typing.Callable[[Any], Any]:
    """`to_plain` of an instance of dataclass `cls` (fields `names`), written out: a field holding a plain value (a
    string, number, boolean, bytes or nil) is taken as it is, anything else goes to `to_plain` (every event sent is
    encoded, and most fields are plain)."""
    env: dict[str, Any] = {"plain": to_plain, "PRIMITIVES": frozenset(_PRIMITIVES)}
    lines = ["def write(obj):"]
    for i, name in enumerate(names):
        lines += [f"    v{i} = obj.{name}",
                  f"    if v{i}.__class__ not in PRIMITIVES:",
                  f"        v{i} = plain(v{i})"]
    lines.append("    return {" + ", ".join(f"{name!r}: v{i}" for i, name in enumerate(names)) + "}")
    exec("\n".join(lines), env)  # noqa: S102 - the source is made here from the dataclass's own field names
    return env["write"]


# --- JSON Schema -----------------------------------------------------------------

def json_schema(tp: Any, meta: typing.Mapping[str, Any] | None = None, defs: dict | None = None) -> dict:
    meta = meta or {}
    origin = get_origin(tp)
    out: dict[str, Any]
    if origin in (Union, types.UnionType):
        inner = [a for a in get_args(tp) if a is not type(None)]
        out = {"anyOf": [json_schema(inner[0], meta, defs), {"type": "null"}]}
    elif origin in (tuple, list):
        out = {"type": "array", "items": json_schema(get_args(tp)[0], None, defs)}
    elif origin is dict:
        out = {"type": "object", "additionalProperties": json_schema(get_args(tp)[1], None, defs)}
    elif dataclasses.is_dataclass(tp):
        out = object_schema(tp, defs)
    else:
        out = {"type": {str: "string", int: "integer", float: "number", bool: "boolean"}.get(tp, "string")}
        if tp is bytes:
            out = {"type": "string", "contentEncoding": "binary (msgpack bin)"}
        for key, js in (("ge", "minimum"), ("gt", "exclusiveMinimum"), ("le", "maximum")):
            if meta.get(key) is not None:
                out[js] = meta[key]
        if meta.get("choices") is not None:
            out["enum"] = list(meta["choices"])
        if meta.get("pattern") is not None:
            out["pattern"] = meta["pattern"]
        if meta.get("max_len") is not None:
            out["maxLength"] = meta["max_len"]
    if meta.get("doc"):
        out["description"] = meta["doc"] + (f" [{meta['unit']}]" if meta.get("unit") else "")
    return out


def object_schema(cls: type, defs: dict | None = None) -> dict:
    th = hints(cls)
    props = {}
    required = []
    for f in fields(cls):
        props[f.name] = json_schema(th[f.name], f.metadata, defs)
        if f.default is MISSING and f.default_factory is MISSING:
            required.append(f.name)
        elif f.default is not MISSING:
            props[f.name]["default"] = to_plain(f.default)
    out = {"type": "object", "title": cls.__name__, "properties": props, "additionalProperties": False}
    if cls.__doc__:
        out["description"] = " ".join(cls.__doc__.split())
    if required:
        out["required"] = required
    return out
