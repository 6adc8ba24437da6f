"""Large objects (checkpoints, task sets, rollout journals) in S3/MinIO, on the `minio` client.

- `s3://bucket/key` (or `minio://bucket/key`) URIs;
- multipart upload with a chosen part size (>= 5 MiB, S3's minimum);
- sha256 of every object stored as object metadata (`x-amz-meta-sha256`) and verified after download;
- resumable downloads: bytes land in `<dest>.part`; a rerun continues with a range GET from where it
  stopped (if the object's ETag is unchanged) and renames into place only after the checksum matches;
- whole directories (e.g. an HF checkpoint folder) up and down, atomically on the receiving side.

Configuration (never in pipeline YAML; on the cluster the env comes from the `harnessrl-s3` Secret and the
`harnessrl-store` ConfigMap): HARNESSRL_S3_ENDPOINT (e.g. http://minio-service.kubeflow:9000),
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, optional HARNESSRL_S3_REGION, HARNESSRL_S3_BUCKET (default bucket),
or a TOML file named by HARNESSRL_STORE_CONFIG with the keys endpoint, access_key, secret_key, region, bucket.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from harnessrl.progress import ProgressBar

MIN_PART_SIZE = 5 * 1024 * 1024
DEFAULT_PART_SIZE = 64 * 1024 * 1024
SHA256_META = "sha256"
CHUNK = 1024 * 1024


class StoreError(Exception):
    """A store operation failed; the message names the object and what to do."""


class ChecksumMismatch(StoreError):
    pass


@dataclass(frozen=True)
class S3Uri:
    bucket: str
    key: str

    @classmethod
    def parse(cls, uri: str) -> S3Uri:
        parsed = urlparse(uri)
        if parsed.scheme not in ("s3", "minio") or not parsed.netloc:
            raise ValueError(f"{uri!r}: expected s3://bucket/key (or minio://bucket/key)")
        return cls(parsed.netloc, parsed.path.lstrip("/"))

    def child(self, name: str) -> S3Uri:
        return S3Uri(self.bucket, f"{self.key.rstrip('/')}/{name}" if self.key else name)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


@dataclass(frozen=True)
class StoreConfig:
    endpoint: str  # http(s)://host:port
    access_key: str | None = None
    secret_key: str | None = None
    region: str | None = None
    bucket: str | None = None

    def __repr__(self) -> str:  # never print secrets
        return f"StoreConfig(endpoint={self.endpoint!r}, region={self.region!r}, bucket={self.bucket!r})"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> StoreConfig:
        env = dict(os.environ if env is None else env)
        values: dict[str, str] = {}
        if path := env.get("HARNESSRL_STORE_CONFIG"):
            try:
                values = {k: str(v) for k, v in tomllib.loads(Path(path).read_text()).items()}
            except (OSError, tomllib.TOMLDecodeError) as e:
                raise StoreError(f"HARNESSRL_STORE_CONFIG={path}: cannot read it ({e})") from None
        endpoint = env.get("HARNESSRL_S3_ENDPOINT") or values.get("endpoint")
        if not endpoint:
            raise StoreError(
                "no object store configured: set HARNESSRL_S3_ENDPOINT (e.g. "
                "http://minio-service.kubeflow:9000) and AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
                "or HARNESSRL_STORE_CONFIG=<toml file>"
            )
        return cls(
            endpoint=endpoint,
            access_key=env.get("AWS_ACCESS_KEY_ID") or values.get("access_key"),
            secret_key=env.get("AWS_SECRET_ACCESS_KEY") or values.get("secret_key"),
            region=env.get("HARNESSRL_S3_REGION") or values.get("region"),
            bucket=env.get("HARNESSRL_S3_BUCKET") or values.get("bucket"),
        )


@dataclass
class Transfer:
    uri: str
    path: Path
    size: int
    sha256: str
    bytes_transferred: int
    resumed_from: int = 0  # > 0: a download continued an earlier partial one
    skipped: bool = False  # the destination already held this exact object


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _progress(total: int, desc: str) -> ProgressBar:
    return ProgressBar(desc, total, unit="bytes", transient=True, min_total=8 * CHUNK)


class _UploadProgress:
    """The minio client's progress protocol (set_meta/update) on a progress bar."""

    def __init__(self) -> None:
        self.bar: ProgressBar | None = None

    def set_meta(self, object_name: str, total_length: int) -> None:
        self.bar = _progress(total_length, f"upload {object_name}").start()

    def update(self, length: int) -> None:
        if self.bar is not None:
            self.bar.advance(length)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _errors() -> tuple[type[Exception], ...]:
    """What the minio client raises: S3 error replies, and urllib3 errors when the endpoint is unreachable."""
    import urllib3
    from minio.error import MinioException

    return (MinioException, urllib3.exceptions.HTTPError)


