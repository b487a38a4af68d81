"""Clients of the voxgate gateway (Python library, CLI, SIP bridge)."""

from __future__ import annotations
