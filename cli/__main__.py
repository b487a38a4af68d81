"""``python -m voxgate.cli``: the same as the ``voxgate`` console script."""

from __future__ import annotations

import sys

from voxgate.cli._main import main

sys.exit(main())
