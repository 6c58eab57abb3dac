"""Fixed-size scratch on the native stack, for generated kernels.

``stack_empty(n, dtype)`` (``n`` a literal) is an uninitialised 1-D array
of ``n`` elements of ``dtype`` living in the calling compiled function's
stack frame: no heap allocation, nothing to free, and — because LLVM knows
a stack slot is distinct from every argument — loops that read the
caller's arrays and write the scratch need no run-time alias checks to
vectorize. Used by the tiled right-hand side chunks (compile/codegen.py).
Only for small ``n`` (a tile's outputs: a few KiB).
"""
from __future__ import annotations

import numba as nb
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["stack_empty"]


@intrinsic
def _stack_ptr(typingctx, n, dtype):
    """A pointer to ``n`` (literal) stack slots of ``dtype``."""
    if not isinstance(n, types.IntegerLiteral):
        return None
    if isinstance(dtype, types.DType):
        dt = dtype.dtype
    elif isinstance(dtype, types.NumberClass):
        dt = dtype.instance_type
    else:
        return None
    size = int(n.literal_value)

    def codegen(context, builder, signature, args):
        # alloca_once puts the slot in the entry block: one per frame, also
        # when the call sits inside a loop.
        return cgutils.alloca_once(builder, context.get_value_type(dt),
                                   size=context.get_constant(types.intp, size))
    return types.CPointer(dt)(n, dtype), codegen


@nb.njit(inline="always", cache=True)
def stack_empty(n, dtype):
    """An uninitialised array of ``n`` (literal) ``dtype`` values on the stack."""
    return nb.carray(_stack_ptr(n, dtype), (n,))
