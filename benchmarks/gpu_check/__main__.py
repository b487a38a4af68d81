"""``python -m benchmarks.gpu_check`` (from the repository root): see the package docstring."""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run as a path (``python benchmarks/gpu_check``): make the repository root importable.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.gpu_check.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
