"""The package's version, stated here only: setup.py reads it for the distribution's metadata."""

__version__ = "0.2.0"
