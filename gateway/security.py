"""Who may call: TLS and mutual TLS credentials, bearer tokens, per-token call quotas.

Everything here sits in front of the servicer as a grpc.aio server interceptor, so that no RPC
(the gateway's, reflection's, or one nobody registered) reaches any handler without valid
credentials, and the servicer itself stays ignorant of tenants.

* **TLS** (``security.tls_cert`` / ``tls_key``) and **mutual TLS** (``security.client_ca``:
  every client must present a certificate signed by it) are the port's credentials; the files
  are checked with the standard library's TLS stack at start-up, so that a key that does not
  match its certificate is a one-line configuration error, not a failure at the first
  handshake.
* **Tokens** come from a YAML file (``security.tokens_file``) and/or an environment variable
  (``security.tokens_env``). Only their SHA-256 digests are kept; a presented token is hashed
  and compared with every digest by :func:`hmac.compare_digest`, without stopping at a match,
  so neither the comparison nor the position of the token leaks through timing. Reloaded on
  SIGHUP (:meth:`TokenStore.reload`); a file that no longer parses keeps the previous tokens.
* **Status codes**: no ``authorization`` metadata, or one that is not ``Bearer <token>``, is
  ``UNAUTHENTICATED``; a well-formed but unknown token is ``PERMISSION_DENIED``. Health is open
  by default (probes carry no token).
* **Quotas**: ``Converse``, ``StreamingRecognize`` and ``Synthesize`` count against the token's
  ``max_calls`` (calls at once, on this replica). One more is refused with
  ``RESOURCE_EXHAUSTED``, a ``QuotaFailure`` naming ``security.max_calls`` and a ``RetryInfo``
  hint; the slot is released when the RPC ends, however it ends (the wrapper's ``finally``
  runs on completion, on error and when grpc cancels the handler because the client left).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import inspect
import logging
import os
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import grpc
import yaml
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from voxgate.gateway.config import ConfigError, SecurityConfig
from voxgate.gateway.metrics import GatewayMetrics

__all__ = [
    "METERED_METHODS",
    "MIN_TOKEN_CHARS",
    "AuthInterceptor",
    "GatewaySecurity",
    "TokenEntry",
    "TokenStore",
    "parse_tokens",
    "server_credentials",
]

log = logging.getLogger("voxgate.security")

#: Shorter tokens are refused at load: a guessable token is no authentication.
MIN_TOKEN_CHARS = 16
#: The gateway's RPCs that hold resources for their lifetime and so count against quotas.
METERED_METHODS = ("Converse", "StreamingRecognize", "Synthesize")
#: The retry hint sent with a quota refusal, s: a call slot frees when a call ends, so soon.
QUOTA_RETRY_S = 1
#: How long a refused request stream is given to deliver its first message, s (see _refusal).
REFUSAL_FIRST_MESSAGE_S = 1.0
_HEALTH_PREFIX = "/grpc.health.v1.Health/"
_STATUS_DETAILS_KEY = "grpc-status-details-bin"
_TOKEN_FIELDS = frozenset({"token", "tenant", "max_calls"})


# -- tokens -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TokenEntry:
    """One accepted token, by digest only.

    Attributes:
        tenant: who holds it (logs and metrics name tenants, never tokens).
        max_calls: metered calls it may have open at once; 0 = no limit.
        digest: SHA-256 of the token (the token itself is not kept).
    """

    tenant: str
    max_calls: int
    digest: bytes = field(repr=False)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def _yaml_error(exc: yaml.YAMLError) -> str:
    """Where the YAML broke, without PyYAML's snippet (which would quote the secret line)."""
    mark = getattr(exc, "problem_mark", None)
    if mark is None:
        return "not valid YAML"
    return f"not valid YAML (line {mark.line + 1}, column {mark.column + 1})"


