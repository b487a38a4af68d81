"""Import bitsandbytes without its model-hub kernel lookup.

bitsandbytes is imported directly by ``--qlora`` and also by peft, which imports it whenever it
is installed (the ``qlora`` extra). On import, bitsandbytes' CPU backend asks the ``kernels``
package for an optional kernel from the model hub (a network request) and warns when it does not
get one. voxgate adapt never downloads at run time, and the built-in kernel is the one measured,
so bitsandbytes is imported first, here, with ``kernels`` unimportable for that one import; peft
then finds it already imported.

Only that import: transformers caches whether ``kernels`` is available the first time it asks,
and an answer given while it was hidden would stay wrong for the rest of the process (measured:
a later ``from_pretrained`` in the same process failed with "Kernels are not available").
"""

from __future__ import annotations

import logging
import sys
from types import ModuleType

__all__ = ["import_bitsandbytes"]


def import_bitsandbytes() -> ModuleType | None:
    """bitsandbytes, imported without the hub lookup; None when it is not installed.

    Call it before anything imports peft. Once bitsandbytes is imported this returns it at once.
    The backend's "failed to load" warning is silenced: nothing that was wanted failed.
    """
    loaded = sys.modules.get("bitsandbytes")
    if loaded is not None:
        return loaded
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    hidden = sys.modules.get("kernels")
    sys.modules["kernels"] = None  # type: ignore[assignment]
    try:
        import bitsandbytes
    except ImportError:
        return None
    finally:
        if hidden is None:
            del sys.modules["kernels"]
        else:
            sys.modules["kernels"] = hidden
    return bitsandbytes
