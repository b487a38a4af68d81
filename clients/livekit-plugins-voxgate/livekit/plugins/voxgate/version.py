"""The plugin's version (LiveKit's Plugin registry reports it)."""

__version__ = "0.1.0"
