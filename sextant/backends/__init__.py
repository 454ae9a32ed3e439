"""Framework backends, found by name and imported only inside the worker that runs them."""

from sextant.backends.base import Backend, Capabilities, available, get_backend, require

__all__ = ["Backend", "Capabilities", "available", "get_backend", "require"]
