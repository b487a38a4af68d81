"""``python -m clients.sip``: run the SIP bridge (the same as ``voxgate sip``)."""

from __future__ import annotations

import sys

from clients.sip.cli import main

if __name__ == "__main__":
    sys.exit(main())
