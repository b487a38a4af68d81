"""The voxgate server: gRPC servicer, per-call sessions, VAD segmenter and cross-call batcher."""

from __future__ import annotations
