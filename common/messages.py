"""Contract messages filled from plain objects by the contract's own field names.

The server's outbound session events, the client library's typed events and both sides' VAD
settings carry their values under the names ``protos/voxgate/v1/voxgate.proto`` gives them
(``speak_id``, ``played_ms``, ``words``, ...). :func:`fill` copies them field by field from the
message's descriptor, so the event-to-message mapping is written once here rather than as a
hand-kept list per event in the servicer (``gateway/wire.py``) and again in the client
(``voxgate_client._events``); a field added to the contract is carried as soon as the event
has an attribute of that name (and a missing one fails loudly, not silently).

The message is passed in, so this package imports no protobuf: the server fills its
``voxgate.v1`` messages (protobuf 7) and the client its own ``_proto`` ones (protobuf 5.29-7),
generated from the same ``.proto``.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable
from typing import Any, Protocol, TypeVar

__all__ = ["ContractMessage", "fill"]


class ContractMessage(Protocol):
    """What :func:`fill` uses of a generated protobuf message."""

    DESCRIPTOR: Any

    def SetInParent(self) -> None:  # noqa: N802  (protobuf's name)
        """Mark the message present in its parent even when every field keeps its default."""


_M = TypeVar("_M", bound=ContractMessage)


@functools.cache
def _fields(descriptor: Hashable) -> tuple[tuple[str, bool], ...]:
    """``(name, holds messages)`` per field of a message type, in declaration order."""
    fields: Any = descriptor.fields  # type: ignore[attr-defined]
    return tuple((f.name, f.message_type is not None) for f in fields)


def fill(message: _M, source: object, **values: Any) -> _M:
    """Set every field of ``message`` from ``source``'s attribute of the same name.

    ``values`` take precedence over attributes (a field whose value the source holds in
    another form, e.g. an error's status code). A value of None leaves its field unset (an
    ``optional`` field absent); a tuple or list fills a repeated field, its items filled in
    turn when they are messages; a message value (it has a ``DESCRIPTOR``) is copied as it
    is. ``message`` is marked present in its parent, so a oneof case is chosen even when every
    field keeps its default.

    Raises:
        AttributeError: ``source`` has no attribute for a field of the message (and no
            entry in ``values``): the contract has a field this object does not carry.
    """
    message.SetInParent()
    for name, holds_messages in _fields(message.DESCRIPTOR):
        value = values[name] if name in values else getattr(source, name)
        if value is None:
            continue
        if isinstance(value, tuple | list):
            container: Any = getattr(message, name)
            if holds_messages:
                for item in value:
                    fill(container.add(), item)
            else:
                container.extend(value)
        elif holds_messages:
            target: Any = getattr(message, name)
            if hasattr(value, "DESCRIPTOR"):
                target.CopyFrom(value)
            else:
                fill(target, value)
        else:
            setattr(message, name, value)
    return message
