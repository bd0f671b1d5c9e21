"""One storage layer for plain paths, `file://` and `s3://` URIs, on `pyarrow.fs`.

Every write is published atomically: on local disk we write `<name>.tmp-<uuid>` and
rename it into place; on S3 a PUT (single or multipart) only becomes visible once it is
complete. So a reader never sees a partial file, and a file's existence means it is whole.

S3 endpoint, region and credentials come from `storage.s3` in config, else from the
standard AWS chain. Transient errors are retried with exponential backoff.
`Storage` is picklable (it rebuilds its filesystems lazily), so Ray tasks can take it.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import posixpath
import random
import time
import uuid
from dataclasses import asdict
from typing import Any, Callable, Iterable, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from core.config import S3Config, StorageConfig

log = logging.getLogger(__name__)
T = TypeVar("T")

_TRANSIENT_MARKERS = ("timeout", "timed out", "connection", "throttl", "slow down", "slowdown",
                      "503", "500", "internalerror", "service unavailable", "reset by peer",
                      "temporarily", "curl")


def is_transient(exc: BaseException) -> bool:
    """Errors worth retrying: network and throttling, never 'not found' or permission."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return False
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, OSError) and any(m in text for m in _TRANSIENT_MARKERS)


def join(base: str, *parts: str) -> str:
    """Join URI parts with '/', keeping the scheme intact."""
    out = base.rstrip("/")
    for p in parts:
        p = str(p).strip("/")
        if p:
            out = f"{out}/{p}"
    return out


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def parent(uri: str) -> str:
    scheme, _, rest = uri.partition("://")
    if not _:
        return posixpath.dirname(uri.rstrip("/"))
    return f"{scheme}://{posixpath.dirname(rest.rstrip('/'))}"


def basename(uri: str) -> str:
    return posixpath.basename(uri.rstrip("/"))


