"""The store as a worker without store keys sees it: every operation granted by the registry.

``SWARM_STORE_ACCESS=signed`` (the default of ``swarm-trainer join`` without S3 keys): the
agent and its Ray processes hold no store credentials. Each operation asks the registry
(``swarm.workers.<id>.registry.store.access``, on its own worker subject) with the attempt's
token; the registry checks that this worker holds the attempt, the token, the job record
and the key's scope and answers with a presigned URL for that one object and method (or, for
list and head, the answer), and the bytes then go straight between this machine and the
store over plain HTTP (docs/providers.md, *Store access*).

Ray's worker processes and Ray Train's controller get a ``SignedStore`` by unpickling it (the
loop config, the run's storage filesystem): it holds only how to reach NATS and the attempt's
grant, and each process opens its own NATS connection on first use, kept on a thread of its
own for the life of the process (one connection per process, not one per request: a
checkpoint is a dozen operations, and a TLS handshake over the internet costs more than the
request). This module stays free of torch: Ray Train's controller imports it.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import hashlib
import logging
import os
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import nats
import nats.errors
from nats.aio.client import Client
from pydantic import BaseModel, ConfigDict, SecretStr
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from swarm_contracts.layout import validate_key
from swarm_contracts.registry_api import STORE_ACCESS
from swarm_contracts.store_access import StoreAccess, StoreGrant, StoreOp
from swarm_contracts.subjects import Subjects
from swarm_contracts.workers import Assignment
from swarm_runtime.rpc import Refused, ServiceClient, Unavailable
from swarm_runtime.settings import Settings
from swarm_runtime.store import NotFound, ObjectStore
from swarm_trainer.store_fs import StoreFileSystem

# The settings a process needs to reach the registry as this agent's NATS user; nothing else
# of the agent's settings travels to its Ray processes.
NATS_FIELDS = (
    "nats_url",
    "nats_user",
    "nats_password",
    "nats_token",
    "nats_nkey_seed_file",
    "nats_creds_file",
    "nats_tls_ca",
    "nats_tls_cert",
    "nats_tls_key",
    "provider_creds_file",
    "namespace",
)
REQUEST_TIMEOUT_S = 10.0
# The registry restarting, or NATS reconnecting: ask again for this long before failing.
UNAVAILABLE_RETRY_S = 30.0
# How long an object-store call waits for a store that refuses connections.
STORE_OUTAGE_S = 40.0
# A read grant is asked for again this long before it expires.
GRANT_MARGIN = timedelta(minutes=2)
_CHUNK = 1024 * 1024
log = logging.getLogger(__name__)


class _PastTheEnd(Exception):
    """A range read that starts past the object's end (HTTP 416)."""


