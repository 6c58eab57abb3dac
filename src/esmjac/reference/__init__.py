"""The reference side: slow, obviously right assembly (``assemble``) and the
finite-difference ``check``. Used by tests and ``esmjac check``, never by the
compiled path."""
