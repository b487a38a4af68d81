"""A raw HTTP/2 gRPC peer (the ``h2`` library over a socket) that can really stop reading.

grpc's own client reads and buffers whatever the server sends, whatever the application does,
so it cannot show what a server does when a client stops reading. This peer advertises a small
flow-control window, sends its requests in gRPC framing and then reads nothing: the server's
writes stall exactly as they do behind a wedged client. :meth:`H2Peer.drain` later opens the
window and reads the stream to its end (messages and the trailers' grpc-status).
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import unquote

import h2.config
import h2.connection
import h2.events
import h2.settings
from google.protobuf.message import Message

__all__ = ["H2Peer", "StreamEnd"]


def grpc_frame(message: Message) -> bytes:
    """One length-prefixed gRPC message (uncompressed)."""
    body = message.SerializeToString()
    return b"\x00" + struct.pack(">I", len(body)) + body


@dataclass
class StreamEnd:
    """What the peer read once it let the server finish."""

    messages: list[bytes] = field(default_factory=list)
    status: int | None = None
    details: str = ""
    reset: bool = False


class H2Peer:
    """One HTTP/2 connection to ``127.0.0.1:port`` that opens one gRPC stream.

    Args:
        port: the server's port.
        window: the stream flow-control window it advertises (the connection window stays
            at HTTP/2's 65 535 and is never raised until :meth:`drain`).
    """

    def __init__(self, port: int, window: int = 1024) -> None:
        self._sock = socket.create_connection(("127.0.0.1", port), timeout=30.0)
        # A small receive buffer, so that the kernel does not hold much on the peer's behalf.
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self._port = port
        self._conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        self._conn.local_settings = h2.settings.Settings(
            client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window}
        )
        self._conn.initiate_connection()
        self._stream_id = 0
        self._buffer = bytearray()

    def call(self, method: str, requests: Sequence[Message], end_stream: bool) -> None:
        """Open a stream to ``/voxgate.v1.VoiceGateway/<method>`` and send ``requests``."""
        self._stream_id = self._conn.get_next_available_stream_id()
        self._conn.send_headers(
            self._stream_id,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", f"/voxgate.v1.VoiceGateway/{method}"),
                (":authority", f"127.0.0.1:{self._port}"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ],
        )
        payload = b"".join(grpc_frame(r) for r in requests)
        self._conn.send_data(self._stream_id, payload, end_stream=end_stream)
        self._sock.sendall(self._conn.data_to_send())

    def drain(self, timeout_s: float = 30.0) -> StreamEnd:
        """Open the windows wide, read until the stream ends, and return what came."""
        end = StreamEnd()
        conn = self._conn
        conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1})
        conn.increment_flow_control_window(2**30)  # the settings above open the streams'
        self._sock.sendall(conn.data_to_send())
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            data = self._sock.recv(65536)
            if not data:
                break
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.DataReceived):
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                    if event.stream_id == self._stream_id:
                        self._buffer += event.data
                elif isinstance(event, h2.events.TrailersReceived | h2.events.ResponseReceived):
                    if event.stream_id != self._stream_id:
                        continue
                    headers = dict(event.headers)
                    if "grpc-status" in headers:  # trailers (or a trailers-only response)
                        end.status = int(headers["grpc-status"])
                        end.details = unquote(headers.get("grpc-message", ""))
                elif isinstance(event, h2.events.StreamReset) and (
                    event.stream_id == self._stream_id
                ):
                    end.reset = True
                    self._split(end)
                    return end
                elif isinstance(event, h2.events.StreamEnded) and (
                    event.stream_id == self._stream_id
                ):
                    self._split(end)
                    return end
            pending = conn.data_to_send()
            if pending:
                self._sock.sendall(pending)
        raise TimeoutError(f"the stream did not end within {timeout_s} s")

    def _split(self, end: StreamEnd) -> None:
        buf = self._buffer
        while len(buf) >= 5:
            size = struct.unpack(">I", buf[1:5])[0]
            end.messages.append(bytes(buf[5 : 5 + size]))
            del buf[: 5 + size]

    def close(self) -> None:
        """Close the socket (the server then sees the connection go)."""
        self._sock.close()
