"""The calculus's own expression type: immutable, hash-consed ESM trees.

Invariants:

* A leaf is a ``str`` (variable or index name), an ``int`` or a ``float``
  (never ``bool``). Integer and float literals are distinct values, as in
  the wire format and the Julia reference (``IntExpr(1)`` is not
  ``NumExpr(1.0)``).
* Every :class:`Node` is built through :func:`node`, which interns it: two
  structurally equal nodes are the *same object*, so structural equality is
  ``is`` and hashing is by identity. This is what keeps simplification, CSE
  and band merging linear on the deep trees region lowering produces.
* Conversion from and to ``earthsci_ast.ExprNode`` and the wire dicts lives
  here and nowhere else. The array-expression op is stored under one tag
  (:data:`AGG`, ``"aggregate"``) whichever spelling (``faq``/``aggregate``)
  the source used; emission chooses the spelling.
"""
from __future__ import annotations

import math
import weakref
from typing import Any, Callable, Iterator, Union

__all__ = [
    "Node", "Expr", "AGG", "node", "with_args", "lit", "op", "is_lit", "is_zero", "is_one",
    "add", "mul", "neg", "map_children", "iter_children", "walk",
    "free_names", "from_ast", "to_ast", "to_wire", "from_wire",
    "stable_json", "format_float", "node_count", "substitute", "lhs_state", "thaw", "ARRAY_OPS",
    "is_array_expr",
]

AGG = "aggregate"                     # internal tag for faq / aggregate
_AGG_SPELLINGS = ("faq", "aggregate")

# Child-bearing fields other than ``args`` and ``expr`` (kept in ``extra``).
_LIST_KIDS = ("values",)
_ONE_KIDS = ("lower", "upper", "filter", "key")
_DICT_KIDS = ("table_axes",)


class _FDict(tuple):
    """A frozen dict: a tuple of sorted (key, value) pairs (hashable)."""
    __slots__ = ()


