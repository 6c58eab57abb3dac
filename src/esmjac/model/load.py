"""The earthsci-ast boundary, and the catch-up items of docs/design.rst §3.

Loading, schema validation, template expansion, coupling and flattening are
earthsci-ast's job; this module only calls it and converts what comes back
into a :class:`SystemView` over the calculus's own expression type.

* Both spellings of the array-expression op (``faq``, and the pre-1.1.0
  ``aggregate``) arrive as one internal tag (``expr.AGG``).
* The esm 1.0.0 variable model: states, observed and parameters come from
  ``earthsci_ast.classification`` (single models) or from the equations of a
  flattened system — never from a declared ``state``/``observed`` type.
* A document with one model is viewed unscoped (names as the reference
  goldens spell them); a coupled document (coupling entries or reaction
  systems) goes through ``earthsci_ast.flatten`` and is viewed scoped.
"""
from __future__ import annotations

import itertools
import math

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import JacError
from .expr import AGG, Node, thaw, add, from_ast, lhs_state, map_children, node, substitute
from .validate import validate_view

__all__ = ["SystemView", "VarInfo", "load_view", "load_file", "lhs_state", "integrated_states", "ref_strings"]


@dataclass(frozen=True)
class VarInfo:
    """One variable of a view: its role, resolved shape and default."""

    name: str
    kind: str                  # "state" | "observed" | "parameter" | "algebraic"
    shape: tuple = ()          # sizes per dimension; () for a scalar
    shape_names: tuple = ()    # index-set names per dimension, where known
    default: Any = None
    element_type: str | None = None


@dataclass(frozen=True)
class SystemView:
    """A differentiable system: variables, equations (lhs, rhs) as internal
    expressions, index-set sizes, and the earthsci-ast object evaluators use."""

    name: str
    variables: dict
    equations: tuple           # ((lhs, rhs), …) in document order
    index_sets: dict           # name → size (intervals only)
    observed: dict             # name → definition (bare-LHS), document order
    indexed_observed: frozenset  # observed defined only by an indexed LHS
    source: Any                # EsmFile or FlattenedSystem (for evaluate_rhs)
    scope: str                 # prefix evaluate_rhs puts before our names ("Chem.")
    element_type: str | None = None
    meta: dict = field(default_factory=dict)
    #: The states earthsci-ast's problem integrates, in its order (local
    #: names). Includes states whose derivative is identically zero (a
    #: reaction species no reaction changes, an unknown with no equation).
    integrated: tuple | None = None

    @property
    def states(self) -> list:
        return sorted(n for n, v in self.variables.items() if v.kind in ("state", "algebraic"))

    @property
    def parameters(self) -> list:
        return sorted(n for n, v in self.variables.items() if v.kind == "parameter")

    def shape(self, name: str) -> tuple:
        v = self.variables.get(name)
        return v.shape if v is not None else ()


#: Bytes of model data per index-set element assumed when bounding a
#: document before it is loaded (earthsci-ast holds per-element Python
#: objects; esmjac a few float64 vectors).
_BYTES_PER_ELEMENT = 64


def _json_depth_text(data: bytes) -> int:
    """Deepest ``[``/``{`` nesting of JSON text, counted without recursion
    (strings removed first)."""
    import re

    import numpy as np

    text = re.sub(rb'"(?:[^"\\]|\\.)*"', b"", data)
    b = np.frombuffer(text, np.uint8)
    step = (np.isin(b, (0x5B, 0x7B)).astype(np.int64) - np.isin(b, (0x5D, 0x7D)).astype(np.int64))
    return int(np.cumsum(step).max(initial=0))


def _json_depth_tree(obj: Any) -> int:
    best, stack = 0, [(obj, 1)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, dict):
            best = max(best, d)
            stack.extend((v, d + 1) for v in x.values())
        elif isinstance(x, (list, tuple)):
            best = max(best, d)
            stack.extend((v, d + 1) for v in x)
    return best


