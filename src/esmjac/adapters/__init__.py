"""Built-in solver adapters: ``scipy``, ``sundials`` and ``native``.

Each submodule is an esmjac plugin (see :mod:`esmjac.hookspecs`), registered
only through the ``esmjac.adapters`` entry-point group, exactly like a
third-party adapter. Use them through :func:`esmjac.plugins.create`, e.g.
``create("scipy.ivp", "model.esm")``; list them with ``esmjac adapters``.

This package deliberately imports nothing: solver packages (scipy.integrate,
scikits.odes) are imported lazily, inside the factories, when first used.
"""
