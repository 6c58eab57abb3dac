"""Bundled models (``tropo12.esm``) and builders of gridded test and demo
models."""
