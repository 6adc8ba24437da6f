"""harnessrl.store against a real S3 endpoint: moto's server on a free loopback port."""

import hashlib
import os
from pathlib import Path

import pytest

from harnessrl.store import (
    MIN_PART_SIZE,
    ChecksumMismatch,
    ObjectStore,
    S3Uri,
    StoreConfig,
    StoreError,
    sha256_file,
)

BUCKET = "harnessrl-test"


@pytest.fixture
def store(s3_env):
    s = ObjectStore.from_env(part_size=MIN_PART_SIZE)
    s.ensure_bucket(BUCKET)
    return s


def random_file(path: Path, size: int, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        os.urandom(size)
        if seed < 0
        else hashlib.sha256(str(seed).encode()).digest() * (size // 32) + b"x" * (size % 32)
    )
    return path


def test_uri_parsing():
    assert S3Uri.parse("s3://b/a/c.bin") == S3Uri("b", "a/c.bin")
    assert S3Uri.parse("minio://b/x") == S3Uri("b", "x")
    assert str(S3Uri("b", "k").child("f")) == "s3://b/k/f"
    with pytest.raises(ValueError, match="expected s3://bucket/key"):
        S3Uri.parse("/local/path")


def test_config_errors_and_secret_hiding(tmp_path):
    with pytest.raises(StoreError, match="HARNESSRL_S3_ENDPOINT"):
        StoreConfig.from_env({})
    cfg_file = tmp_path / "store.toml"
    cfg_file.write_text('endpoint = "http://minio:9000"\naccess_key = "ak"\nsecret_key = "very-secret"\n')
    cfg = StoreConfig.from_env({"HARNESSRL_STORE_CONFIG": str(cfg_file)})
    assert (cfg.endpoint, cfg.access_key, cfg.secret_key) == ("http://minio:9000", "ak", "very-secret")
    assert "very-secret" not in repr(cfg)
    with pytest.raises(ValueError, match="5 MiB"):
        ObjectStore(cfg, part_size=1024)


def test_multipart_upload_records_sha256_and_roundtrips(store, tmp_path):
    src = random_file(tmp_path / "ckpt.bin", 2 * MIN_PART_SIZE + 12345, seed=1)
    up = store.upload_file(src, f"s3://{BUCKET}/ckpt/model.bin")
    size, sha, etag = store.stat(f"s3://{BUCKET}/ckpt/model.bin")
    assert size == src.stat().st_size and sha == sha256_file(src) == up.sha256
    assert etag.endswith("-3"), f"expected a 3-part multipart ETag, got {etag}"
    down = store.download_file(f"s3://{BUCKET}/ckpt/model.bin", tmp_path / "out" / "model.bin")
    assert down.path.read_bytes() == src.read_bytes()
    assert down.bytes_transferred == size and down.resumed_from == 0
    again = store.download_file(f"s3://{BUCKET}/ckpt/model.bin", tmp_path / "out" / "model.bin")
    assert again.skipped and again.bytes_transferred == 0


def test_download_resumes_from_partial_file(store, tmp_path):
    src = random_file(tmp_path / "big.bin", MIN_PART_SIZE + 777, seed=2)
    uri = f"s3://{BUCKET}/resume/big.bin"
    store.upload_file(src, uri)
    dest = tmp_path / "dl" / "big.bin"
    # what an interrupted download leaves behind: the first bytes and the ETag they belong to
    dest.parent.mkdir(parents=True)
    kept = 3 * 1024 * 1024 + 5
    (tmp_path / "dl" / "big.bin.part").write_bytes(src.read_bytes()[:kept])
    (tmp_path / "dl" / "big.bin.part.etag").write_text(store.stat(uri)[2])
    result = store.download_file(uri, dest)
    assert result.resumed_from == kept
    assert result.bytes_transferred == src.stat().st_size - kept
    assert dest.read_bytes() == src.read_bytes()
    assert not (tmp_path / "dl" / "big.bin.part").exists()


def test_corrupt_partial_is_detected_and_refetched(store, tmp_path):
    src = random_file(tmp_path / "c.bin", 100_000, seed=3)
    uri = f"s3://{BUCKET}/resume/c.bin"
    store.upload_file(src, uri)
    dest = tmp_path / "dl" / "c.bin"
    dest.parent.mkdir(parents=True)
    (tmp_path / "dl" / "c.bin.part").write_bytes(b"\0" * 5000)  # wrong bytes
    (tmp_path / "dl" / "c.bin.part.etag").write_text(store.stat(uri)[2])
    result = store.download_file(uri, dest)
    assert dest.read_bytes() == src.read_bytes()
    assert result.bytes_transferred == 100_000 - 5000 + 100_000  # the bad resume, then a full fetch


def test_wrong_stored_checksum_fails_clearly(store, tmp_path):
    src = random_file(tmp_path / "w.bin", 4096, seed=4)
    store.client.fput_object(BUCKET, "bad/w.bin", str(src), metadata={"sha256": "0" * 64})
    dest = tmp_path / "dl" / "w.bin"
    with pytest.raises(ChecksumMismatch, match="s3://harnessrl-test/bad/w.bin"):
        store.download_file(f"s3://{BUCKET}/bad/w.bin", dest)
    assert not dest.exists() and not (tmp_path / "dl" / "w.bin.part").exists()


def test_directory_roundtrip_is_atomic(store, tmp_path):
    ckpt = tmp_path / "checkpoint"
    random_file(ckpt / "model.safetensors", 300_000, seed=5)
    (ckpt / "config.json").write_text('{"a": 1}')
    random_file(ckpt / "optim" / "state.pt", 1000, seed=6)
    up = store.upload_dir(ckpt, f"s3://{BUCKET}/runs/r1/checkpoint")
    assert len(up) == 3
    assert sorted(store.list(f"s3://{BUCKET}/runs/r1/checkpoint")) == [
        f"s3://{BUCKET}/runs/r1/checkpoint/config.json",
        f"s3://{BUCKET}/runs/r1/checkpoint/model.safetensors",
        f"s3://{BUCKET}/runs/r1/checkpoint/optim/state.pt",
    ]
    out = tmp_path / "restored"
    store.download_dir(f"s3://{BUCKET}/runs/r1/checkpoint", out)
    for rel in ("model.safetensors", "config.json", "optim/state.pt"):
        assert (out / rel).read_bytes() == (ckpt / rel).read_bytes()
    assert not (tmp_path / "restored.partial").exists()
    with pytest.raises(StoreError, match="no objects under this prefix"):
        store.download_dir(f"s3://{BUCKET}/runs/missing", tmp_path / "none")


def test_missing_object_and_unreachable_endpoint(store, tmp_path):
    with pytest.raises(StoreError, match="NoSuchKey"):
        store.download_file(f"s3://{BUCKET}/nope.bin", tmp_path / "x")
    with pytest.raises(FileNotFoundError, match="no such file to upload"):
        store.upload_file(tmp_path / "absent", f"s3://{BUCKET}/x")


def test_unreachable_endpoint_is_one_clear_error(tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dead = ObjectStore(
        StoreConfig(endpoint=f"http://127.0.0.1:{port}", access_key="a", secret_key="b", region="us-east-1")
    )
    with pytest.raises(StoreError, match=f"127.0.0.1:{port} failed"):
        dead.stat(f"s3://{BUCKET}/x")
