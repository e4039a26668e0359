"""The key file and the key store: parsing (errors name the line), hashes only, constant-time
comparison, reloads that keep the old keys when the new file is broken, rate buckets."""

from __future__ import annotations

import hmac
import logging
import os
from pathlib import Path

import pytest

from sandbox_service.tenants import (
    KeyFileError,
    KeyStore,
    RateLimiter,
    Tenant,
    append_key,
    hash_key,
    key_id,
    parse_keys,
    revoke_keys,
)


def test_a_line_gives_the_tenant_its_options() -> None:
    digest = hash_key("k1")
    [line] = parse_keys("f", f"# comment\n\n{digest} team-a weight=2.5 max_queued=10 admin  # x\n")
    assert line.tenant == Tenant("team-a", weight=2.5, max_queued=10, admin=True)
    assert line.number == 3 and not line.revoked
    assert parse_keys("f", line.text())[0].tenant == line.tenant  # written back the same


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("sha256:abc team", "keys:2: the first field must be sha256: and 64 hex digits"),
        (f"{hash_key('x')}", "keys:2: expected 'sha256:<hex> tenant [options]'"),
        (f"{hash_key('x')} bad/name", "keys:2: tenant 'bad/name' must be"),
        (f"{hash_key('x')} t weight=0", "keys:2: weight must be positive"),
        (f"{hash_key('x')} t max_queued=lots", "keys:2: max_queued='lots' is not a number"),
        (f"{hash_key('x')} t colour=red", "keys:2: unknown option 'colour'"),
        (f"{hash_key('x')} t sudo", "keys:2: unknown flag 'sudo'"),
        (f"{hash_key('k')} t", "keys:2: the same key as line 1"),
        (f"{hash_key('y')} t weight=3", "keys:2: tenant 't' has other options on line 1"),
    ],
)
def test_a_bad_line_is_named(text: str, words: str) -> None:
    with pytest.raises(KeyFileError, match=words.replace("[", r"\[").replace("]", r"\]")):
        parse_keys("keys", f"{hash_key('k')} t\n{text}\n")


def test_keys_are_stored_as_hashes_and_compared_with_every_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "keys")
    key_a, line_a = append_key(path, Tenant("a"))
    key_b, _ = append_key(path, Tenant("b", max_in_flight=2))
    text = Path(path).read_text()
    assert key_a not in text and key_b not in text and hash_key(key_a) in text
    assert os.stat(path).st_mode & 0o777 == 0o600
    store = KeyStore.load(path)
    compared: list[bytes] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        compared.append(b)
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)  # the module tenants uses
    assert store.tenant_for(key_a) == Tenant("a")  # the first line matches...
    assert len(compared) == 2  # ...and the second is compared all the same
    compared.clear()
    assert store.tenant_for(key_a[:-1] + "x") is None and len(compared) == 2
    revoke_keys(path, key_id(line_a.digest))
    store.reload()
    b = store.tenant_for(key_b)
    assert store.tenant_for(key_a) is None and b is not None and b.max_in_flight == 2


def test_a_reload_that_fails_keeps_the_keys_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = str(tmp_path / "keys")
    key, _ = append_key(path, Tenant("a"))
    store = KeyStore.load(path)
    with open(path, "a") as f:
        f.write("not a key line\n")
    with caplog.at_level(logging.ERROR):
        assert store.reload() is False
    assert store.tenant_for(key) == Tenant("a")
    assert "API keys not reloaded" in caplog.text and f"{path}:2" in caplog.text
    with pytest.raises(KeyFileError, match=f"{path}:2"):
        KeyStore.load(path)  # at start-up the same file is an error


def test_rate_buckets_hold_a_second_of_work() -> None:
    rates = RateLimiter()
    tenant = Tenant("r", max_rate=10)
    assert rates.take(tenant, 10) == 0.0
    wait = rates.take(tenant, 5)
    assert 0.4 < wait <= 0.5
    rates.refund(tenant, 10)
    assert rates.take(tenant, 5) == 0.0
    assert rates.take(Tenant("free"), 10**6) == 0.0
