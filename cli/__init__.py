"""The ``voxgate`` command line, above both the server (``gateway``) and the clients.

``voxgate serve`` runs the gateway; ``call`` and ``sip`` are gateway clients; ``demo`` runs both
in one process. Keeping the entry point here lets ``gateway`` never import ``clients`` and the
client library ship without the server.
"""

from __future__ import annotations

from voxgate.cli._main import build_parser, main

__all__ = ["build_parser", "main"]
