"""Tenants and their API keys: who sent a request, and the quotas and weight that go with it.

A key file holds one key a line, as ``sha256:<hex of the key> tenant [option=value ...]``
(``#`` starts a comment). Only hashes are stored: a key is random (``sbx_`` and 43 url-safe
characters, 256 bits), so an unsalted SHA-256 is enough, as for GitHub's or Stripe's tokens,
and a leaked file gives nobody a key. A presented key is hashed and compared with every stored
hash by ``hmac.compare_digest``, all of them, so the time taken depends neither on how much of
a key matched nor on which line matched.

Options (every line of one tenant must give the same ones): ``weight`` (its share of the slots
against other tenants with work), ``max_in_flight`` (its jobs running at once; more wait),
``max_queued`` (its jobs waiting or running; a batch beyond is refused 429), ``max_rate``
(executions admitted per second, a token bucket of one second's worth; 429 beyond),
``max_batch``, ``max_timeout_s``, ``max_memory_mb`` (as the server maxima, lower), the flag
``admin`` (may read ``/metrics``, which shows every tenant) and the flag ``revoked`` (the key
no longer opens anything; ``keys revoke`` sets it). Tenant names: 1-64 of ``A-Za-z0-9_.-``.

With no key file, auth is off and every request is the tenant ``default`` (no quotas, weight 1).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import logging
import os
import re
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

DEFAULT_TENANT = "default"
KEY_PREFIX = "sbx_"
HASH_PREFIX = "sha256:"
TENANT_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
HASH = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class Tenant:
    """A tenant's weight and quotas; 0 (or 0.0) means: no quota of that kind."""

    name: str = DEFAULT_TENANT
    weight: float = 1.0
    max_in_flight: int = 0
    max_queued: int = 0
    max_rate: float = 0.0
    max_batch: int = 0
    max_timeout_s: float = 0.0
    max_memory_mb: int = 0
    max_sessions: int = 0  # its own session store's size; 0: session_max
    admin: bool = False


DEFAULT = Tenant()

# Options a key line may carry, with their parsers; the flags take no value.
NUMBERS = {"weight": float, "max_in_flight": int, "max_queued": int, "max_rate": float,
           "max_batch": int, "max_timeout_s": float, "max_memory_mb": int,
           "max_sessions": int}  # fmt: skip
FLAGS = ("admin", "revoked")


class KeyFileError(ValueError):
    """The key file does not parse; the message names the file and the line."""


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    return HASH_PREFIX + hashlib.sha256(key.encode()).hexdigest()


def key_id(digest: str) -> str:
    """What ``keys list`` shows and ``keys revoke`` takes: the first 12 hex digits of the hash."""
    return digest.removeprefix(HASH_PREFIX)[:12]


@dataclass(frozen=True)
class KeyLine:
    """One line of the key file."""

    number: int
    digest: str
    tenant: Tenant
    revoked: bool = False

    def text(self) -> str:
        options = []
        for f in dataclasses.fields(Tenant):
            value = getattr(self.tenant, f.name)
            if f.name in NUMBERS and value != f.default:
                options.append(f"{f.name}={value:g}" if isinstance(value, float) else
                               f"{f.name}={value}")  # fmt: skip
        options += [flag for flag in FLAGS if getattr(self.tenant, flag, False)
                    or (flag == "revoked" and self.revoked)]  # fmt: skip
        return " ".join([self.digest, self.tenant.name, *options])


def _option(where: str, word: str, values: dict[str, object]) -> None:
    name, sep, value = word.partition("=")
    if not sep:
        if word not in FLAGS:
            raise KeyFileError(f"{where}: unknown flag {word!r} (flags: {', '.join(FLAGS)})")
        values[word] = True
        return
    parse = NUMBERS.get(name)
    if parse is None:
        raise KeyFileError(f"{where}: unknown option {name!r} (options: {', '.join(NUMBERS)})")
    try:
        number = parse(value)
    except ValueError:
        raise KeyFileError(f"{where}: {name}={value!r} is not a number") from None
    if number < 0 or (name == "weight" and number <= 0):
        raise KeyFileError(f"{where}: {name} must be {'positive' if name == 'weight' else '>= 0'}")
    values[name] = number


def parse_line(path: str, number: int, text: str) -> KeyLine | None:
    """One line, or None for a blank or comment line; KeyFileError names what is wrong."""
    words = text.split("#", 1)[0].split()
    if not words:
        return None
    where = f"{path}:{number}"
    if len(words) < 2:
        raise KeyFileError(f"{where}: expected 'sha256:<hex> tenant [options]'")
    digest, name = words[0], words[1]
    if not HASH.match(digest):
        raise KeyFileError(f"{where}: the first field must be sha256: and 64 hex digits")
    if not TENANT_NAME.match(name):
        raise KeyFileError(f"{where}: tenant {name!r} must be 1-64 of A-Z a-z 0-9 _ . -")
    values: dict[str, object] = {}
    for word in words[2:]:
        _option(where, word, values)
    revoked = bool(values.pop("revoked", False))
    return KeyLine(number, digest, Tenant(name=name, **values), revoked)  # type: ignore[arg-type]