def _freeze(v: Any) -> Any:
    if isinstance(v, dict):
        return _FDict(sorted((str(k), _freeze(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)) and not isinstance(v, _FDict):
        return tuple(_freeze(x) for x in v)
    return v


def thaw(v: Any) -> Any:
    """A node field as plain data again: frozen mappings → dicts, tuples → lists."""
    if isinstance(v, _FDict):
        return {k: thaw(x) for k, x in v}
    if isinstance(v, tuple):
        return [thaw(x) for x in v]
    return v


def _leaf_key(x: Any) -> Any:
    # Tag literals by type so 1, 1.0 and -0.0 stay distinct keys.
    if isinstance(x, Node):
        return x
    if isinstance(x, str):
        return ("s", x)
    if isinstance(x, bool):
        raise TypeError("boolean literal in an expression")
    if isinstance(x, int):
        return ("i", x)
    if isinstance(x, float):
        return ("f", repr(x))
    raise TypeError(f"not an expression: {x!r}")


def _extra_key(extra: tuple) -> tuple:
    out = []
    for name, v in extra:
        if name in _LIST_KIDS:
            out.append((name, tuple(_leaf_key(c) for c in v)))
        elif name in _ONE_KIDS:
            out.append((name, _leaf_key(v)))
        elif name in _DICT_KIDS:
            out.append((name, tuple((k, _leaf_key(c)) for k, c in v)))
        else:
            out.append((name, _hashable_key(v)))
    return tuple(out)


def _hashable_key(v: Any) -> Any:
    # Scalar attributes may hold literal numbers (const tables): tag them too.
    if isinstance(v, tuple):
        return (type(v).__name__, tuple(_hashable_key(x) for x in v))
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, (int, float, str)):
        return _leaf_key(v)
    return v


class Node:
    """An interned operator node. Construct with :func:`node` only."""

    __slots__ = ("op", "args", "body", "extra", "_attrs", "__weakref__", "_cache")

    op: str
    args: tuple
    body: Any
    extra: tuple
    _attrs: dict[str, Any]
    _cache: dict[str, Any]

    def __setattr__(self, k, v):  # immutable once built
        raise AttributeError("Node is immutable")

    def attr(self, name: str, default: Any = None) -> Any:
        """A non-``args``/``expr`` field (frozen form), or ``default``."""
        return self._attrs.get(name, default)

    @property
    def values(self) -> tuple | None:
        return self._attrs.get("values")

    def cache(self) -> dict:
        """Per-node memo for derived, structure-only facts (keys, sets)."""
        return self._cache

    def __repr__(self) -> str:
        return f"Node({stable_json(to_wire(self))})"

    def __reduce__(self):
        return (from_wire, (to_wire(self),))


Expr = Union[Node, str, int, float]

_INTERN: "weakref.WeakValueDictionary[tuple, Node]" = weakref.WeakValueDictionary()


def node(op: str, args=(), body: Any = None, **fields: Any) -> Node:
    """The canonical node for (op, args, body, fields); ``None`` fields are dropped."""
    args = tuple(args)
    items: list[tuple[str, Any]] = []
    for name in sorted(fields):
        v = fields[name]
        if v is None:
            continue
        if name in _LIST_KIDS:
            v = tuple(v)
        elif name in _DICT_KIDS:
            v = _FDict(sorted(v.items())) if isinstance(v, dict) else v
        elif name not in _ONE_KIDS:
            v = _freeze(v)
        items.append((name, v))
    extra = tuple(items)
    key = (op, tuple(_leaf_key(a) for a in args),
           None if body is None else _leaf_key(body), _extra_key(extra))
    hit = _INTERN.get(key)
    if hit is not None:
        return hit
    n = object.__new__(Node)
    object.__setattr__(n, "op", op)
    object.__setattr__(n, "args", args)
    object.__setattr__(n, "body", body)
    object.__setattr__(n, "extra", extra)
    object.__setattr__(n, "_attrs", dict(extra))
    object.__setattr__(n, "_cache", {})
    # keep the key's strong refs alive exactly as long as the node
    n._cache["__key__"] = key
    _INTERN[key] = n
    return n


def with_args(e: Node, args) -> Node:
    """``e`` with new ``args`` and every other field kept."""
    return node(e.op, args, e.body, **dict(e.extra))


def op(o: str, *args: Expr, **fields: Any) -> Node:
    """Shorthand: an n-ary operator node."""
    return node(o, args, **fields)


def lit(x: float | int) -> int | float:
    return x


def is_lit(e: Any) -> bool:
    return isinstance(e, (int, float)) and not isinstance(e, bool)


def is_zero(e: Any) -> bool:
    return is_lit(e) and e == 0


def is_one(e: Any) -> bool:
    return is_lit(e) and e == 1


def add(*args: Expr) -> Expr:
    """n-ary ``+`` that drops literal zeros and collapses a single argument."""
    a = [x for x in args if not is_zero(x)]
    if not a:
        return 0
    return a[0] if len(a) == 1 else node("+", a)


def mul(*args: Expr) -> Expr:
    """n-ary ``*`` that short-circuits on a literal zero and drops literal ones."""
    if any(is_zero(x) for x in args):
        return 0
    a = [x for x in args if not is_one(x)]
    if not a:
        return 1
    return a[0] if len(a) == 1 else node("*", a)


def neg(x: Expr) -> Expr:
    return 0 if is_zero(x) else node("-", (x,))


# ── traversal ──────────────────────────────────────────────────────────────

def iter_children(e: Node) -> Iterator[Expr]:
    """Every child expression: args, body, then the rare child fields."""
    yield from e.args
    if e.body is not None:
        yield e.body
    for name, v in e.extra:
        if name in _LIST_KIDS:
            yield from v
        elif name in _ONE_KIDS:
            yield v
        elif name in _DICT_KIDS:
            for _, c in v:
                yield c


def map_children(e: Node, fn: Callable[[Expr], Expr]) -> Node:
    """``e`` with ``fn`` applied to every child; returns ``e`` itself when
    nothing changed (identity-preserving, so sharing survives rewrites)."""
    changed = False
    args = []
    for a in e.args:
        b = fn(a)
        changed |= b is not a
        args.append(b)
    body = e.body
    if body is not None:
        nb = fn(body)
        changed |= nb is not body
        body = nb
    fields: dict[str, object] = {}
    for name, v in e.extra:
        if name in _LIST_KIDS:
            kids = tuple(fn(c) for c in v)
            changed |= any(x is not y for x, y in zip(kids, v))
            fields[name] = kids
        elif name in _ONE_KIDS:
            kid = fn(v)
            changed |= kid is not v
            fields[name] = kid
        elif name in _DICT_KIDS:
            named = _FDict((k, fn(c)) for k, c in v)
            changed |= any(x[1] is not y[1] for x, y in zip(named, v))
            fields[name] = named
        else:
            fields[name] = v
    if not changed:
        return e
    return node(e.op, args, body, **fields)


ARRAY_OPS = (AGG, "makearray", "arrayop", "broadcast", "reshape", "transpose", "concat")


def is_array_expr(e: Expr, arrays) -> bool:
    """Whether ``e`` is array-valued: an array name (``arrays.is_array``), an
    array constructor (:data:`ARRAY_OPS`), or an elementwise operation with an
    array operand. ``index(...)`` reads one element, so it is scalar."""
    if isinstance(e, str):
        return arrays.is_array(e)
    if not isinstance(e, Node):
        return False
    if e.op in ARRAY_OPS:
        return True
    if e.op == "index":
        return False
    return any(is_array_expr(x, arrays) for x in e.args)


def walk(e: Expr) -> Iterator[Expr]:
    """Pre-order walk of every node and leaf (iterative: no recursion limit)."""
    stack = [e]
    while stack:
        x = stack.pop()
        yield x
        if isinstance(x, Node):
            stack.extend(reversed(list(iter_children(x))))


def node_count(e: Expr) -> int:
    """Number of nodes and leaves in the tree (memoized per node)."""
    if not isinstance(e, Node):
        return 1
    c = e._cache.get("nn")
    if c is None:
        c = 1 + sum(node_count(k) for k in iter_children(e))
        e._cache["nn"] = c
    return c


def free_names(e: Expr) -> frozenset:
    """Every ``str`` leaf under ``e`` (variables and index names), memoized.

    Deliberately over-approximate (bound index names are included): it is
    used as a structural occurrence gate, where a superset is safe.
    """
    if isinstance(e, str):
        return frozenset((e,))
    if not isinstance(e, Node):
        return frozenset()
    c = e._cache.get("fn")
    if c is None:
        acc: set = set()
        for k in iter_children(e):
            acc |= free_names(k)
        c = frozenset(acc)
        e._cache["fn"] = c
    return c


def substitute(e: Expr, bindings: dict) -> Expr:
    """Replace ``str`` leaves by ``bindings``; no capture avoidance (index
    names are entry-local, as in the reference)."""
    if not bindings:
        return e
    keys = frozenset(bindings)
    memo: dict = {}

    def go(x: Expr) -> Expr:
        if isinstance(x, str):
            return bindings.get(x, x)
        if not isinstance(x, Node) or not (free_names(x) & keys):
            return x
        r = memo.get(id(x))
        if r is None:
            r = map_children(x, go)
            memo[id(x)] = r
        return r

    return go(e)


# ── wire conversion ────────────────────────────────────────────────────────

def _canon_num(x: Any) -> Any:
    # Parse-canonical literal: an integral, Int64-representable float is an
    # integer literal (ESM conformance §5.5.3.1 rule 1).
    if isinstance(x, float) and math.isfinite(x) and x.is_integer() \
            and -2.0 ** 63 <= x < 2.0 ** 63:
        return int(x)
    return x


def _leaf(x):
    """A boolean, number or name leaf in canonical form (bool → int)."""
    if isinstance(x, bool):
        return int(x)
    return x if isinstance(x, str) else _canon_num(x)


def from_ast(e: Any) -> Expr:
    """Convert an ``earthsci_ast`` expression (ExprNode / str / number)."""
    from earthsci_ast.esm_types import ExprNode  # the boundary type
    import dataclasses

    if isinstance(e, (bool, int, float, str)):
        return _leaf(e)
    if not isinstance(e, ExprNode):
        raise TypeError(f"not an expression: {e!r}")
    fields: dict = {}
    body = None
    args: list = []
    for f in dataclasses.fields(e):
        v = getattr(e, f.name)
        if v is None or f.name == "op":
            continue
        if f.name == "args":
            args = [from_ast(a) for a in v]
        elif f.name == "expr":
            body = from_ast(v)
        elif f.name in _LIST_KIDS:
            fields[f.name] = [from_ast(a) for a in v]
        elif f.name in _ONE_KIDS:
            fields[f.name] = from_ast(v)
        elif f.name in _DICT_KIDS:
            fields[f.name] = {k: from_ast(a) for k, a in v.items()}
        else:
            fields[f.name] = v
    o = AGG if e.op in _AGG_SPELLINGS else e.op
    return node(o, args, body, **fields)


def to_wire(e: Expr, agg_spelling: str = "aggregate") -> Any:
    """The wire (JSON-able) form: dicts with ``op``/``args`` and fields."""
    if not isinstance(e, Node):
        return e
    d: dict = {"op": agg_spelling if e.op == AGG else e.op,
               "args": [to_wire(a, agg_spelling) for a in e.args]}
    if e.body is not None:
        d["expr"] = to_wire(e.body, agg_spelling)
    for name, v in e.extra:
        if name in _LIST_KIDS:
            d[name] = [to_wire(c, agg_spelling) for c in v]
        elif name in _ONE_KIDS:
            d[name] = to_wire(v, agg_spelling)
        elif name in _DICT_KIDS:
            d[name] = {k: to_wire(c, agg_spelling) for k, c in v}
        else:
            d[name] = thaw(v)
    return d


def from_wire(d: Any) -> Expr:
    """Inverse of :func:`to_wire` (also accepts raw ``.esm`` JSON expressions)."""
    if isinstance(d, (bool, int, float, str)):
        return _leaf(d)
    if not isinstance(d, dict):
        raise TypeError(f"not a wire expression: {d!r}")
    fields: dict[str, Any] = {}
    body = None
    for k, v in d.items():
        if k in ("op", "args"):
            continue
        if k == "expr":
            body = from_wire(v)
        elif k in _LIST_KIDS:
            fields[k] = [from_wire(c) for c in v]
        elif k in _ONE_KIDS:
            fields[k] = from_wire(v)
        elif k in _DICT_KIDS:
            fields[k] = {a: from_wire(c) for a, c in v.items()}
        else:
            fields[k] = v
    o = AGG if d["op"] in _AGG_SPELLINGS else d["op"]
    return node(o, [from_wire(a) for a in d.get("args", [])], body, **fields)


def to_ast(e: Expr, agg_spelling: str = "faq") -> Any:
    """Convert back to an ``earthsci_ast`` expression (for its evaluator)."""
    from earthsci_ast.parse import parse_expression  # type: ignore
    return parse_expression(to_wire(e, agg_spelling))


# ── deterministic JSON ─────────────────────────────────────────────────────

def format_float(x: float) -> str:
    """A float as the reference's JSON writer spells it (Julia/Ryu style:
    shortest round-trip digits, ``1.0e-5`` rather than Python's ``1e-05``)."""
    if math.isnan(x) or math.isinf(x):
        raise ValueError(f"non-finite float {x!r} cannot be written as JSON")
    s = repr(x)
    if "e" in s:
        mant, ex = s.split("e")
        if "." not in mant:
            mant += ".0"
        return f"{mant}e{int(ex)}"
    return s


def stable_json(x: Any) -> str:
    """Deterministic JSON: sorted keys, no whitespace, reference float style."""
    out: list[str] = []
    _sj(out, x)
    return "".join(out)


def _sj(out: list, x: Any) -> None:
    stack = [x]
    while stack:
        x = stack.pop()
        if isinstance(x, _Raw):
            out.append(x.s)
        elif isinstance(x, dict):
            items = sorted(x.items(), key=lambda kv: str(kv[0]))
            seq: list = [_Raw("{")]
            for i, (k, v) in enumerate(items):
                if i:
                    seq.append(_Raw(","))
                seq.append(_Raw(_json_str(str(k)) + ":"))
                seq.append(v)
            seq.append(_Raw("}"))
            stack.extend(reversed(seq))
        elif isinstance(x, (list, tuple)):
            seq = [_Raw("[")]
            for i, v in enumerate(x):
                if i:
                    seq.append(_Raw(","))
                seq.append(v)
            seq.append(_Raw("]"))
            stack.extend(reversed(seq))
        elif isinstance(x, bool):
            out.append("true" if x else "false")
        elif isinstance(x, int):
            out.append(str(x))
        elif isinstance(x, float):
            out.append(format_float(x))
        elif isinstance(x, str):
            out.append(_json_str(x))
        elif x is None:
            out.append("null")
        elif isinstance(x, Node):
            stack.append(to_wire(x))
        else:
            raise TypeError(f"cannot write {type(x).__name__} as JSON")


class _Raw:
    __slots__ = ("s",)

    def __init__(self, s: str):
        self.s = s


def _json_str(s: str) -> str:
    import json
    return json.dumps(s, ensure_ascii=False)


def lhs_state(lhs) -> str | None:
    """The state an equation integrates: ``D(u)``, ``D(u[i…])`` or the
    pointwise-lifted ``aggregate{expr: D(index(u, …))}`` form."""
    if not isinstance(lhs, Node):
        return None
    if lhs.op == AGG and isinstance(lhs.body, Node) and lhs.body.op == "D":
        a = lhs.body.args[0]
        if isinstance(a, Node) and a.op == "index" and isinstance(a.args[0], str):
            return a.args[0]
        return None
    if lhs.op == "D" and (lhs.attr("wrt") in (None, "t")):
        a = lhs.args[0]
        if isinstance(a, str):
            return a
    return None
