"""The run-time layer: compiled programs (``RhsProgram``, ``JacobianProgram``),
their workspaces, second-order contraction and the fixed lane kernels."""
