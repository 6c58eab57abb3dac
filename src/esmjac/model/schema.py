"""earthsci-ast's JSON-schema pass, run once per document content.

earthsci-ast checks every document it loads against its JSON schema with
``jsonschema`` (pure Python): about 20 s of CPU for a 272-species
mechanism, most of loading it. Whether an instance passes is a function of
the instance, the schema and the validator's version alone, so a caller
that keeps a record of the instances that passed may skip the pass for one
it recorded: inside ``with remembering(seen, record):`` an instance whose
digest (:func:`instance_digest`) ``seen`` confirms is not validated again,
and one that passes is handed to ``record``. esmjac keeps that record in
its signed cache (``compile.cache.schema_passed`` /
``record_schema_pass``): only digests this user's esmjac stored and
signed count, so a forged record cannot make an invalid document load.

How: ``earthsci_ast.parse`` looks up ``jsonschema.Draft202012Validator``
at each load. Its module global ``jsonschema`` is replaced, once, by a
proxy of the real module whose validator class consults the record active
in the calling thread; outside a ``remembering`` block (another thread,
a direct earthsci-ast call) everything is forwarded unchanged. Where
earthsci-ast's parse module does not read the schema that way (another
version), nothing is replaced and every load validates.

Faster, where ``jsonschema-rs`` is installed (a dependency; Rust): inside
the block an instance it finds valid against the same schema (Draft
2020-12, formats not asserted, as jsonschema's validator here, offline) is
recorded without jsonschema's pass: 0.06 s instead of 22 s for the
272-species mechanism, 0.1 s instead of ~30 s for it lifted to cells. Any
other answer (invalid, an exception, the package absent) runs jsonschema's
pass as before, so the errors a user sees are earthsci-ast's own and only
a document both implementations of the standard accept can skip it.
:data:`FAST` switches it off.
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import threading
import types
from typing import Any, Callable, Iterator

__all__ = ["remembering", "instance_digest"]

#: The record in force: per thread and context (run_deep runs its worker in
#: the caller's context, so a document loaded on the deep stack sees it).
_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("esmjac_schema_memo", default=None)
_INSTALLED: list = []
_LOCK = threading.Lock()
#: Whether an instance ``jsonschema-rs`` finds valid skips jsonschema's pass.
FAST = True
_FAST_VALIDATORS: dict = {}


def _fast_valid(schema: Any) -> Callable[[Any], bool] | None:
    """``jsonschema-rs``'s Draft 2020-12 ``is_valid`` for ``schema`` (built
    once per schema content), or None where it is unavailable or refuses
    the schema."""
    try:
        key = hashlib.sha256(json.dumps(schema, sort_keys=True).encode()).hexdigest()
    except (TypeError, ValueError, RecursionError):
        return None
    if key in _FAST_VALIDATORS:
        return _FAST_VALIDATORS[key]
    fn = None
    try:
        import jsonschema_rs
        v = jsonschema_rs.Draft202012Validator(schema, validate_formats=False, offline=True)
        fn = v.is_valid
    except Exception:               # noqa: BLE001 - not installed, another API, a schema it refuses
        fn = None
    _FAST_VALIDATORS[key] = fn
    return fn


def instance_digest(schema: Any, instance: Any) -> str | None:
    """SHA-256 of (validator version, schema, instance) as canonical JSON;
    None when the instance is not plain JSON (then it is always validated)."""
    import jsonschema

    try:
        parts = [json.dumps(x, sort_keys=True, separators=(",", ":"), allow_nan=True)
                 for x in (schema, instance)]
    except (TypeError, ValueError, RecursionError):
        return None
    h = hashlib.sha256(f"jsonschema {getattr(jsonschema, '__version__', '?')}\0".encode())
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


def _validator_class(real: type) -> type:
    class Remembering:
        """``real`` (jsonschema's Draft 2020-12 validator) whose
        ``iter_errors`` skips an instance the active record vouches for."""

        def __init__(self, schema, *a, **k):
            self._schema = schema
            self._real = real(schema, *a, **k)

        def iter_errors(self, instance, *a, **k) -> Iterator:
            memo = _ACTIVE.get()
            if memo is None or a or k:
                return self._real.iter_errors(instance, *a, **k)
            seen, record = memo
            digest = instance_digest(self._schema, instance)
            if digest is not None and seen(digest):
                return iter(())
            if digest is not None and FAST:
                fast = _fast_valid(self._schema)
                try:
                    ok = fast is not None and fast(instance) is True
                except Exception:   # noqa: BLE001 - the fast validator's failure: jsonschema decides
                    ok = False
                if ok:
                    record(digest)
                    return iter(())
            errors = list(self._real.iter_errors(instance))
            if digest is not None and not errors:
                record(digest)
            return iter(errors)

        def __getattr__(self, name: str):
            return getattr(self._real, name)

    Remembering.__name__ = Remembering.__qualname__ = f"Remembering{real.__name__}"
    return Remembering


def _install() -> bool:
    """Put the proxy in ``earthsci_ast.parse`` (once); False where that
    module does not validate through ``jsonschema.Draft202012Validator``."""
    if _INSTALLED:
        return _INSTALLED[0]
    with _LOCK:
        if not _INSTALLED:
            ok = False
            try:
                import earthsci_ast.parse as eap
                import jsonschema
                mod = getattr(eap, "jsonschema", None)
                real = getattr(jsonschema, "Draft202012Validator", None)
                if mod is jsonschema and isinstance(real, type):
                    proxy = types.ModuleType("jsonschema")
                    proxy.__dict__.update(jsonschema.__dict__)
                    proxy.__dict__["Draft202012Validator"] = _validator_class(real)
                    eap.jsonschema = proxy
                    ok = True
                elif getattr(getattr(mod, "Draft202012Validator", None), "__name__", "").startswith("Remembering"):
                    ok = True
            except ImportError:          # pragma: no cover - earthsci-ast is a dependency
                ok = False
            _INSTALLED.append(ok)
    return _INSTALLED[0]


@contextlib.contextmanager
def remembering(seen: Callable[[str], bool], record: Callable[[str], None]):
    """Within the block, in this thread, earthsci-ast skips the schema
    pass for an instance ``seen(digest)`` confirms and calls
    ``record(digest)`` for one that passes (see the module docstring)."""
    _install()
    token = _ACTIVE.set((seen, record))
    try:
        yield
    finally:
        _ACTIVE.reset(token)
