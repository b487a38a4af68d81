"""``python -m voxgate.bridges.sip``: run the SIP bridge (the same as ``voxgate sip``)."""

from __future__ import annotations

import sys

from voxgate.bridges.sip.cli import main

if __name__ == "__main__":
    sys.exit(main())