class Storage:
    """Bytes, JSON and Parquet I/O over one URI namespace."""

    def __init__(self, cfg: StorageConfig | None = None, base: str = ""):
        self.cfg = cfg or StorageConfig()
        # where relative local paths resolve ("": this process's cwd). A reader in another
        # folder than the steps that wrote them (Airflow's API server reading a run under a
        # user's ./mine) gives the steps' folder: their summaries name ./mine/runs/...
        self.base = base
        self._s3: pafs.S3FileSystem | None = None
        self._local = pafs.LocalFileSystem()

    # -- pickling: filesystems are rebuilt where the object lands (e.g. a Ray worker).
    def __getstate__(self) -> dict:
        return {"cfg": asdict(self.cfg), "base": self.base}

    def __setstate__(self, state: dict) -> None:
        d = dict(state["cfg"])
        d["s3"] = S3Config(**d["s3"])
        self.__init__(StorageConfig(**d), state.get("base", ""))

    # -- resolution
    def s3_filesystem(self) -> pafs.S3FileSystem:
        if self._s3 is None:
            s3 = self.cfg.s3
            kw: dict[str, Any] = {}
            if s3.endpoint_url:
                scheme, _, host = s3.endpoint_url.partition("://")
                kw["endpoint_override"] = host or scheme
                kw["scheme"] = scheme if host else "https"
            if s3.region:
                kw["region"] = s3.region
            if s3.access_key_id:
                kw["access_key"] = s3.access_key_id
                kw["secret_key"] = s3.secret_access_key
                if s3.session_token:
                    kw["session_token"] = s3.session_token
            if s3.force_path_style:
                kw["force_virtual_addressing"] = False
            kw["retry_strategy"] = pafs.AwsStandardS3RetryStrategy(max_attempts=3)
            self._s3 = pafs.S3FileSystem(**kw)
        return self._s3

    def resolve(self, uri: str) -> tuple[pafs.FileSystem, str]:
        if is_s3(uri):
            return self.s3_filesystem(), uri[len("s3://"):].rstrip("/")
        if uri.startswith("file://"):
            uri = uri[len("file://"):]
        return self._local, os.path.abspath(os.path.join(self.base, os.path.expanduser(uri)))

    def boto3_client(self):
        """A boto3 S3 client with the same endpoint and credentials (for S3-API-only calls)."""
        import boto3

        s3 = self.cfg.s3
        kw: dict[str, Any] = {}
        if s3.endpoint_url:
            kw["endpoint_url"] = s3.endpoint_url
        if s3.region:
            kw["region_name"] = s3.region
        if s3.access_key_id:
            kw["aws_access_key_id"] = s3.access_key_id
            kw["aws_secret_access_key"] = s3.secret_access_key
            if s3.session_token:
                kw["aws_session_token"] = s3.session_token
        return boto3.client("s3", **kw)

    # -- retries
    def retry(self, fn: Callable[[], T], what: str) -> T:
        delay = self.cfg.retry_backoff_s
        for attempt in range(self.cfg.retries + 1):
            try:
                return fn()
            except Exception as exc:  # noqa: BLE001 - classified below
                if attempt >= self.cfg.retries or not is_transient(exc):
                    raise
                sleep = delay * (2**attempt) * (0.5 + random.random())
                log.warning("transient storage error on %s (%s); retry %d in %.1fs",
                            what, exc, attempt + 1, sleep)
                time.sleep(sleep)
        raise AssertionError("unreachable")

    # -- queries
    def exists(self, uri: str) -> bool:
        fs, path = self.resolve(uri)
        info = self.retry(lambda: fs.get_file_info(path), f"stat {uri}")
        return info.type != pafs.FileType.NotFound

    def size(self, uri: str) -> int:
        fs, path = self.resolve(uri)
        info = self.retry(lambda: fs.get_file_info(path), f"stat {uri}")
        if info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(uri)
        return int(info.size or 0)

    def list(self, uri: str, suffix: str = "", recursive: bool = False) -> list[str]:
        """URIs of files under `uri` (sorted), ending with `suffix`. Missing dir -> []."""
        return sorted(self._file_infos(uri, suffix, recursive))

    def versions(self, uri: str, suffix: str = "", recursive: bool = False) -> dict[str, str]:
        """`list`'s files, each with `version`'s answer, from the one listing."""
        return {u: _version(info)
                for u, info in sorted(self._file_infos(uri, suffix, recursive).items())}

    def subdirs(self, uri: str) -> list[str]:
        """URIs of the folders directly under `uri` (sorted). Missing dir -> []. On S3: the
        common prefixes of one delimited listing."""
        base = uri.rstrip("/")
        _, infos = self._listing(uri, recursive=False)
        return sorted(f"{base}/{os.path.basename(i.path.rstrip('/'))}" for i in infos
                      if i.type == pafs.FileType.Directory)

    def version(self, uri: str) -> str:
        """What changes when an object is written again: its size and modification time
        (S3: LastModified), without reading it. For inputs too large to digest (a corpus's
        metadata: gigabytes at scale); `digest` for models and LMs."""
        fs, path = self.resolve(uri)
        info = self.retry(lambda: fs.get_file_info(path), f"stat {uri}")
        if info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(uri)
        return _version(info)

    def _listing(self, uri: str, recursive: bool) -> tuple[str, list[pafs.FileInfo]]:
        """(the store's path of `uri`, the infos under it); a missing folder lists empty."""
        fs, path = self.resolve(uri)
        sel = pafs.FileSelector(path, allow_not_found=True, recursive=recursive)
        return path, self.retry(lambda: fs.get_file_info(sel), f"list {uri}")

    def _file_infos(self, uri: str, suffix: str, recursive: bool) -> dict[str, pafs.FileInfo]:
        path, infos = self._listing(uri, recursive)
        base = uri.rstrip("/")
        out = {}
        for info in infos:
            if info.type != pafs.FileType.File or not info.path.endswith(suffix):
                continue
            name = os.path.basename(info.path)
            if ".tmp-" in name:
                continue
            rel = info.path[len(path):].lstrip("/")
            out[f"{base}/{rel}"] = info
        return out

    # -- reads
    def read_bytes(self, uri: str) -> bytes:
        fs, path = self.resolve(uri)

        def _read() -> bytes:
            with fs.open_input_stream(path) as f:
                return f.read()

        return self.retry(_read, f"read {uri}")

    def digest(self, uri: str) -> str:
        """The object's identity: its bytes' SHA-256 (hex, the first 16 digits). A step
        that read a model or an LM keeps it, so that a rerun after the object was made again
        at the same URI notices (a URI names a place, not its contents)."""
        return digest_of(self.read_bytes(uri))

    def read_text(self, uri: str) -> str:
        return self.read_bytes(uri).decode("utf-8")

    def read_json(self, uri: str) -> Any:
        return json.loads(self.read_bytes(uri))

    def read_parquet(self, uri: str, columns: list[str] | None = None) -> pa.Table:
        fs, path = self.resolve(uri)
        return self.retry(lambda: pq.read_table(path, filesystem=fs, columns=columns),
                          f"read parquet {uri}")

    # -- writes (atomic publish)
    def write_bytes(self, uri: str, data: bytes) -> None:
        fs, path = self.resolve(uri)
        if is_s3(uri):
            # An S3 object appears only once its upload completes: atomic by construction.
            def _put() -> None:
                with fs.open_output_stream(path) as f:
                    f.write(data)

            self.retry(_put, f"write {uri}")
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)

    def write_text(self, uri: str, text: str) -> None:
        self.write_bytes(uri, text.encode("utf-8"))

    def write_json(self, uri: str, obj: Any) -> None:
        self.write_bytes(uri, (json.dumps(obj, indent=2, sort_keys=True, default=_json_default)
                               + "\n").encode("utf-8"))

    def write_parquet(self, uri: str, table: pa.Table, compression: str = "zstd",
                      compression_level: int | None = None) -> int:
        """Write a table atomically; returns the bytes written.

        A field whose metadata names a Parquet encoding (`amflow.parquet_encoding`, e.g.
        core.records' array columns: BYTE_STREAM_SPLIT) is written in it, without a
        dictionary; the other columns as pyarrow's defaults.

        Statistics (min / max per row group) are written for the scalar columns only: for a
        blob column (features, top-k targets) they are two whole blobs per row group, ~9 %
        of a target shard, and nothing reads them."""
        buf = io.BytesIO()
        stats = [f.name for f in table.schema
                 if not (pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type)
                         or pa.types.is_nested(f.type))]
        encodings = {_leaf(f): f.metadata[PARQUET_ENCODING].decode() for f in table.schema
                     if f.metadata and PARQUET_ENCODING in f.metadata}
        dictionary = [_leaf(f) for f in table.schema if _leaf(f) not in encodings]
        pq.write_table(table, buf, compression=compression, compression_level=compression_level,
                       write_statistics=stats, column_encoding=encodings or None,
                       use_dictionary=dictionary if encodings else True)
        data = buf.getvalue()
        self.write_bytes(uri, data)
        return len(data)

    def delete(self, uri: str) -> None:
        fs, path = self.resolve(uri)
        try:
            self.retry(lambda: fs.delete_file(path), f"delete {uri}")
        except FileNotFoundError:
            pass

    def delete_dir(self, uri: str) -> None:
        fs, path = self.resolve(uri)
        try:
            self.retry(lambda: fs.delete_dir(path), f"delete dir {uri}")
        except FileNotFoundError:
            pass

    def copy_local_dir(self, local_dir: str, uri: str) -> None:
        """Upload a local directory tree (e.g. a checkpoint) file by file."""
        for root, _, files in os.walk(local_dir):
            for name in files:
                src = os.path.join(root, name)
                rel = os.path.relpath(src, local_dir)
                with open(src, "rb") as f:
                    self.write_bytes(join(uri, rel), f.read())

    def local_path(self, uri: str) -> str | None:
        """The local filesystem path of `uri`, or None for remote URIs."""
        if is_s3(uri):
            return None
        return self.resolve(uri)[1]


PARQUET_ENCODING = b"amflow.parquet_encoding"


def _leaf(field: pa.Field) -> str:
    """A column's leaf path in the Parquet file (a list's values: <name>.list.element)."""
    return f"{field.name}.list.element" if pa.types.is_list(field.type) else field.name


def _json_default(o: Any) -> Any:
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def iter_jsonl(text: str) -> Iterable[tuple[int, str]]:
    """(1-based line number, line) for non-blank lines."""
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip():
            yield i, line


def _version(info: pafs.FileInfo) -> str:
    mtime = info.mtime_ns if info.mtime_ns is not None else 0
    return f"{int(info.size or 0)}@{int(mtime)}"


def digest_of(data: bytes) -> str:
    """`Storage.digest` of bytes already read (a step that digests and then uses an object
    reads it once: the digest it keeps is that of the bytes it used)."""
    return hashlib.sha256(data).hexdigest()[:16]
