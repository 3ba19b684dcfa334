"""The package version, importable without importing the package's façade."""

__version__ = "0.1.0"
