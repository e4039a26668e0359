"""Who is asking: the API key of every request, checked before any route runs, and its tenant.

An ASGI middleware, installed only when auth is on (``api_keys_file``): with auth off nothing
here runs and every request is the tenant ``default``. Every path but ``/healthz`` and
``/readyz`` needs a key (``/docs``, ``/openapi.json`` and unknown paths too, so that nothing is
learnt without one), sent as ``Authorization: Bearer KEY``, or as the password (or the user,
when there is no password) of HTTP Basic credentials, which is what clients that take only a
URL send for ``http://tenant:KEY@host/...`` (``requests`` and ``aiohttp`` do; docs/tenants.md).

Refusals are JSON in the API's error shape (``{"detail": "..."}``): 401 for a key that is
missing, malformed, unknown or revoked, all with the same words, so that nothing tells which
part was wrong; 403 for a valid key that may not read ``/metrics`` (it shows every tenant:
``admin`` keys only); 429 instead of 401 for a source address that failed
``auth_max_failures`` times in ``auth_failure_window_s`` (counted in
``sandbox_auth_failures_total``). A valid key always passes, whatever its address failed
before: one misconfigured client behind a NAT or on a shared trainer host must not lock out
every tenant there, and a key is checked before the address's count is (a hash lookup).
A compatibility front may let requests without a key run as a named tenant, from any source or
only from given networks (``sandboxfusion_tenant``/``_networks``, ``codejudge_...``), for
trainers that cannot send a header.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import math
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from fastapi import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from sandbox_service.metrics import Metrics
from sandbox_service.settings import Settings
from sandbox_service.tenants import DEFAULT, KeyFileError, KeyStore, Tenant

PUBLIC = frozenset({"/healthz", "/readyz"})
UNAUTHORIZED = "missing or invalid API key"
CHALLENGE = (b"www-authenticate", b'Bearer realm="sandbox-service"')
MAX_SOURCES = 10_000  # failure counters kept, the oldest dropped beyond


def tenant_of(request: Request) -> Tenant:
    """The tenant a request was authenticated as (``default`` with auth off)."""
    return getattr(request.state, "tenant", DEFAULT)


def presented_key(value: bytes) -> str | None:
    """The key in an Authorization header value, None if it holds none we can read."""
    scheme, _, credentials = value.decode("latin-1").strip().partition(" ")
    credentials = credentials.strip()
    if not credentials:
        return None
    if scheme.lower() == "bearer":
        return credentials
    if scheme.lower() == "basic":
        try:
            user, _, password = base64.b64decode(credentials, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return password or user or None
    return None


@dataclass(frozen=True)
class Anonymous:
    """Requests to ``paths`` without a key run as ``tenant`` if they come from ``networks``."""

    paths: frozenset[str]
    tenant: str
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]

    def allows(self, source: str) -> bool:
        if not self.networks:
            return True
        try:
            address = ipaddress.ip_address(source)
        except ValueError:
            return False
        return any(address in network for network in self.networks)


def anonymous_fronts(
    settings: Settings, store: KeyStore, fronts: dict[str, frozenset[str]]
) -> list[Anonymous]:
    """The per-front anonymous tenants of ``settings``; one the key file lacks is an error."""
    found = []
    for front, paths in fronts.items():
        name = getattr(settings, f"{front}_tenant")
        if not name:
            continue
        if store.tenant(name) is None:
            raise KeyFileError(
                f"{front}_tenant {name!r} has no live key in {store.path}: add one for it "
                "(its line gives the tenant's quotas)"
            )
        networks = tuple(
            ipaddress.ip_network(n, strict=False) for n in getattr(settings, f"{front}_networks")
        )
        found.append(Anonymous(paths, name, networks))
    return found


class Failures:
    """Failed attempts per source address in a fixed window; a source over the limit waits."""

    def __init__(self, limit: int, window_s: float) -> None:
        self.limit, self.window_s = limit, window_s
        self._seen: OrderedDict[str, tuple[float, int]] = OrderedDict()

    def blocked_for(self, source: str, now: float) -> float:
        start, count = self._seen.get(source, (now, 0))
        if now - start >= self.window_s:
            self._seen.pop(source, None)
            return 0.0
        return self.window_s - (now - start) if count >= self.limit else 0.0

    def add(self, source: str, now: float) -> None:
        start, count = self._seen.get(source, (now, 0))
        if now - start >= self.window_s:
            start, count = now, 0
        self._seen[source] = (start, count + 1)
        self._seen.move_to_end(source)
        while len(self._seen) > MAX_SOURCES:
            self._seen.popitem(last=False)


async def _refuse(
    send: Send, status: int, detail: str, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *headers]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


class Authenticate:
    """The middleware: sets ``request.state.tenant`` or answers 401/403/429 itself."""

    def __init__(
        self,
        app: ASGIApp,
        store: KeyStore,
        settings: Settings,
        metrics: Metrics,
        anonymous: Sequence[Anonymous] = (),
    ) -> None:
        self.app = app
        self.store = store
        self.metrics = metrics
        self.anonymous = list(anonymous)
        self.failures = Failures(settings.auth_max_failures, settings.auth_failure_window_s)

    def _anonymous(self, path: str, source: str) -> Tenant | None:
        for front in self.anonymous:
            if path in front.paths and front.allows(source):
                return self.store.tenant(front.tenant)
        return None

    def _identify(self, scope: Scope, source: str) -> tuple[Tenant | None, str]:
        """(the tenant, or None and the failure's reason for the metric)."""
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        if header is None:
            tenant = self._anonymous(scope["path"], source)
            return tenant, "" if tenant is not None else "missing"
        key = presented_key(header)
        if key is None:
            return None, "malformed"
        tenant = self.store.tenant_for(key)
        return tenant, "" if tenant is not None else "invalid"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC:
            await self.app(scope, receive, send)
            return
        source = scope["client"][0] if scope.get("client") else ""
        now = time.monotonic()
        tenant, reason = self._identify(scope, source)
        wait = self.failures.blocked_for(source, now) if tenant is None else 0.0
        if wait:
            self.metrics.auth_failures.labels("rate_limited").inc()
            retry = (b"retry-after", str(math.ceil(wait)).encode())
            await _refuse(send, 429, "too many failed authentications from this address; "
                          f"retry after {math.ceil(wait)} s", [retry])  # fmt: skip
            return
        if tenant is None:
            self.failures.add(source, now)
            self.metrics.auth_failures.labels(reason).inc()
            await _refuse(send, 401, UNAUTHORIZED, [CHALLENGE])
            return
        if scope["path"] == "/metrics" and not tenant.admin:
            await _refuse(send, 403, "this key may not read /metrics (it needs the admin flag)")
            return
        scope.setdefault("state", {})["tenant"] = tenant
        await self.app(scope, receive, send)
