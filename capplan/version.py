"""The package version, in a module of its own so that any layer can import it (the package
``__init__`` is the public facade at the top and re-exports it)."""

__version__ = "0.1.0"