def parse_tokens(text: str, source: str, default_max_calls: int = 0) -> tuple[TokenEntry, ...]:
    """Parse a token list: a YAML list of strings or ``{token, tenant, max_calls}`` mappings.

    ``tokens: [...]`` at the top and a plain comma-separated string (handy in an environment
    variable) are accepted too. An entry without a tenant is named ``token-N`` by position.

    Raises:
        ConfigError: naming ``source`` and the entry by position; a token's value is never
            quoted (a typo'd mapping could have the token as a key, so keys are not quoted
            either).
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: {_yaml_error(exc)}") from None
    if isinstance(data, dict) and set(data) == {"tokens"}:
        data = data["tokens"]
    if data is None:
        items: list[Any] = []
    elif isinstance(data, str):
        items = [t for t in data.replace(",", " ").split() if t]
    elif isinstance(data, list):
        items = data
    else:
        raise ConfigError(
            f"{source}: expected a list of tokens (strings or {{token, tenant, max_calls}})"
        )
    entries: list[TokenEntry] = []
    seen: dict[bytes, int] = {}
    for n, item in enumerate(items, 1):
        where = f"{source}: entry {n}"
        if isinstance(item, dict):
            if not set(item) <= _TOKEN_FIELDS or "token" not in item:
                raise ConfigError(
                    f"{where}: a mapping needs 'token' and may have only 'tenant' and 'max_calls'"
                )
            token, tenant, max_calls = item["token"], item.get("tenant"), item.get("max_calls")
        else:
            token, tenant, max_calls = item, None, None
        if not isinstance(token, str):
            raise ConfigError(f"{where}: the token must be a string (quote it)")
        if len(token) < MIN_TOKEN_CHARS:
            raise ConfigError(f"{where}: the token is shorter than {MIN_TOKEN_CHARS} characters")
        if not token.isascii() or not token.isprintable() or " " in token:
            raise ConfigError(f"{where}: the token must be printable ASCII without spaces")
        if tenant is None:
            tenant = f"token-{n}"
        if not isinstance(tenant, str) or not tenant or len(tenant) > 64:
            raise ConfigError(f"{where}: tenant must be a name of 1 to 64 characters")
        if max_calls is None:
            max_calls = default_max_calls
        if not isinstance(max_calls, int) or isinstance(max_calls, bool) or max_calls < 0:
            raise ConfigError(f"{where}: max_calls must be a whole number >= 0 (0 = no limit)")
        digest = _digest(token)
        if digest in seen:
            raise ConfigError(f"{where}: the same token as entry {seen[digest]}")
        seen[digest] = n
        entries.append(TokenEntry(tenant=tenant, max_calls=max_calls, digest=digest))
    return tuple(entries)


class TokenStore:
    """The accepted tokens, from ``security.tokens_file`` and ``security.tokens_env``.

    Authentication is on when a tokens file is configured or the environment variable is set
    (even to nothing: an operator who set it meant to turn authentication on, and an empty
    list then refuses everyone rather than letting everyone in).

    Args:
        config: the security section.
        environ: where ``tokens_env`` is looked up (tests pass their own).
    """

    def __init__(self, config: SecurityConfig, environ: Mapping[str, str] | None = None) -> None:
        self.config = config
        self._environ = environ if environ is not None else os.environ
        self._entries: tuple[TokenEntry, ...] = ()

    @property
    def enabled(self) -> bool:
        """Whether RPCs need a token."""
        return self.config.tokens_file is not None or self.config.tokens_env in self._environ

    @property
    def entries(self) -> tuple[TokenEntry, ...]:
        """The current tokens (digests, tenants and quotas)."""
        return self._entries

    def _read(self) -> tuple[TokenEntry, ...]:
        cfg = self.config
        out: list[TokenEntry] = []
        if cfg.tokens_file is not None:
            out += parse_tokens(
                _read_text(cfg.tokens_file, "security.tokens_file"),
                f"security.tokens_file {cfg.tokens_file}",
                cfg.max_calls_per_token,
            )
        if cfg.tokens_env in self._environ:
            out += parse_tokens(
                self._environ[cfg.tokens_env],
                f"environment variable {cfg.tokens_env}",
                cfg.max_calls_per_token,
            )
        digests = [e.digest for e in out]
        if len(set(digests)) != len(digests):
            raise ConfigError(
                f"security: the same token is in both security.tokens_file and {cfg.tokens_env}"
            )
        return tuple(out)

    def load(self) -> None:
        """Read the tokens at start-up.

        Raises:
            ConfigError: a source is unreadable or malformed, or authentication is on with no
                token at all (surely a mistake at start-up; a reload may empty the list).
        """
        entries = self._read()
        if self.enabled and not entries:
            source = (
                f"security.tokens_file {self.config.tokens_file}"
                if self.config.tokens_file is not None
                else f"environment variable {self.config.tokens_env}"
            )
            raise ConfigError(f"{source}: authentication is on but there is no token")
        self._entries = entries
        if self.enabled:
            log.info("authentication on: %s", _describe(entries))

    def reload(self) -> bool:
        """Re-read the tokens (SIGHUP); on any error keep the current ones and log why.

        Returns:
            Whether the new list is in force. Calls already running keep running whatever
            happened to their token; only new RPCs see the change.
        """
        try:
            entries = self._read()
        except ConfigError as exc:
            log.error("token reload failed, keeping %d token(s): %s", len(self._entries), exc)
            return False
        self._entries = entries
        if not entries and self.enabled:
            log.warning("token reload: no token left; every RPC is refused until one is added")
        log.info("tokens reloaded: %s", _describe(entries))
        return True

    def lookup(self, token: str) -> TokenEntry | None:
        """The entry for a presented token, or None; constant time in where it matches."""
        digest = _digest(token)
        found: TokenEntry | None = None
        for entry in self._entries:
            if hmac.compare_digest(entry.digest, digest):
                found = entry
        return found


def _describe(entries: Sequence[TokenEntry]) -> str:
    tenants = sorted({e.tenant for e in entries})
    shown = ", ".join(tenants[:10]) + (
        f", ... ({len(tenants)} tenants)" if len(tenants) > 10 else ""
    )
    return f"{len(entries)} token(s), tenants: {shown or 'none'}"


def _read_text(path: Path, name: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{name}: {path} is not UTF-8 text") from None


# -- TLS ----------------------------------------------------------------------------------------


def _read_bytes(path: Path, name: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read {path}: {exc.strerror or exc}") from None


def _encrypted_key() -> NoReturn:
    raise ConfigError("security.tls_key: the private key is encrypted; gRPC needs it unencrypted")


def server_credentials(config: SecurityConfig) -> grpc.ServerCredentials | None:
    """The port's TLS credentials, or None for plaintext.

    The files are loaded into a standard-library TLS context first: grpc accepts any bytes
    here and fails only at the first handshake, with nothing in the log that names the file.

    Raises:
        ConfigError: a file is unreadable, not PEM, or the key does not match the certificate.
    """
    if config.tls_cert is None or config.tls_key is None:
        return None
    cert = _read_bytes(config.tls_cert, "security.tls_cert")
    key = _read_bytes(config.tls_key, "security.tls_key")
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    if b"-----BEGIN CERTIFICATE-----" not in cert:
        raise ConfigError(f"security.tls_cert: {config.tls_cert} holds no PEM certificate")
    if b"PRIVATE KEY-----" not in key:
        raise ConfigError(f"security.tls_key: {config.tls_key} holds no PEM private key")
    try:
        probe.load_cert_chain(config.tls_cert, config.tls_key, password=_encrypted_key)
    except ssl.SSLError as exc:
        raise ConfigError(
            f"security.tls_key: {config.tls_key} does not load with {config.tls_cert} "
            f"({exc.reason or 'not a matching PEM key and certificate'})"
        ) from None
    root: bytes | None = None
    if config.client_ca is not None:
        root = _read_bytes(config.client_ca, "security.client_ca")
        try:
            probe.load_verify_locations(cadata=root.decode("ascii", "replace"))
        except (ssl.SSLError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or "no PEM certificate in it"
            raise ConfigError(
                f"security.client_ca: {config.client_ca} is not a usable CA bundle ({reason})"
            ) from None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=root, require_client_auth=root is not None
    )


# -- the interceptor --------------------------------------------------------------------------


Behavior = Callable[..., Any]


def _same_kind(handler: grpc.RpcMethodHandler, behavior: Behavior) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s kind and serializers with another behavior."""
    req, resp = handler.request_deserializer, handler.response_serializer
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(behavior, req, resp)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(behavior, req, resp)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(behavior, req, resp)
    return grpc.unary_unary_rpc_method_handler(behavior, req, resp)