def _read_document(path: Path, what: str) -> bytes:
    """The bytes of a document file: a regular file (a device, FIFO or
    folder is refused before anything is read) within the document limit."""
    import os
    import stat

    from ..limits import document_limit

    cap = document_limit()
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise JacError("load_error", f"no such file: {what}") from None
    except OSError as exc:
        raise JacError("load_error", f"cannot open {what}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise JacError("load_error", f"{what} is not a regular file (a device, FIFO or folder); "
                           "esmjac reads documents from regular files only")
        if st.st_size > cap:
            raise JacError("load_error", f"{what} has {st.st_size:,} bytes, over the document limit of "
                           f"{cap:,} bytes (ESMJAC_DOCUMENT_LIMIT)")
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read(cap + 1)
    except OSError as exc:
        raise JacError("load_error", f"cannot read {what}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > cap:
        raise JacError("load_error", f"{what} grew past the document limit of {cap:,} bytes while read")
    return data


def _check_text(data: bytes, what: str) -> Any:
    """The parsed JSON of ``data`` after its depth is checked, or None (not
    JSON: earthsci-ast says why)."""
    import json

    from ..limits import document_depth_limit

    lim = document_depth_limit()
    depth = _json_depth_text(data)
    if depth > lim:
        raise JacError("invalid_document", f"{what} nests {depth:,} levels deep, over the limit of {lim:,} "
                       "(ESMJAC_MAX_DEPTH)")
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def _check_tree(tree: Any, what: str) -> None:
    """Index-set sizes of one document file, bounded before earthsci-ast
    builds anything for them."""
    from ..limits import workspace_limit
    from .validate import MAX_SIZE

    sets = tree.get("index_sets") if isinstance(tree, dict) else None
    if not isinstance(sets, dict):
        return
    for name, spec in sets.items():
        size = spec.get("size") if isinstance(spec, dict) else None
        if isinstance(size, bool) or not isinstance(size, (int, float)):
            continue            # not a number: the schema refuses it
        if not (size == size and abs(size) <= MAX_SIZE):
            raise JacError("invalid_document", f"index set `{name}` of {what} has size {size!r}; sizes must "
                           f"be between 1 and {MAX_SIZE}")
        need = int(size) * _BYTES_PER_ELEMENT
        if need > workspace_limit():
            raise JacError("invalid_document", f"index set `{name}` of {what} has {int(size):,} elements: "
                           f"loading it needs about {need:,} bytes, over the memory limit of "
                           f"{workspace_limit():,} bytes (ESMJAC_WORKSPACE_LIMIT)")


def ref_strings(tree: Any) -> list:
    """Every string ``ref`` value in a JSON tree (iterative: documents nest deeply)."""
    out, stack = [], [tree]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            r = x.get("ref")
            if isinstance(r, str):
                out.append(r)
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return out


def preflight(source: Any) -> None:
    """Bound a document before earthsci-ast reads it (untrusted input): the
    file is a regular file within the document limit, its nesting within
    the depth limit, its index sets within the memory limit, and so is every
    file it pulls in through ``ref`` — local files only (a URL is refused
    unless ``$ESMJAC_ALLOW_URL_REFS=1``), a cycle of refs refused."""
    import os

    from earthsci_ast.json_walk import expand_ref_env

    from ..limits import document_depth_limit

    if isinstance(source, dict):
        lim = document_depth_limit()
        if _json_depth_tree(source) > lim:
            raise JacError("invalid_document", f"the document nests deeper than the limit of {lim:,} levels "
                           "(ESMJAC_MAX_DEPTH)")
        root, base, name = source, Path.cwd(), "the document"
    elif isinstance(source, Path) or (isinstance(source, str) and not source.lstrip().startswith("{")):
        p = Path(source)
        root = _check_text(_read_document(p, str(source)), str(source))
        base, name = p.absolute().parent, str(p.absolute())
    elif isinstance(source, str):
        try:
            data = source.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise JacError("load_error", f"the document text is not valid Unicode ({exc.reason} at "
                           f"position {exc.start})") from None
        root, base, name = _check_text(data, "the document"), Path.cwd(), "the document"
    else:
        return
    allow_urls = os.environ.get("ESMJAC_ALLOW_URL_REFS") == "1"
    # Depth-first over refs, with the chain of files that led to each one.
    todo: list = [(root, base, (name,))]
    done: set = set()
    while todo:
        tree, b, chain = todo.pop()
        _check_tree(tree, chain[-1])
        for ref in ref_strings(tree):
            r = expand_ref_env(ref)
            if "://" in r:
                if allow_urls:
                    continue
                raise JacError("load_error", f"`ref` {ref!r} in {chain[-1]} is a URL; esmjac reads local "
                               "files only (set ESMJAC_ALLOW_URL_REFS=1 to allow URL refs)")
            p = Path(os.path.normpath(os.path.join(str(b), r)))
            if not p.exists() and not p.is_symlink():
                continue            # earthsci-ast reports the missing file in its own words
            key = str(p.resolve())
            if key in chain:
                raise JacError("invalid_document", "the documents' refs form a cycle: "
                               + " -> ".join(list(chain[chain.index(key):]) + [key]))
            if (key, chain[-1]) in done:
                continue
            done.add((key, chain[-1]))
            if len(done) > 10_000:
                raise JacError("invalid_document", "the document pulls in more than 10,000 files through refs")
            sub = _check_text(_read_document(p, f"`ref` {ref!r} ({p})"), str(p))
            todo.append((sub, p.parent, chain + (key,)))


def load_file(source: Any):
    """``source`` (path, JSON text, dict, EsmFile or FlattenedSystem) as an
    earthsci-ast object, after :func:`preflight`. Errors become
    ``JacError("load_error")`` (or ``invalid_document``)."""
    import earthsci_ast as ea
    from earthsci_ast.flatten import FlattenedSystem

    if isinstance(source, (ea.EsmFile, FlattenedSystem)):
        return source
    preflight(source)
    try:
        with warnings.catch_warnings():
            # The pre-1.1.0 `aggregate` spelling is accepted on purpose.
            warnings.simplefilter("ignore")
            if isinstance(source, dict):
                return ea.load_document(source)
            if isinstance(source, Path) or (isinstance(source, str) and not source.lstrip().startswith("{")):
                p = Path(source)
                if not p.exists():
                    raise JacError("load_error", f"no such file: {source}")
                return ea.load_path(p, base_path=str(p.parent))
            if isinstance(source, str):
                return ea.load_string(source)
    except JacError:
        raise
    except Exception as exc:  # earthsci-ast's own typed errors, reported whole
        raise JacError("load_error", f"{type(exc).__name__}: {exc}") from exc
    raise JacError("load_error", f"cannot load a {type(source).__name__} as an .esm document")


def _const_at(table, idx):
    """``table[idx…]`` (1-based) when every index is an integer literal in
    range and the entry is a number, else None."""
    v = table
    for i in idx:
        if not (isinstance(i, int) and not isinstance(i, bool) and isinstance(v, tuple) and 1 <= i <= len(v)):
            return None
        v = v[i - 1]
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _bottom_up(e, fn):
    """``e`` rewritten node by node, children first: ``fn(node)`` returns
    the node's replacement (itself when nothing changes). Memoized on the
    interned nodes, so a shared subtree is rewritten once."""
    if not isinstance(e, Node):
        return e
    memo: dict = {}

    def go(x):
        if not isinstance(x, Node):
            return x
        if x not in memo:
            memo[x] = fn(map_children(x, go))
        return memo[x]

    return go(e)


def fold_geometry(e, observed: dict):
    """``polygon_intersection_area`` (esm-spec §8.6.1) of two constant rings
    (``const`` literals, or observed defined by one) is a number, computed
    here by earthsci-ast's own clip and area (the same kernel its problem
    evaluates). Over rings that move with the state it is left as it is
    (and refused: the geometry kernel has no derivative rule here)."""
    def ring(a):
        d = observed.get(a) if isinstance(a, str) else a
        if isinstance(d, Node) and d.op == "const" and isinstance(d.attr("value"), tuple):
            return thaw(d.attr("value"))
        return None

    def fold(y):
        if y.op == "polygon_intersection_area" and len(y.args) == 2 and isinstance(y.attr("manifold"), str):
            a, b = ring(y.args[0]), ring(y.args[1])
            if a is not None and b is not None:
                import numpy as np
                from earthsci_ast import geometry
                from earthsci_ast.area_faq import polygon_area_via_faq
                try:
                    r = geometry.intersect_polygon(np.asarray(a, float), np.asarray(b, float), y.attr("manifold"))
                    return float(polygon_area_via_faq(r, y.attr("manifold")))
                except Exception as exc:      # earthsci-ast's own geometry refusal
                    raise JacError("invalid_document",
                                   f"polygon_intersection_area of constant rings failed: {exc}") from exc
        return y

    return _bottom_up(e, fold)


def normalize_expr(e):
    """``e`` in the forms the calculus and the compiler read.

    A scalar ``const`` (what earthsci-ast's enum lowering leaves for
    ``enum(set, symbol)``, esm-spec §9.3) is its literal, and so is a
    ``const`` table read at literal indices (a categorical lookup). Every filtered sum
    is written as a gated sum: an aggregate
    ``Σ_{j : filter} body`` (``reduce: "+"``, esm-spec §5.4 ``filter``) is
    ``Σ_j ifelse(filter, body, 0)`` — the same value, and a form the band
    calculus, the oracle and the compiler already differentiate and
    evaluate (a prefix sum ``j <= i`` becomes a triangular band). Other
    semirings, joins and keyed aggregates keep their filter (refused later)."""
    def norm(y):
        if y.op == "const" and not y.args:
            v = y.attr("value")
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                return v
        if y.op == "index" and y.args and isinstance(y.args[0], Node) and y.args[0].op == "const":
            v = _const_at(y.args[0].attr("value"), y.args[1:])
            if v is not None:
                return v
        f = y.attr("filter") if y.op == AGG else None
        if (f is not None and y.attr("reduce") in (None, "+")
                and y.attr("semiring") in (None, "sum_product")
                and not y.attr("join") and y.attr("key") is None and not y.attr("arg")):
            fields = {k: v for k, v in y.extra if k != "filter"}
            y = node(AGG, y.args, node("ifelse", (f, y.body, 0)), **fields)
        return y

    return _bottom_up(e, norm)


#: Most terms a contraction of an observed definition is unrolled into.
UNROLL_TERMS = 512


def _span(r, sizes: dict):
    """(lo, hi) of a literal or ``{"from": set}`` range, None otherwise."""
    if isinstance(r, tuple) and r and not isinstance(r[0], tuple):
        if all(isinstance(x, int) and not isinstance(x, bool) for x in r):
            if len(r) == 2:
                return r[0], r[1]
            if len(r) == 3 and r[1] == 1:
                return r[0], r[2]
        return None
    d = dict(r) if isinstance(r, tuple) else {}
    if set(d) == {"from"} and d["from"] in sizes:
        return 1, sizes[d["from"]]
    return None


def unroll_contractions(e, sizes: dict):
    """An array observed ``F[i] = Σ_j body(i, j)`` (a ``+`` aggregate that
    contracts some ranges) as ``F[i] = body(i, 1) + … + body(i, n)``. A read
    ``F[e]`` inlines by binding ``i`` (β-reduction), which on the contracted
    form would leave ``j`` unbound; unrolled, the read is an ordinary scalar
    sum the calculus differentiates term by term. Contractions of more than
    :data:`UNROLL_TERMS` terms, or over ranges not known here, are kept."""
    if not (isinstance(e, Node) and e.op == AGG and e.attr("output_idx")):
        return e
    if (e.attr("reduce") not in (None, "+") or e.attr("semiring") not in (None, "sum_product")
            or e.attr("filter") is not None or e.attr("join") or e.attr("key") is not None or e.attr("arg")):
        return e
    oidx = set(e.attr("output_idx"))
    ranges = dict(e.attr("ranges") or ())
    contracted = sorted(n for n in ranges if n not in oidx)
    if not contracted:
        return e
    spans = [_span(ranges[n], sizes) for n in contracted]
    if any(sp is None for sp in spans) or math.prod(hi - lo + 1 for lo, hi in spans) > UNROLL_TERMS:
        return e
    terms = [substitute(e.body, dict(zip(contracted, vals)))
             for vals in itertools.product(*(range(lo, hi + 1) for lo, hi in spans))]
    fields = {k: v for k, v in e.extra if k != "ranges"}
    fields["ranges"] = {n: thaw(r) for n, r in ranges.items() if n in oidx}
    return node(AGG, e.args, add(*terms), **fields)


#: The empty extremum's value: earthsci-ast's identities are ∓inf, which no
#: document literal may be (validate refuses non-finite literals); an
#: extremum over no admitted term is the only place it differs.
_EMPTY = {"max": -1.7976931348623157e308, "min": 1.7976931348623157e308}


def unroll_extrema(e, sizes: dict):
    """Every ``reduce: "max"``/``"min"`` aggregate (optionally filtered)
    whose contracted ranges are known and small, as a closed chain of
    ``max``/``min`` over the admitted terms: with ``f_k`` the filter at the
    k-th point and ``b_k`` the body, ``acc_k = ifelse(f_k, ifelse(any_{k-1},
    max(acc_{k-1}, b_k), b_k), acc_{k-1})``. Its derivative is the admitted
    arg-max term's (the calculus's ``max`` rule), and it needs no infinite
    identity unless no term is admitted (then :data:`_EMPTY`)."""
    def unroll(y):
        red = y.attr("reduce") if y.op == AGG else None
        if (red in ("max", "min") and y.attr("semiring") in (None,) and not y.attr("join")
                and y.attr("key") is None and not y.attr("arg")):
            oidx = [n for n in (y.attr("output_idx") or ()) if isinstance(n, str)]
            ranges = dict(y.attr("ranges") or ())
            contracted = sorted(n for n in ranges if n not in oidx)
            spans = [_span(ranges[n], sizes) for n in contracted]
            if contracted and None not in spans and math.prod(hi - lo + 1 for lo, hi in spans) <= UNROLL_TERMS:
                f = y.attr("filter")
                acc = anyf = None
                for vals in itertools.product(*(range(lo, hi + 1) for lo, hi in spans)):
                    sub = dict(zip(contracted, vals))
                    b = substitute(y.body, sub)
                    fk = 1 if f is None else substitute(f, sub)
                    if acc is None:
                        acc, anyf = b, fk
                        continue
                    step = node(red, (acc, b))
                    acc = node("ifelse", (fk, node("ifelse", (anyf, step, b)), acc))
                    anyf = node("or", (anyf, fk)) if f is not None else 1
                body = acc if f is None else node("ifelse", (anyf, acc, _EMPTY[red]))
                fields = {k: v for k, v in y.extra if k not in ("ranges", "reduce", "filter")}
                fields["ranges"] = {n: thaw(r) for n, r in ranges.items() if n in oidx}
                y = node(AGG, y.args, body, **fields) if oidx else body
        return y

    return _bottom_up(e, unroll)


def _sizes(index_sets: dict) -> dict:
    out = {}
    for n, s in (index_sets or {}).items():
        size = s.get("size") if isinstance(s, dict) else getattr(s, "size", None)
        if isinstance(size, int):
            out[str(n)] = size
    return out


def _resolve_shape(shape, sizes: dict, name: str) -> tuple:
    out = []
    for x in shape or ():
        if isinstance(x, int):
            out.append(x)
        elif x in sizes:
            out.append(sizes[x])
        else:
            raise JacError("unsupported_construct",
                           f"variable `{name}` has a dimension over `{x}`, which is not a sized interval index set")
    return tuple(out)


def load_view(source: Any, model: str | None = None) -> SystemView:
    """Load ``source`` and view the model to differentiate (see module doc);
    malformed models are refused by :func:`esmjac.model.validate.validate_view`.

    Without ``model=`` the view is what ``earthsci_ast.esm_problem`` builds
    for the whole document: a document with one model and no coupling,
    subsystems or reaction systems is viewed unscoped; anything else (several
    models, coupling entries, reaction systems, nested subsystems) is viewed
    through ``earthsci_ast.flatten``. ``model=`` picks one model of several.
    """
    view = _load_view(source, model)
    validate_view(view)
    return view


def _load_view(source: Any, model: str | None = None) -> SystemView:
    from earthsci_ast.flatten import FlattenedSystem

    f = _lower_tables(load_file(source))
    if isinstance(f, FlattenedSystem):
        return _flat_view(f)
    models = dict(f.models or {})
    coupled = bool(f.coupling) or bool(f.reaction_systems)
    if model is not None:
        if model in models:
            if _has_subsystems(models[model]) and not coupled:
                raise JacError("unsupported_construct",
                               f"model `{model}` has subsystems; build the whole document (no model=), "
                               "which flattens them as earthsci_ast does")
            return _single_view(f, model)
        systems = dict(getattr(f, "reaction_systems", None) or {})
        if coupled and model in systems:
            # A coupled document is differentiated as one flattened system;
            # naming one of its reaction systems selects that document.
            return _flat_view(_flatten(f))
        known = sorted(models) + sorted(systems)
        raise JacError("model_not_found",
                       f"model `{model}` is not in the document (it has: {', '.join(known) or 'none'})")
    if not models and not f.reaction_systems:
        raise JacError("load_error", "the document has no models to differentiate")
    if coupled or len(models) != 1 or _has_subsystems(next(iter(models.values()))):
        return _flat_view(_flatten(f))
    return _single_view(f, next(iter(models)), whole=True)


def _lower_tables(f):
    """``table_lookup`` nodes rewritten as the ``interp.linear`` /
    ``interp.bilinear`` / ``index`` trees over ``const`` tables they stand for
    (esm-spec §9.5.3), by earthsci-ast's own build-time lowering: the same
    tree its problem evaluates, so the same tie and boundary rules. A
    document with no ``function_tables`` comes back unchanged."""
    from earthsci_ast.flatten import FlattenedSystem
    from earthsci_ast.lower_table_lookup import lower_flattened_table_lookups, lower_table_lookups
    try:
        if isinstance(f, FlattenedSystem):
            return lower_flattened_table_lookups(f)
        return lower_table_lookups(f)
    except (ValueError, KeyError, TypeError) as exc:
        code = getattr(exc, "code", None)
        raise JacError("invalid_document",
                       f"a `table_lookup` could not be lowered ({getattr(code, 'value', code) or type(exc).__name__}): {exc}") from exc


def _single_view(f, name: str, whole: bool = False) -> SystemView:
    """One model viewed unscoped, its states in earthsci-ast's order (from
    ``flatten``). ``whole``: the model is the whole document, so a state
    flatten files elsewhere means the document must be viewed flattened."""
    flat = _flatten_or_none(f)
    order = None
    if flat is not None:
        scope = f"{name}."
        full = integrated_states(flat)
        mine = [n for n in full if n.startswith(scope) and "." not in n[len(scope):]]
        if whole and len(mine) != len(full):
            return _flat_view(flat)
        order = tuple(n[len(scope):] for n in mine)
    return _model_view(f, name, order)


def _has_subsystems(m) -> bool:
    return bool(getattr(m, "subsystems", None))


def _flatten_or_none(f):
    try:
        return _flatten(f)
    except JacError:
        return None


def integrated_states(flat) -> list:
    """The states earthsci-ast's problem integrates, in its order (scoped).

    Mirrors earthsci-ast 0.5's rule (``flatten._integrated_state_names`` less
    the algebraically defined states of its array build; both private, hence
    re-derived here): every ``state_variables`` entry that is not also an
    observed and is not defined only by a bare-LHS equation.
    """
    observed = set(flat.observed_variables or {})
    states = flat.state_variables or {}
    differentiated, bare = set(), set()
    for eq in flat.equations:
        lhs = from_ast(eq.lhs)
        u = lhs_state(lhs)
        if u is not None:
            differentiated.add(u)
        elif isinstance(lhs, str) and lhs in states:
            bare.add(lhs)
    algebraic = bare - differentiated
    return [n for n in states if n not in observed and n not in algebraic]


def _flatten(f):
    import earthsci_ast as ea
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ea.flatten(f)
    except Exception as exc:
        raise JacError("load_error", f"earthsci_ast.flatten failed: {type(exc).__name__}: {exc}") from exc


def _model_view(f, name: str, order: tuple | None = None) -> SystemView:
    from earthsci_ast import classification as cl

    m = f.models[name]
    sizes = _sizes(f.index_sets)
    states = set(cl.ode_states(m)) | set(order or ())
    observed_all = set(cl.observed_unknowns(m))
    defs_bare = cl.observed_definitions(m, bare_only=True)
    params = set(cl.parameters(m))
    unknowns = set(cl.unknowns(m))
    variables = {}
    for vname, var in m.variables.items():
        if vname in params:
            kind = "parameter"
        elif vname in states:
            kind = "state"
        elif vname in observed_all:
            kind = "observed"
        elif vname in unknowns:
            kind = "algebraic"
        else:
            continue
        variables[vname] = VarInfo(vname, kind, _resolve_shape(var.shape, sizes, vname),
                                   tuple(var.shape or ()), var.default,
                                   getattr(var, "element_type", None))
    eqs = []
    for eq in m.equations:
        eqs.append((from_ast(eq.lhs), unroll_extrema(normalize_expr(from_ast(eq.rhs)), sizes)))
    observed = {n: unroll_contractions(normalize_expr(from_ast(r)), sizes) for n, r in defs_bare.items()}
    observed = {n: fold_geometry(d, observed) for n, d in observed.items()}
    eqs = [(lhs, fold_geometry(rhs, observed)) for lhs, rhs in eqs]
    dom = getattr(f, "domain", None)
    et = getattr(dom, "element_type", None) if dom is not None else None
    return SystemView(name, variables, tuple(eqs), sizes, observed,
                      frozenset(observed_all - set(defs_bare)), f, f"{name}.", et,
                      integrated=order)


def _flat_view(flat) -> SystemView:
    sizes = _sizes(flat.index_sets)
    lifted = dict(getattr(flat, "lifted_shapes", {}) or {})
    eqs = [(from_ast(eq.lhs), unroll_extrema(normalize_expr(from_ast(eq.rhs)), _sizes(flat.index_sets)))
           for eq in flat.equations]
    # The 1.0.0 model, re-derived from the equations themselves: states are
    # D-targets, observed are bare-LHS definitions of non-states.
    integrated = integrated_states(flat)
    states = {s for s in (lhs_state(l) for l, _ in eqs) if s is not None} | set(integrated)
    observed = {}
    for lhs, rhs in eqs:
        if isinstance(lhs, str) and lhs not in states and lhs not in observed:
            observed[lhs] = unroll_contractions(rhs, sizes)
    observed = {n: fold_geometry(d, observed) for n, d in observed.items()}
    eqs = [(lhs, fold_geometry(rhs, observed)) for lhs, rhs in eqs]
    variables = {}
    for group, default_kind in ((flat.state_variables, "algebraic"),
                                (flat.observed_variables, "observed"),
                                (flat.parameters, "parameter")):
        for vname, var in group.items():
            if default_kind == "parameter":
                kind = "parameter"
            elif vname in states:
                kind = "state"
            elif vname in observed or default_kind == "observed":
                kind = "observed"
            else:
                kind = default_kind
            shape = tuple(lifted[vname]) if vname in lifted and not var.shape else \
                _resolve_shape(var.shape, sizes, vname)
            variables[vname] = VarInfo(vname, kind, shape, tuple(var.shape or ()),
                                       var.default, getattr(var, "element_type", None))
    dom = getattr(flat, "domain", None)
    et = getattr(dom, "element_type", None) if dom is not None else None
    indexed = frozenset(n for n, v in variables.items() if v.kind == "observed" and n not in observed)
    return SystemView("Flattened", variables, tuple(eqs), sizes, observed, indexed, flat, "", et,
                      integrated=tuple(n for n in integrated if n in variables))
