"""``open_store``'s URLs (file and S3) and the S3 store's presigned URLs."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from swarm_runtime.settings import Settings
from swarm_runtime.store import LocalStore, S3Store, open_store

from ..conftest import S3Server


def test_open_store_file_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "a dir with spaces" / "störe"
    store = open_store(Settings(store_url=root.as_uri()))  # as_uri() percent-escapes
    assert isinstance(store, LocalStore)
    assert store.root == root.resolve()
    again = open_store(url=store.url)
    assert isinstance(again, LocalStore)
    assert again.root == store.root

    monkeypatch.chdir(tmp_path)
    rel = open_store(url="file://.swarm/store")
    assert isinstance(rel, LocalStore)
    assert rel.root == (tmp_path / ".swarm" / "store").resolve()


def test_open_store_s3_urls(s3_server: S3Server) -> None:
    settings = Settings(s3_access_key=s3_server.access_key, s3_secret_key=s3_server.secret_key)
    hostport = s3_server.endpoint.removeprefix("http://")
    store = open_store(settings, url=f"s3://swarm-url-test?endpoint={hostport}&secure=0")
    assert isinstance(store, S3Store)
    assert store.endpoint == s3_server.endpoint
    assert not store.secure
    store.put_bytes("k", b"v")
    again = open_store(settings, url=store.url)  # an S3Store's url opens the same store
    assert isinstance(again, S3Store)
    assert again.get_bytes("k") == b"v"
    open_store(settings, url=store.url)  # the bucket exists already: fine


@pytest.mark.parametrize("url", ["ftp://x/y", "s3://?endpoint=http://127.0.0.1:1", "gs://b"])
def test_open_store_rejects_bad_urls(url: str) -> None:
    with pytest.raises(ValueError, match=r"SWARM_STORE_URL|S3 endpoint"):
        open_store(Settings(), url=url)


def test_presigned_urls_name_the_public_endpoint(s3_server: S3Server) -> None:
    """Workers outside the cluster's network reach the store under another host: the URLs
    the registry hands them are signed for it (SigV4 signs the host), without a request."""
    store = open_store(
        Settings(
            store_url=f"s3://swarm-public?endpoint={s3_server.endpoint}",
            s3_access_key=s3_server.access_key,
            s3_secret_key=s3_server.secret_key,
            s3_public_endpoint="https://store.example.org:9443",
        )
    )
    assert isinstance(store, S3Store)
    url = store.presigned_url("GET", "datasets/t/x.jsonl", timedelta(minutes=15))
    assert url.startswith("https://store.example.org:9443/swarm-public/datasets/t/x.jsonl?")
    assert "X-Amz-Signature=" in url
    assert "X-Amz-Expires=900" in url
    plain = open_store(
        Settings(
            store_url=f"s3://swarm-public?endpoint={s3_server.endpoint}",
            s3_access_key=s3_server.access_key,
            s3_secret_key=s3_server.secret_key,
        )
    )
    assert isinstance(plain, S3Store)
    assert plain.presigned_url("PUT", "a/b", timedelta(seconds=60)).startswith(
        f"{s3_server.endpoint}/swarm-public/a/b?"
    )
