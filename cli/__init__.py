"""The ``voxgate`` command line, above the server (``voxgate.gateway``), the doors and the clients.

``voxgate serve`` runs the gateway; ``call``, ``sip`` and ``media-streams`` are gateway clients;
``demo`` runs both in one process. Keeping the entry point here lets the gateway never import
the client library or the doors, and the client library ship without the server.
"""

from __future__ import annotations

from voxgate.cli._main import build_parser, main

__all__ = ["build_parser", "main"]
