"""The compiler: evaluation documents → SSA → Numba source (cached by hash)."""
from .cache import cache_dir, content_hash, kernel_key, load_source
from .codegen import GENERATOR, Generated, generate

__all__ = ["generate", "Generated", "GENERATOR", "cache_dir", "content_hash", "kernel_key", "load_source"]
