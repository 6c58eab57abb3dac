"""No module reads or writes another's private state (issue #24).

An AST scan of ``src/esmjac``: ``obj._name`` where ``obj`` is not
``self``/``cls`` is another object's private attribute unless this module
owns the name (assigns ``self._name``, defines it in a class body, or
defines a function or class of that name): a module may reach into the
instances of its own classes, not into those of other modules. The few
exceptions are listed with their reason; a new one needs a reason here
or, better, an accessor."""
from __future__ import annotations

import ast
from pathlib import Path

import esmjac

SRC = Path(esmjac.__file__).parent

#: (module relative to src/esmjac, attribute): why it may be read.
ALLOWED = {
    # namedtuple's public API (underscored so it cannot clash with a field)
    ("adapters/sundials.py", "_replace"): "namedtuple API",
    # recovering a corrupt Numba cache entry: Numba names the file only in
    # its cache objects' attributes (compile/cache.numba_cache_failure)
    ("compile/cache.py", "_cache_file"): "Numba cache internals",
    ("compile/cache.py", "_cache_path"): "Numba cache internals",
    ("compile/cache.py", "_index_path"): "Numba cache internals",
    ("compile/cache.py", "_index_name"): "Numba cache internals",
    # keying a cached kernel by the files of what it links in: Numba keeps a
    # dispatcher's cache object and an intrinsic's definition only privately
    # (compile/jitkeys.key_by_callees, _closure)
    ("compile/jitkeys.py", "_cache"): "Numba dispatcher internals",
    ("compile/jitkeys.py", "_defn"): "Numba intrinsic internals",
}


def _owned(tree: ast.AST) -> set[str]:
    own: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(n.name)
        if isinstance(n, ast.ClassDef):
            for b in n.body:
                if isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name):
                    own.add(b.target.id)
                elif isinstance(b, ast.Assign):
                    own.update(x.id for x in b.targets if isinstance(x, ast.Name))
        if (isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                and isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")):
            own.add(n.attr)
    return own


def _foreign_private(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    own = _owned(tree)
    out = []
    for n in ast.walk(tree):
        if (isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__")
                and not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"))
                and n.attr not in own):
            out.append((n.lineno, ast.unparse(n)))
    return out


def test_the_scan_finds_a_foreign_private_read(tmp_path):
    """The oracle of the scan itself: a read of another object's private
    attribute is found, reads of one's own are not."""
    f = tmp_path / "m.py"
    f.write_text("class A:\n    def __init__(self):\n        self._mine = 1\n"
                 "    def f(self, other, blk):\n        return other._mine + blk._memo + self._x\n"
                 "def g(pool):\n    return pool._max_workers\n")
    assert sorted(_foreign_private(f)) == [(5, "blk._memo"), (7, "pool._max_workers")]


def test_no_module_reads_another_modules_private_state():
    found = []
    for p in sorted(SRC.rglob("*.py")):
        rel = p.relative_to(SRC).as_posix()
        found += [f"{rel}:{line}: {expr}" for line, expr in _foreign_private(p)
                  if (rel, expr.rsplit(".", 1)[1]) not in ALLOWED]
    assert not found, "private state read across modules (add an accessor):\n" + "\n".join(found)
    assert all((SRC / m).exists() for m, _ in ALLOWED)      # the allow-list names real modules