def parse_keys(path: str, text: str) -> list[KeyLine]:
    """Every key line; the same hash twice, or one tenant with two sets of options, is an error."""
    lines: list[KeyLine] = []
    seen: dict[str, int] = {}
    tenants: dict[str, KeyLine] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = parse_line(path, number, raw)
        if line is None:
            continue
        if line.digest in seen:
            raise KeyFileError(f"{path}:{number}: the same key as line {seen[line.digest]}")
        seen[line.digest] = number
        first = tenants.setdefault(line.tenant.name, line)
        if not line.revoked and not first.revoked and first.tenant != line.tenant:
            raise KeyFileError(
                f"{path}:{number}: tenant {line.tenant.name!r} has other options on line "
                f"{first.number}; give every key of a tenant the same ones"
            )
        if first.revoked and not line.revoked:
            tenants[line.tenant.name] = line
        lines.append(line)
    return lines


def read_keys(path: str) -> list[KeyLine]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"{path}: cannot read the key file: {exc}") from None
    return parse_keys(path, text)


@dataclass
class KeyStore:
    """The keys in force, reloaded when the file changes; a reload that fails keeps them."""

    path: str
    lines: list[KeyLine] = field(default_factory=list)
    _stamp: tuple[int, int, int] | None = None

    @classmethod
    def load(cls, path: str) -> KeyStore:
        """At start-up: a file that does not parse raises KeyFileError (naming the line)."""
        store = cls(path)
        store.lines, store._stamp = read_keys(path), store._file_stamp()
        log.info("%d API keys of %d tenants from %s", *store.counts(), path)
        return store

    def counts(self) -> tuple[int, int]:
        live = [line for line in self.lines if not line.revoked]
        return len(live), len({line.tenant.name for line in live})

    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def reload(self, force: bool = False) -> bool:
        """Read the file again if it changed (or ``force``); False if it failed (logged)."""
        stamp = self._file_stamp()
        if not force and stamp == self._stamp:
            return True
        try:
            lines = read_keys(self.path)
        except KeyFileError as exc:
            log.error("API keys not reloaded, the %d keys in force stay: %s", self.counts()[0], exc)
            self._stamp = stamp  # tried: again once it changes again
            return False
        self.lines, self._stamp = lines, stamp
        log.info("API keys reloaded: %d keys of %d tenants", *self.counts())
        return True

    def tenant_for(self, key: str) -> Tenant | None:
        """The tenant of a key, None for an unknown or revoked one; constant time per line."""
        digest = hash_key(key).encode()
        found: KeyLine | None = None
        for line in self.lines:
            if hmac.compare_digest(digest, line.digest.encode()) and found is None:
                found = line
        return None if found is None or found.revoked else found.tenant

    def tenant(self, name: str) -> Tenant | None:
        """A tenant by name (the per-front anonymous tenant), from its live keys."""
        for line in self.lines:
            if line.tenant.name == name and not line.revoked:
                return line.tenant
        return None


# ---------------------------------------------------------------- the key file, for the CLI


def append_key(path: str, tenant: Tenant) -> tuple[str, KeyLine]:
    """A new key for ``tenant`` appended to the file (created 0600); (key, its line)."""
    lines = read_keys(path) if os.path.exists(path) else []
    key = new_key()
    line = KeyLine(len(lines) + 1, hash_key(key), tenant)
    parse_keys(path, "\n".join([*(existing.text() for existing in lines), line.text()]))
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        if f.tell() and not _ends_with_newline(path):
            f.write("\n")
        f.write(line.text() + "\n")
        f.flush()
        os.fsync(f.fileno())
    return key, line


def _ends_with_newline(path: str) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def revoke_keys(path: str, which: str) -> list[KeyLine]:
    """Mark ``revoked`` every live key whose id (or tenant name) is ``which``; the file is
    rewritten whole (a new file renamed over the old, so a reader sees one or the other)."""
    with open(path, encoding="utf-8") as f:
        raw = f.read().splitlines()
    by_number = {line.number: line for line in parse_keys(path, "\n".join(raw))}
    hit = [line for line in by_number.values() if not line.revoked
           and which in (key_id(line.digest), line.tenant.name)]  # fmt: skip
    for line in hit:
        raw[line.number - 1] = dataclasses.replace(line, revoked=True).text()
    if hit:
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("\n".join(raw) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    return hit


# ---------------------------------------------------------------- rates


class RateLimiter:
    """Per-tenant token buckets of one second's worth (``max_rate`` executions a second)."""

    def __init__(self) -> None:
        self._buckets: dict[str, tuple[float, float]] = {}  # tenant -> (tokens, at)

    def take(self, tenant: Tenant, count: int) -> float:
        """Take ``count`` tokens: 0.0 if granted, else the seconds until they would be."""
        if tenant.max_rate <= 0:
            return 0.0
        now = time.monotonic()
        burst = max(tenant.max_rate, 1.0)
        tokens, at = self._buckets.get(tenant.name, (burst, now))
        tokens = min(burst, tokens + (now - at) * tenant.max_rate)
        need = min(count, burst)  # more than a second's worth at once: wants a full bucket
        if tokens < need:
            self._buckets[tenant.name] = (tokens, now)
            return (need - tokens) / tenant.max_rate
        self._buckets[tenant.name] = (tokens - count, now)
        return 0.0

    def refund(self, tenant: Tenant, count: int) -> None:
        if tenant.max_rate > 0 and tenant.name in self._buckets:
            tokens, at = self._buckets[tenant.name]
            self._buckets[tenant.name] = (min(max(tenant.max_rate, 1.0), tokens + count), at)


def tenants_of(lines: Iterable[KeyLine]) -> dict[str, Tenant]:
    return {line.tenant.name: line.tenant for line in lines if not line.revoked}