def _behavior_of(handler: grpc.RpcMethodHandler) -> Behavior:
    for name in ("stream_stream", "stream_unary", "unary_stream", "unary_unary"):
        fn = getattr(handler, name, None)
        if fn is not None:
            return fn  # type: ignore[no-any-return]
    raise TypeError("a method handler without a behavior")


def _refusal(code: grpc.StatusCode, message: str, trailers: tuple[Any, ...] = ()) -> Behavior:
    """A behavior that ends the RPC with ``code``, after the first message of a request stream.

    Why it waits for that message: a Python asyncio client whose write is still in flight when
    the status arrives reports its own INTERNAL ("Internal error from Core") in place of the
    server's code (grpc/grpc#36066, open in grpcio 1.85). Every call opens with its config and
    most clients read only after writing it, so once the server has that first message the
    client's write is done and the refusal reaches it as the code it is. The wait is bounded
    by :data:`REFUSAL_FIRST_MESSAGE_S`; nothing read is looked at.
    """

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
        if hasattr(request, "__anext__"):  # a request stream: let the client's first write land
            with contextlib.suppress(Exception):
                await asyncio.wait_for(anext(request), REFUSAL_FIRST_MESSAGE_S)
        await context.abort(code, message, trailing_metadata=trailers)

    return refuse