class ObjectStore:
    def __init__(self, config: StoreConfig, part_size: int = DEFAULT_PART_SIZE) -> None:
        from minio import Minio

        if part_size < MIN_PART_SIZE:
            raise ValueError(f"part_size {part_size} is below S3's minimum of {MIN_PART_SIZE} bytes (5 MiB)")
        parsed = urlparse(config.endpoint if "://" in config.endpoint else f"http://{config.endpoint}")
        self.config = config
        self.part_size = part_size
        self.client = Minio(
            parsed.netloc,
            access_key=config.access_key,
            secret_key=config.secret_key,
            region=config.region,
            secure=parsed.scheme == "https",
        )

    @classmethod
    def from_env(cls, part_size: int = DEFAULT_PART_SIZE) -> ObjectStore:
        return cls(StoreConfig.from_env(), part_size=part_size)

    def _err(self, error: Exception, action: str, uri: S3Uri | str) -> StoreError:
        from minio.error import S3Error

        if isinstance(error, S3Error):  # the store's own answer: its code and message
            code, detail = error.code or "S3Error", error.message or error
        else:  # unreachable endpoint, broken connection, ...
            code, detail = type(error).__name__, error
        return StoreError(f"{action} {uri} at {self.config.endpoint} failed: {code}: {detail}")

    def ensure_bucket(self, bucket: str) -> None:
        try:
            if not self.client.bucket_exists(bucket):
                self.client.make_bucket(bucket)
        except _errors() as e:
            raise self._err(e, "creating bucket", bucket) from None

    # ----- single objects -----

    def upload_file(self, path: str | Path, uri: str, *, part_size: int | None = None) -> Transfer:
        """Uploads `path` (multipart for files above `part_size`), recording its sha256 as metadata."""
        path, dest = Path(path), S3Uri.parse(uri)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file to upload")
        part = part_size or self.part_size
        if part < MIN_PART_SIZE:
            raise ValueError(f"part_size {part} is below S3's minimum of {MIN_PART_SIZE} bytes (5 MiB)")
        digest = sha256_file(path)
        progress = _UploadProgress()
        try:
            self.client.fput_object(
                dest.bucket,
                dest.key,
                str(path),
                metadata={SHA256_META: digest},
                part_size=part,
                progress=progress,
            )
        except _errors() as e:
            raise self._err(e, "uploading", dest) from None
        finally:
            progress.close()
        size = path.stat().st_size
        return Transfer(str(dest), path, size, digest, size)

    def stat(self, uri: str) -> tuple[int, str | None, str]:
        """(size, sha256 from metadata or None, etag)."""
        src = S3Uri.parse(uri)
        try:
            info = self.client.stat_object(src.bucket, src.key)
        except _errors() as e:
            raise self._err(e, "reading", src) from None
        meta = {k.lower(): v for k, v in (info.metadata or {}).items()}
        sha = meta.get(f"x-amz-meta-{SHA256_META}") or meta.get(SHA256_META)
        return int(info.size or 0), sha, str(info.etag or "")

    def download_file(self, uri: str, dest: str | Path, *, resume: bool = True) -> Transfer:
        """Downloads to `dest` via `<dest>.part`; resumes a partial download; verifies the stored sha256."""
        dest = Path(dest)
        size, expected, etag = self.stat(uri)
        if dest.is_file() and expected and dest.stat().st_size == size and sha256_file(dest) == expected:
            return Transfer(uri, dest, size, expected, 0, skipped=True)
        part, tag = dest.with_name(dest.name + ".part"), dest.with_name(dest.name + ".part.etag")
        dest.parent.mkdir(parents=True, exist_ok=True)
        start = 0
        if (
            resume
            and part.is_file()
            and tag.is_file()
            and tag.read_text() == etag
            and part.stat().st_size <= size
        ):
            start = part.stat().st_size
        else:
            part.unlink(missing_ok=True)
        tag.write_text(etag)
        transferred = self._fetch(uri, part, start, size)
        actual = sha256_file(part)
        if expected and actual != expected:
            part.unlink(missing_ok=True)
            if start > 0:  # the kept prefix was bad: fetch the whole object once more
                tag.write_text(etag)
                transferred += self._fetch(uri, part, 0, size)
                actual = sha256_file(part)
            if actual != expected:
                part.unlink(missing_ok=True)
                tag.unlink(missing_ok=True)
                raise ChecksumMismatch(
                    f"{uri}: downloaded bytes have sha256 {actual[:12]}…, the object's "
                    f"metadata says {expected[:12]}…; the object or its metadata is corrupt "
                    "— re-upload it"
                )
            start = 0
        os.replace(part, dest)
        tag.unlink(missing_ok=True)
        return Transfer(uri, dest, size, actual, transferred, resumed_from=start)

    def _fetch(self, uri: str, part: Path, start: int, size: int) -> int:
        src = S3Uri.parse(uri)
        if start >= size:
            return 0
        written = 0
        try:
            response = self.client.get_object(src.bucket, src.key, offset=start)
        except _errors() as e:
            raise self._err(e, "downloading", src) from None
        try:
            with open(part, "ab") as f, _progress(size - start, f"download {src.key}") as bar:
                for block in response.stream(CHUNK):
                    f.write(block)
                    written += len(block)
                    bar.advance(len(block))
                f.flush()
                os.fsync(f.fileno())
        finally:
            response.close()
            response.release_conn()
        return written

    # ----- directories -----

    def list(self, uri: str) -> Iterator[str]:
        """Keys under the `uri` prefix (recursive), as s3:// URIs."""
        prefix = S3Uri.parse(uri)
        key = prefix.key.rstrip("/") + "/" if prefix.key else ""
        try:
            for obj in self.client.list_objects(prefix.bucket, prefix=key, recursive=True):
                if obj.object_name is not None:  # minio types it optional; a listed object has a name
                    yield str(S3Uri(prefix.bucket, obj.object_name))
        except _errors() as e:
            raise self._err(e, "listing", prefix) from None

    def upload_dir(self, local_dir: str | Path, uri: str, *, part_size: int | None = None) -> list[Transfer]:
        """Uploads every file under `local_dir` to `uri/<relative path>`."""
        local_dir, base = Path(local_dir), S3Uri.parse(uri)
        if not local_dir.is_dir():
            raise FileNotFoundError(f"{local_dir}: no such directory to upload")
        files = sorted(p for p in local_dir.rglob("*") if p.is_file())
        return [
            self.upload_file(p, str(base.child(p.relative_to(local_dir).as_posix())), part_size=part_size)
            for p in files
        ]

    def download_dir(self, uri: str, local_dir: str | Path) -> list[Transfer]:
        """Downloads everything under `uri` into `local_dir`, which appears whole or not at all.

        Files land in `<local_dir>.partial/` first, so an interrupted download resumes on the next call.
        """
        local_dir, base = Path(local_dir), S3Uri.parse(uri)
        staging = local_dir.with_name(local_dir.name + ".partial")
        prefix = base.key.rstrip("/") + "/" if base.key else ""
        transfers = []
        for obj_uri in self.list(uri):
            rel = S3Uri.parse(obj_uri).key[len(prefix) :]
            transfers.append(self.download_file(obj_uri, staging / rel))
        if not transfers:
            raise StoreError(f"{uri}: no objects under this prefix")
        if local_dir.exists():
            shutil.rmtree(local_dir)
        os.replace(staging, local_dir)
        for t in transfers:
            t.path = local_dir / t.path.relative_to(staging)
        return transfers
