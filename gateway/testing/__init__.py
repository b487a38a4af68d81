"""Test harness shipped with the gateway: in-process servers, fake engines and test signals.

Fake engines here are clearly named as such; they exist for scheduler and transport tests and
are never evidence that a model feature works.
"""

from __future__ import annotations