class StoreAccessRefused(PermissionError):
    """The registry refused the operation: outside the job's scope, or not this worker's (or
    no longer its current) attempt."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code

    def __reduce__(self) -> tuple[Any, ...]:
        # Raised in Ray workers and read by the agent: it must survive pickling.
        return type(self), (self.message, self.code), self.__dict__


class SignedAccess(BaseModel):
    """What a process needs to ask for grants for one attempt of one job."""

    model_config = ConfigDict(frozen=True)

    nats: Settings
    job_id: str
    attempt: int
    attempt_token: SecretStr
    # The worker the attempt is assigned to: it asks on its own subject, which its NATS user
    # alone may use, and the registry grants only to the worker holding the attempt.
    worker_id: str

    @classmethod
    def of(cls, settings: Settings, job: Assignment) -> SignedAccess:
        if not job.attempt_token:
            raise ValueError(f"job {job.job_id}: an assignment without an attempt token")
        return cls.of_attempt(settings, job.job_id, job.attempt, job.attempt_token, job.worker_id)

    @classmethod
    def of_attempt(
        cls, settings: Settings, job_id: str, attempt: int, token: str, worker_id: str
    ) -> SignedAccess:
        """``job_id``: a job's, or a training session's token (its lease's attempt)."""
        nats_settings = Settings(**{name: getattr(settings, name) for name in NATS_FIELDS})
        return cls(
            nats=nats_settings,
            job_id=job_id,
            attempt=attempt,
            attempt_token=SecretStr(token),
            worker_id=worker_id,
        )

    def request(self, op: StoreOp, key: str) -> StoreAccess:
        return StoreAccess(
            job_id=self.job_id,
            attempt=self.attempt,
            attempt_token=self.attempt_token.get_secret_value(),
            op=op,
            key=key,
        )


async def _quiet(exc: Exception) -> None:
    log.debug("store signer connection: %s", exc)


class _Signer:
    """This process's NATS connection to the registry, on an event loop thread of its own, so
    that any thread (Ray's, pyarrow's copy threads, ``asyncio.to_thread``) can ask."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.loop = asyncio.new_event_loop()
        thread = threading.Thread(target=self.loop.run_forever, name="swarm-signer", daemon=True)
        thread.start()
        self._nc: Client | None = None

    async def _connection(self) -> Client:
        # Only the loop's thread runs this: no lock needed around the check.
        if self._nc is None or self._nc.is_closed:
            from swarm_runtime.broker import connect_options

            # Bounded: with unlimited reconnects nats-py's first connect waits for ever.
            self._nc = await asyncio.wait_for(
                nats.connect(
                    self.settings.nats_url,
                    name="swarm-trainer-store",
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=1,
                    # A request that finds NATS down fails on its own (Unavailable, retried);
                    # the reconnect loop's every failure need not be logged as an error too.
                    error_cb=_quiet,
                    **connect_options(self.settings, "trainer"),
                ),
                REQUEST_TIMEOUT_S,
            )
        return self._nc

    async def _ask(self, request: StoreAccess, worker_id: str) -> StoreGrant:
        try:
            nc = await self._connection()
        except (OSError, TimeoutError, nats.errors.Error) as exc:
            # Like a registry that does not answer: asked again until UNAVAILABLE_RETRY_S.
            raise Unavailable("registry", f"NATS unreachable: {exc!r}") from exc
        subjects = Subjects(self.settings.namespace)
        registry = ServiceClient(
            nc,
            "registry",
            lambda action: subjects.worker_registry(action, worker_id),
            timeout=REQUEST_TIMEOUT_S,
        )
        return await registry.call(STORE_ACCESS, request)

    def ask(self, request: StoreAccess, worker_id: str) -> StoreGrant:
        future = asyncio.run_coroutine_threadsafe(self._ask(request, worker_id), self.loop)
        try:
            return future.result(timeout=REQUEST_TIMEOUT_S * 3)
        except TimeoutError as exc:
            future.cancel()
            raise Unavailable("registry", "no answer from the store signer") from exc


_signers: dict[tuple[int, str], _Signer] = {}
_http: dict[int, httpx.Client] = {}
_lock = threading.Lock()


def _signer(settings: Settings) -> _Signer:
    key = (os.getpid(), settings.model_dump_json())
    with _lock:
        if key not in _signers:
            _signers[key] = _Signer(settings)
        return _signers[key]


def _client() -> httpx.Client:
    with _lock:
        pid = os.getpid()
        if pid not in _http:
            _http[pid] = httpx.Client(timeout=httpx.Timeout(60.0, connect=10.0))
        return _http[pid]


class SignedStore(ObjectStore):
    """An ``ObjectStore`` holding no keys: one attempt's grant, asked of the registry."""

    def __init__(self, access: SignedAccess) -> None:
        self.access = access
        self.url = f"signed:{access.job_id}/{access.attempt}"
        # GET grants by key, asked for once and used until shortly before they expire: a
        # streamed dataset is read range by range, and each grant is a trip to the registry.
        self._reads: dict[str, StoreGrant] = {}

    def grant(self, op: StoreOp, key: str) -> StoreGrant:
        request = self.access.request(op, key)
        try:
            for attempt in Retrying(
                stop=stop_after_delay(UNAVAILABLE_RETRY_S),
                wait=wait_exponential(multiplier=0.5, max=5),
                retry=retry_if_exception_type(Unavailable),
                reraise=True,
            ):
                with attempt:
                    return _signer(self.access.nats).ask(request, self.access.worker_id)
        except Refused as exc:
            raise StoreAccessRefused(
                f"store access refused ({op} {key}): {exc.message}", exc.code
            ) from exc
        raise AssertionError("unreachable: tenacity reraises the last error")

    def _read_grant(self, key: str) -> StoreGrant:
        grant = self._reads.get(key)
        now = datetime.now(UTC)
        if grant is None or grant.expires_at is None or grant.expires_at - GRANT_MARGIN < now:
            grant = self._reads[key] = self.grant("get", key)
        return grant

    @contextlib.contextmanager
    def _stream(
        self, op: StoreOp, key: str, grant: StoreGrant | None = None, **kwargs: Any
    ) -> Iterator[httpx.Response]:
        grant = grant or self.grant(op, key)
        if grant.url is None or grant.method is None:
            raise StoreAccessRefused(f"the registry granted {op} {key} without a URL", "internal")
        request = _client().build_request(grant.method, grant.url, **kwargs)
        # A store that refuses connections (restarting, a network blip) is waited out as the
        # keyed store does (swarm_runtime.store_outage.OUTAGE_RETRIES): nothing was sent yet, so
        # even a file body can go again.
        for attempt in Retrying(
            stop=stop_after_delay(STORE_OUTAGE_S),
            wait=wait_exponential(multiplier=0.5, max=4),
            retry=retry_if_exception_type((httpx.ConnectError, httpx.ConnectTimeout)),
            reraise=True,
        ):
            with attempt:
                response = _client().send(request, stream=True)
        try:
            if response.status_code == 404:
                raise NotFound(key)
            if response.status_code == 416:
                raise _PastTheEnd(key)
            if response.status_code >= 300:
                response.read()
                raise OSError(
                    f"store {grant.method} {key}: HTTP {response.status_code}: "
                    f"{response.text[:300]}"
                )
            yield response
        finally:
            response.close()

    def _send(self, op: StoreOp, key: str, **kwargs: Any) -> None:
        with self._stream(op, key, **kwargs):
            pass

    # --- ObjectStore ---------------------------------------------------------------------

    def put_file(self, key: str, path: Path) -> None:
        validate_key(key)
        size = Path(path).stat().st_size
        with open(path, "rb") as f:
            # An explicit length: presigned S3 PUTs take no chunked transfer encoding.
            self._send("put", key, content=f, headers={"Content-Length": str(size)})

    def put_bytes(self, key: str, data: bytes) -> None:
        validate_key(key)
        self._send("put", key, content=data)

    def get_file(self, key: str, path: Path) -> None:
        validate_key(key)
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".tmp-{uuid.uuid4().hex}"
        try:
            with self._stream("get", key) as response, open(tmp, "xb") as f:
                for chunk in response.iter_bytes(_CHUNK):
                    f.write(chunk)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)

    def get_bytes(self, key: str) -> bytes:
        validate_key(key)
        with self._stream("get", key) as response:
            return response.read()

    def get_range(self, key: str, start: int, length: int) -> bytes:
        validate_key(key)
        if start < 0 or length < 0:
            raise ValueError(f"a byte range starts and runs at 0 or more, got {start}+{length}")
        if length == 0:
            self.size(key)
            return b""
        headers = {"Range": f"bytes={start}-{start + length - 1}"}
        try:
            with self._stream("get", key, self._read_grant(key), headers=headers) as response:
                data = response.read()
                whole = response.status_code == 200  # a server that ignored the range
        except _PastTheEnd:
            return b""
        return data[start : start + length] if whole else data

    def stat_size(self, key: str) -> int | None:
        objects = self.grant("head", validate_key(key)).objects
        return objects[0].size if objects else None

    def list_sized(self, prefix: str) -> builtins.list[tuple[str, int]]:
        grant = self.grant("list", validate_key(prefix, prefix=True))
        return sorted((o.key, o.size) for o in grant.objects)

    def list(self, prefix: str) -> list[str]:
        return [key for key, _ in self.list_sized(prefix)]

    def delete(self, key: str) -> None:
        validate_key(key)
        # S3 semantics: deleting a missing key is not an error.
        with contextlib.suppress(NotFound):
            self._send("delete", key)

    def sha256(self, key: str) -> str:
        validate_key(key)
        h = hashlib.sha256()
        with self._stream("get", key) as response:
            for chunk in response.iter_bytes(_CHUNK):
                h.update(chunk)
        return h.hexdigest()

    def ray_storage(self, key_prefix: str) -> tuple[str, Any]:
        import pyarrow.fs

        fs = pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(StoreFileSystem(self)))
        return validate_key(key_prefix, prefix=True).rstrip("/"), fs
