"""TLS to NATS (``SWARM_NATS_TLS_CA``/``_CERT``/``_KEY``) against a real nats-server that
requires TLS and verifies client certificates, with certificates made for the test."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from nats.js.errors import NoStreamResponseError

from swarm_runtime.broker import tls_context
from swarm_runtime.settings import Settings

from ..conftest import free_port
from .test_broker_credentials import _round_trip, _server


@dataclass
class Issued:
    cert: Path
    key: Path


class Authority:
    """A throwaway certificate authority that issues server and client certificates."""

    def __init__(self, out: Path, name: str) -> None:
        self.out = out
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.cert = (
            self._builder(self.name, self.key.public_key())  # self-signed
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )
        self.path = out / f"{name}.pem"
        self.path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def _builder(
        self, subject: x509.Name, public_key: ec.EllipticCurvePublicKey
    ) -> x509.CertificateBuilder:
        """A day-long certificate for ``subject``, issued by this authority."""
        now = datetime.datetime.now(datetime.UTC)
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.name)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
        )

    def issue(self, name: str, server: bool) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = self._builder(subject, key.public_key()).add_extension(
            x509.ExtendedKeyUsage([usage]), critical=False
        )
        if server:
            names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        issued = Issued(self.out / f"{name}.pem", self.out / f"{name}-key.pem")
        issued.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        issued.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return issued


@dataclass
class TlsNats:
    url: str
    ca: Authority
    client: Issued


@pytest.fixture
def tls_nats(tmp_path: Path) -> Iterator[TlsNats]:
    ca = Authority(tmp_path, "swarm-ca")
    server = ca.issue("nats-server", server=True)
    client = ca.issue("gpu-box-2", server=False)
    conf = tmp_path / "nats.conf"
    # The block docs/security.md recommends: TLS only, and clients must show a certificate
    # signed by the CA.
    conf.write_text(
        f'jetstream {{ store_dir: "{tmp_path / "js"}" }}\n'
        "tls {\n"
        f'  cert_file: "{server.cert}"\n'
        f'  key_file: "{server.key}"\n'
        f'  ca_file: "{ca.path}"\n'
        "  verify: true\n"
        "  timeout: 2\n"
        "}\n"
    )
    for url in _server(conf):
        yield TlsNats(url, ca, client)


def with_tls(url: str, ca: Path | None, client: Issued | None = None) -> Settings:
    return Settings(
        nats_url=url,
        nats_tls_ca=ca,
        nats_tls_cert=client.cert if client else None,
        nats_tls_key=client.key if client else None,
    )


async def test_a_service_connects_over_tls_with_its_client_certificate(tls_nats: TlsNats) -> None:
    await _round_trip(with_tls(tls_nats.url, tls_nats.ca.path, tls_nats.client))


async def refused(settings: Settings) -> str:
    """Why connecting as ``settings`` say fails (it must)."""
    try:
        nc = await nats.connect(
            settings.nats_url,
            tls=tls_context(settings),
            allow_reconnect=False,
            max_reconnect_attempts=0,
            connect_timeout=3,
        )
    except Exception as exc:  # TLS, NATS and OS errors alike
        return f"{type(exc).__name__}: {exc}"
    await nc.close()
    raise AssertionError("connected")


async def test_tls_without_a_client_certificate_or_the_right_ca_is_refused(
    tls_nats: TlsNats, tmp_path: Path
) -> None:
    # Without Swarm's TLS settings nats-py still upgrades (the server requires TLS), trusting
    # only the system's CAs: this server's certificate is not theirs.
    assert "CERTIFICATE_VERIFY_FAILED" in await refused(Settings(nats_url=tls_nats.url))
    # The server checks client certificates (`verify: true`): the CA alone is not enough, nor
    # is a certificate another CA signed. (The server hangs up, or says bad certificate.)
    await refused(with_tls(tls_nats.url, tls_nats.ca.path))
    other = Authority(tmp_path, "other-ca")
    await refused(with_tls(tls_nats.url, tls_nats.ca.path, other.issue("intruder", server=False)))
    # A client trusting another CA refuses this server.
    reason = await refused(with_tls(tls_nats.url, other.path, tls_nats.client))
    assert "CERTIFICATE_VERIFY_FAILED" in reason


def test_a_client_certificate_needs_its_key() -> None:
    assert tls_context(Settings()) is None
    with pytest.raises(ValueError, match="go together"):
        tls_context(Settings(nats_tls_cert=Path("client.pem")))


# docs/security.md's hub user for provider "acme" (one worker, acme-1), as it is there.
PROVIDER_PERMISSIONS = """
      permissions: {
        publish: {
          allow: ["swarm.workers.acme-1.heartbeat", "swarm.workers.acme-1.events.*.*",
                  "swarm.workers.acme-1.registry.>", "swarm.workers.acme-1.attempt",
                  "$JS.hub.API.>", "$JS.ACK.>", "$JS.FC.>"]
          deny:  ["$JS.hub.API.$KV.>", "$JS.hub.API.$OBJ.>"]
        }
        subscribe: { allow: ["_INBOX.worker.acme-1.>", "swarm.workers.acme-1.>"] }
        allow_responses: true
      }
