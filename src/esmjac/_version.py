"""The package version (a leaf module: the generator header and the cache
key read it without importing the whole public surface)."""

__version__ = "0.1.0"