def _auth_header(metadata: Sequence[tuple[str, Any]] | None) -> list[Any]:
    return [value for key, value in metadata or () if key == "authorization"]


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Checks the bearer token of every RPC and meters the calls each token has open.

    Args:
        store: the accepted tokens (read at every RPC, so a reload applies to the next one).
        config: the security section (``open_health``).
        service_name: full name of the gateway service, for the metered methods.
        metrics: refusals and per-tenant open calls are counted here.
    """

    def __init__(
        self,
        store: TokenStore,
        config: SecurityConfig,
        service_name: str,
        metrics: GatewayMetrics,
    ) -> None:
        self.store = store
        self.config = config
        self.metrics = metrics
        self._metered = frozenset(f"/{service_name}/{m}" for m in METERED_METHODS)
        self._open: dict[bytes, int] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        """Pass the RPC on, refuse it, or wrap it in its token's quota."""
        method: str = details.method or ""
        handler = await continuation(details)
        if self.config.open_health and method.startswith(_HEALTH_PREFIX):
            return handler
        entry, refusal = self._authenticate(details.invocation_metadata)
        if entry is None:
            assert refusal is not None
            if handler is None:  # unknown method: refused the same, so nothing is revealed
                return grpc.unary_unary_rpc_method_handler(refusal)
            return _same_kind(handler, refusal)
        if handler is None or method not in self._metered:
            return handler
        return _same_kind(handler, self._metered_behavior(_behavior_of(handler), entry, method))

    def _authenticate(
        self, metadata: Sequence[tuple[str, Any]] | None
    ) -> tuple[TokenEntry | None, Behavior | None]:
        values = _auth_header(metadata)
        if not values:
            return None, self._refuse(
                "unauthenticated",
                grpc.StatusCode.UNAUTHENTICATED,
                "this server needs a token: send 'authorization: Bearer <token>' metadata",
            )
        scheme, _, token = (values[0] if isinstance(values[0], str) else "").partition(" ")
        token = token.strip()
        if len(values) > 1 or scheme.lower() != "bearer" or not token:
            return None, self._refuse(
                "unauthenticated",
                grpc.StatusCode.UNAUTHENTICATED,
                "the authorization metadata must be exactly one 'Bearer <token>'",
            )
        entry = self.store.lookup(token)
        if entry is None:
            return None, self._refuse(
                "permission_denied",
                grpc.StatusCode.PERMISSION_DENIED,
                "the token is not valid for this server",
            )
        return entry, None

    def _refuse(self, reason: str, code: grpc.StatusCode, message: str) -> Behavior:
        self.metrics.auth_refused.labels(reason).inc()
        log.debug("refused an RPC: %s", reason)
        return _refusal(code, message)

    def _quota_refusal(self, entry: TokenEntry, method: str) -> Behavior:
        self.metrics.auth_refused.labels("token_quota").inc()
        message = (
            f"tenant {entry.tenant!r} has {entry.max_calls} call(s) open, its limit "
            f"(max_calls); retry when one ends"
        )
        log.info("tenant %s at max_calls=%d: %s refused", entry.tenant, entry.max_calls, method)
        quota, retry = any_pb2.Any(), any_pb2.Any()
        quota.Pack(
            error_details_pb2.QuotaFailure(
                violations=[
                    error_details_pb2.QuotaFailure.Violation(
                        subject="security.max_calls", description=message
                    )
                ]
            )
        )
        retry.Pack(
            error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=QUOTA_RETRY_S))
        )
        status = status_pb2.Status(
            code=code_pb2.RESOURCE_EXHAUSTED, message=message, details=[quota, retry]
        )
        trailers = ((_STATUS_DETAILS_KEY, status.SerializeToString()),)
        return _refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, message, trailers)

    def _acquire(self, entry: TokenEntry) -> bool:
        held = self._open.get(entry.digest, 0)
        if entry.max_calls and held >= entry.max_calls:
            return False
        self._open[entry.digest] = held + 1
        self.metrics.tenant_calls_active.labels(entry.tenant).inc()
        return True

    def _release(self, entry: TokenEntry) -> None:
        held = self._open.get(entry.digest, 0) - 1
        if held > 0:
            self._open[entry.digest] = held
        else:
            self._open.pop(entry.digest, None)
        self.metrics.tenant_calls_active.labels(entry.tenant).dec()

    def _metered_behavior(self, behavior: Behavior, entry: TokenEntry, method: str) -> Behavior:
        """``behavior`` inside ``entry``'s quota: a slot taken at the start, freed at the end.

        The slot is taken when the RPC starts running, not in :meth:`intercept_service`, so an
        RPC that never runs (the client left first) never holds one.
        """
        if inspect.isasyncgenfunction(behavior):

            async def metered_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
                if not self._acquire(entry):
                    await self._quota_refusal(entry, method)(request, context)
                try:
                    async for item in behavior(request, context):
                        yield item
                finally:
                    self._release(entry)

            return metered_stream

        async def metered(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if not self._acquire(entry):
                await self._quota_refusal(entry, method)(request, context)
            try:
                return await behavior(request, context)
            finally:
                self._release(entry)

        return metered


# -- the whole layer ----------------------------------------------------------------------------


class GatewaySecurity:
    """What the server installs: port credentials, the interceptor, and reload on SIGHUP.

    Built before any model is loaded, so that a bad certificate or token file costs no
    warm-up.

    Raises:
        ConfigError: from :func:`server_credentials` or :meth:`TokenStore.load`.
    """

    def __init__(
        self,
        config: SecurityConfig,
        service_name: str,
        metrics: GatewayMetrics,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config
        self.credentials = server_credentials(config)
        self.tokens = TokenStore(config, environ)
        self.tokens.load()
        self.interceptor = AuthInterceptor(self.tokens, config, service_name, metrics)
        if self.credentials is not None:
            log.info("TLS on%s", " with client certificates (mTLS)" if config.client_ca else "")

    def interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        """The server interceptors to install (none while authentication is off)."""
        return [self.interceptor] if self.tokens.enabled else []

    def reload(self) -> bool:
        """Re-read the tokens (the SIGHUP handler); see :meth:`TokenStore.reload`."""
        if not self.tokens.enabled:
            log.info("SIGHUP: authentication is off; nothing to reload")
            return False
        return self.tokens.reload()
