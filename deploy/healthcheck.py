#!/usr/bin/env python3
"""grpc.health.v1 probe for containers: exit 0 iff the server answers ``SERVING``.

Needs only the standard library and ``grpcio`` (the two health messages are encoded by hand), so
it runs in any image that can talk gRPC, the gateway's and the SIP bridge's alike. Docker's
``HEALTHCHECK`` uses it; Kubernetes uses its native ``grpc:`` probes instead.

Usage::

    python healthcheck.py [--target HOST:PORT] [--service NAME] [--timeout SECONDS]
        [--tls-ca PEM [--tls-server-name NAME] [--tls-cert PEM --tls-key PEM]]

A gateway with TLS (docs/security.md) is probed with ``--tls-ca`` (and, with mutual TLS, a
client certificate); health needs no token while ``security.open_health`` is on (the default).

Exit status: 0 SERVING; 1 NOT_SERVING, UNKNOWN or SERVICE_UNKNOWN; 2 no answer (refused,
timed out, or an RPC error). One line on stdout says which, for ``docker inspect``.
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc

__all__ = ["STATUS_NAMES", "check", "decode_status", "encode_request", "main"]

_METHOD = "/grpc.health.v1.Health/Check"
#: ``HealthCheckResponse.ServingStatus`` values (grpc/health/v1/health.proto).
STATUS_NAMES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}
_SERVING = 1
_DEFAULT_TARGET = "127.0.0.1:50051"
_DEFAULT_SERVICE = "voxgate.v1.VoiceGateway"


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def encode_request(service: str) -> bytes:
    """Serialise ``HealthCheckRequest{service}`` (field 1, string; empty = whole server)."""
    raw = service.encode()
    return b"\x0a" + _varint(len(raw)) + raw if raw else b""


def decode_status(data: bytes) -> int:
    """Return ``HealthCheckResponse.status`` (field 1, enum); unknown fields are skipped."""
    pos, status = 0, 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(data, pos)
            if field == 1:
                status = value
        elif wire == 1:
            pos += 8
        elif wire == 2:
            length, pos = _read_varint(data, pos)
            pos += length
        elif wire == 5:
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
    return status


def _read(path: str | None) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


def _channel(target: str, tls: dict[str, str | None] | None) -> grpc.Channel:
    if not tls:
        return grpc.insecure_channel(target)
    creds = grpc.ssl_channel_credentials(
        root_certificates=_read(tls.get("ca")),
        private_key=_read(tls.get("key")),
        certificate_chain=_read(tls.get("cert")),
    )
    name = tls.get("server_name")
    options = [("grpc.ssl_target_name_override", name)] if name else []
    return grpc.secure_channel(target, creds, options=options)


def check(
    target: str, service: str, timeout_s: float, tls: dict[str, str | None] | None = None
) -> int:
    """Ask ``target`` for the health of ``service``; return the serving status number.

    ``tls``: None for plaintext, else PEM paths ``ca``, ``cert``, ``key`` and an optional
    ``server_name`` (the name in the server's certificate, when it does not name the target).
    """
    with _channel(target, tls) as channel:
        rpc = channel.unary_unary(
            _METHOD, request_serializer=encode_request, response_deserializer=decode_status
        )
        status: int = rpc(service, timeout=timeout_s, wait_for_ready=False)
        return status


def main(argv: list[str] | None = None) -> int:
    """Run the probe; see the module docstring for the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--target",
        default=os.environ.get("VOXGATE_HEALTH_TARGET", _DEFAULT_TARGET),
        help=f"server host:port (env VOXGATE_HEALTH_TARGET, default {_DEFAULT_TARGET})",
    )
    parser.add_argument(
        "--service",
        default=os.environ.get("VOXGATE_HEALTH_SERVICE", _DEFAULT_SERVICE),
        help=f"service name; '' = the whole server (default {_DEFAULT_SERVICE})",
    )
    parser.add_argument("--timeout", type=float, default=3.0, help="RPC deadline in seconds")
    env = os.environ.get
    parser.add_argument(
        "--tls-ca", default=env("VOXGATE_HEALTH_TLS_CA"), help="TLS: the server's CA (PEM)"
    )
    parser.add_argument(
        "--tls-server-name",
        default=env("VOXGATE_HEALTH_TLS_SERVER_NAME"),
        help="TLS: the name the server's certificate carries, if not the target's host",
    )
    parser.add_argument(
        "--tls-cert", default=env("VOXGATE_HEALTH_TLS_CERT"), help="mutual TLS: client cert"
    )
    parser.add_argument("--tls-key", default=env("VOXGATE_HEALTH_TLS_KEY"), help="its key")
    args = parser.parse_args(argv)
    tls = None
    if args.tls_ca or args.tls_cert:
        tls = {
            "ca": args.tls_ca,
            "cert": args.tls_cert,
            "key": args.tls_key,
            "server_name": args.tls_server_name,
        }
    try:
        status = check(args.target, args.service, args.timeout, tls)
    except OSError as exc:
        print(f"unhealthy: cannot read a TLS file: {exc}", flush=True)
        return 2
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        print(f"unhealthy: {args.target} did not answer ({code})", flush=True)
        return 2
    name = STATUS_NAMES.get(status, str(status))
    print(f"{args.service or '<server>'} on {args.target}: {name}", flush=True)
    return 0 if status == _SERVING else 1


if __name__ == "__main__":
    sys.exit(main())
