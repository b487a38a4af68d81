"""Import bitsandbytes without its model-hub kernel lookup.

bitsandbytes is imported directly by ``--qlora`` and also by peft, which imports it whenever it
is installed (the ``qlora`` extra). On import, bitsandbytes' CPU backend asks the ``kernels``
package for an optional kernel from the model hub (a network request) and warns when it does not
get one. voxgate adapt never downloads at run time, and the built-in kernel is the one measured,
so every import that may load bitsandbytes runs inside :func:`no_hub_kernels`.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

__all__ = ["no_hub_kernels"]


@contextlib.contextmanager
def no_hub_kernels() -> Iterator[None]:
    """Within the block ``kernels`` cannot be imported, so bitsandbytes takes its fallback.

    Only the first import of bitsandbytes in a process runs the lookup; later blocks cost
    nothing. The backend's "failed to load" warning is silenced: nothing failed that was wanted.
    """
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    hidden = sys.modules.get("kernels")
    sys.modules["kernels"] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if hidden is None:
            del sys.modules["kernels"]
        else:
            sys.modules["kernels"] = hidden
