"""make_broker's credentials against real nats-servers that demand them: an nkey user, and
operator (JWT) mode with a `.creds` file, both with JetStream."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import nkeys
import pytest

from swarm_runtime.broker import make_broker
from swarm_runtime.settings import Settings

from ..conftest import free_port, nats_server_binary, wait_for_port


def _keypair(prefix: int) -> nkeys.KeyPair:
    return nkeys.from_seed(nkeys.encode_seed(os.urandom(32), prefix))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _jwt(issuer: nkeys.KeyPair, subject: str, nats: dict) -> str:
    """A NATS JWT (v2) as `nsc` would write it: ed25519-nkey signed by the issuer."""
    claims = {
        "iat": int(time.time()),
        "iss": issuer.public_key.decode(),
        "name": subject[:8],
        "sub": subject,
        "nats": nats | {"version": 2},
    }
    body = json.dumps(claims, separators=(",", ":")).encode()
    claims["jti"] = base64.b32encode(hashlib.sha256(body).digest()).decode().rstrip("=")
    signing_input = (
        _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
        + "."
        + _b64(json.dumps(claims, separators=(",", ":")).encode())
    )
    return signing_input + "." + _b64(issuer.sign(signing_input.encode()))


def _server(conf: Path) -> Iterator[str]:
    port = free_port()
    binary = nats_server_binary()
    log = conf.with_suffix(".log")
    proc = subprocess.Popen(
        [binary, "-c", str(conf), "-a", "127.0.0.1", "-p", str(port), "-l", str(log)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        try:
            wait_for_port(port)
        except TimeoutError as exc:
            raise AssertionError(f"nats-server did not start: {log.read_text()}") from exc
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def nkey_user(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    user = _keypair(nkeys.PREFIX_BYTE_USER)
    seed = tmp_path / "user.nk"
    seed.write_bytes(user.seed)
    conf = tmp_path / "nats.conf"
    conf.write_text(
        f'jetstream {{ store_dir: "{tmp_path / "js"}" }}\n'
        f'authorization {{ users = [ {{ nkey: "{user.public_key.decode()}" }} ] }}\n'
    )
    for url in _server(conf):
        yield url, seed


@pytest.fixture
def creds_user(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    operator = _keypair(nkeys.PREFIX_BYTE_OPERATOR)
    account = _keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    user = _keypair(nkeys.PREFIX_BYTE_USER)
    unlimited = {k: -1 for k in ("subs", "data", "payload", "imports", "exports", "conn", "leaf")}
    jetstream = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}
    account_jwt = _jwt(
        operator,
        account.public_key.decode(),
        {"type": "account", "limits": unlimited | jetstream | {"wildcards": True}},
    )
    user_jwt = _jwt(
        account,
        user.public_key.decode(),
        {"type": "user", "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1},
    )
    operator_jwt = _jwt(operator, operator.public_key.decode(), {"type": "operator"})
    # JetStream in operator mode needs a system account.
    system = _keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    system_jwt = _jwt(operator, system.public_key.decode(), {"type": "account", "limits": {}})
    creds = tmp_path / "swarm.creds"
    creds.write_text(
        f"-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{user.seed.decode()}\n------END USER NKEY SEED------\n"
    )
    conf = tmp_path / "nats.conf"
    conf.write_text(
        f'jetstream {{ store_dir: "{tmp_path / "js"}" }}\n'
        f'operator: "{operator_jwt}"\n'
        f"system_account: {system.public_key.decode()}\n"
        "resolver: MEMORY\n"
        f'resolver_preload: {{ {account.public_key.decode()}: "{account_jwt}",'
        f' {system.public_key.decode()}: "{system_jwt}" }}\n'
    )
    for url in _server(conf):
        yield url, creds


async def _round_trip(settings: Settings) -> None:
    """Connect as the settings say, then use JetStream (what every service needs first)."""
    broker = make_broker(settings, "test")
    await broker.connect()
    try:
        js = broker.connection.jetstream()
        await js.add_stream(name="CREDS_CHECK", subjects=["creds.check"])
        ack = await js.publish("creds.check", b"hello")
        assert ack.seq == 1
    finally:
        await broker.stop()


async def test_nkey_seed_file_connects(nkey_user: tuple[str, Path]) -> None:
    url, seed = nkey_user
    await _round_trip(Settings(nats_url=url, nats_nkey_seed_file=seed))


async def test_creds_file_connects_in_operator_mode(creds_user: tuple[str, Path]) -> None:
    url, creds = creds_user
    await _round_trip(Settings(nats_url=url, nats_creds_file=creds))


async def test_no_credentials_are_refused(nkey_user: tuple[str, Path]) -> None:
    url, _ = nkey_user
    # Without credentials the server refuses; with them (above) it accepts: the test would
    # not tell anything if the server let everyone in.
    with pytest.raises(Exception, match=r"(?i)authorization"):
        await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0)
