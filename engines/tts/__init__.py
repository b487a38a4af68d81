"""Streaming VITS speech synthesis (a Piper voice split into front end and windowed decoder)."""

from __future__ import annotations
