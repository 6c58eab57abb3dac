"""The model layer: interned expressions, the earthsci-ast boundary, numeric
evaluation of expressions, and the deep-recursion helper. Everything above
(calculus, compile, runtime) reads models through this package."""