"""


async def test_a_provider_joins_through_a_leaf_node_over_tls(tmp_path: Path) -> None:
    """docs/security.md's mesh: the provider's own nats-server is a leaf node of the hub over
    TLS, logged in as the provider's hub user, whose permissions decide what crosses; its
    clients use the hub's JetStream through the leaf."""
    ca = Authority(tmp_path, "swarm-ca")
    hub_cert = ca.issue("hub", server=True)
    leaf_cert = ca.issue("acme-leaf", server=False)
    leaf_port = free_port()
    hub_conf = tmp_path / "hub.conf"
    hub_conf.write_text(
        f'jetstream {{ store_dir: "{tmp_path / "js"}", domain: hub }}\n'
        "leafnodes {\n"
        f"  port: {leaf_port}\n"
        f'  tls {{ cert_file: "{hub_cert.cert}", key_file: "{hub_cert.key}",'
        f' ca_file: "{ca.path}", verify: true }}\n'
        "}\n"
        "authorization { users = [\n"
        "  { user: hub, password: hub-pw }\n"
        f"  {{ user: acme, password: acme-pw\n{PROVIDER_PERMISSIONS}  }}\n"
        "] }\n"
    )
    leaf_conf = tmp_path / "leaf.conf"
    leaf_conf.write_text(
        "default_js_domain: { $G: hub }\n"
        "leafnodes { remotes = [ {\n"
        f'  url: "nats-leaf://acme:acme-pw@127.0.0.1:{leaf_port}"\n'
        f'  tls {{ ca_file: "{ca.path}", cert_file: "{leaf_cert.cert}",'
        f' key_file: "{leaf_cert.key}" }}\n'
        "} ] }\n"
    )
    for hub_url in _server(hub_conf):
        for leaf_url in _server(leaf_conf):
            hub = await nats.connect(hub_url, user="hub", password="hub-pw")
            # The provider's agent talks to its local leaf, without credentials of the hub's.
            agent = await nats.connect(leaf_url, inbox_prefix="_INBOX.worker.acme-1")
            try:
                await _crossing(hub, agent)
                await _jetstream_through_the_leaf(hub, agent)
            finally:
                await agent.close()
                await hub.close()


async def _crossing(hub: nats.NATS, agent: nats.NATS) -> None:
    at_hub = await hub.subscribe("swarm.workers.>")
    at_agent = await agent.subscribe("swarm.workers.acme-1.assign")
    snooping = await agent.subscribe("swarm.workers.acme-2.assign")  # another worker's
    await hub.flush()
    await agent.flush()
    for _ in range(50):  # until the leaf connection is up and interest crossed it
        await agent.publish("swarm.workers.acme-1.heartbeat", b"hb")
        try:
            await at_hub.next_msg(timeout=0.1)
            break
        except nats.errors.TimeoutError:
            continue
    else:
        raise AssertionError("the leaf node never connected to the hub")
    # What the provider's hub user may not publish stays on its side...
    await agent.publish("swarm.workers.acme-2.heartbeat", b"hb")
    await agent.publish("swarm.workers.acme-1.heartbeat", b"last")
    crossed = [await at_hub.next_msg(timeout=5)]
    while crossed[-1].data != b"last":  # (retries of the first may still come)
        crossed.append(await at_hub.next_msg(timeout=5))
    assert {m.subject for m in crossed} == {"swarm.workers.acme-1.heartbeat"}
    # ...and only its own assignments reach it.
    await hub.publish("swarm.workers.acme-2.assign", b"not yours")
    await hub.publish("swarm.workers.acme-1.assign", b"yours")
    assert (await at_agent.next_msg(timeout=5)).data == b"yours"
    with pytest.raises(nats.errors.TimeoutError):
        await snooping.next_msg(timeout=0.5)


async def _jetstream_through_the_leaf(hub: nats.NATS, agent: nats.NATS) -> None:
    """The leaf runs no JetStream: its clients' JetStream calls go to the hub's domain, as a
    Swarm agent's do (its events, pull consumers), but no bucket write."""
    hub_js = hub.jetstream()
    await hub_js.add_stream(name="SWARM_WORKER_EVENTS", subjects=["swarm.workers.*.events.*.*"])
    jobs = await hub_js.create_key_value(bucket="swarm_jobs")
    await jobs.put("job-1", b"record")
    js = agent.jetstream()
    # Its own worker's events, acknowledged by the hub on the agent's own inbox.
    ack = await js.publish("swarm.workers.acme-1.events.job-1.started", b"{}")
    assert (ack.stream, ack.seq) == ("SWARM_WORKER_EVENTS", 1)
    forging = await agent.jetstream(timeout=1).key_value("swarm_jobs")
    refusals = (nats.errors.TimeoutError, nats.errors.NoRespondersError, NoStreamResponseError)
    with pytest.raises(refusals):  # the hub never hears of it
        await forging.put("job-1", b"forged")
    assert (await jobs.get("job-1")).value == b"record"
