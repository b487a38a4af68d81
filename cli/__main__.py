"""``python -m cli``: the same as the ``voxgate`` console script."""

from __future__ import annotations

import sys

from cli._main import main

sys.exit(main())
