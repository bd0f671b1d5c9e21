import os
import threading

import pyarrow as pa
import pytest

from core.config import load_config
from core.storage import Storage, is_transient, join
from tests.conftest import ROOT


def _roundtrip(st: Storage, base: str) -> None:
    st.write_bytes(join(base, "a/b.bin"), b"hello")
    assert st.read_bytes(join(base, "a/b.bin")) == b"hello"
    assert st.exists(join(base, "a/b.bin")) and not st.exists(join(base, "a/none"))
    st.write_json(join(base, "a/c.json"), {"x": 1})
    assert st.read_json(join(base, "a/c.json")) == {"x": 1}
    t = pa.table({"utt_id": ["u1", "u2"], "n": [1, 2]})
    n = st.write_parquet(join(base, "p/part-0.parquet"), t)
    assert n > 0 and st.size(join(base, "p/part-0.parquet")) == n
    assert st.read_parquet(join(base, "p/part-0.parquet")).equals(t)
    assert st.list(join(base, "a")) == [join(base, "a/b.bin"), join(base, "a/c.json")]
    assert st.list(join(base, "a"), suffix=".json") == [join(base, "a/c.json")]
    assert st.list(base, suffix=".parquet", recursive=True) == [join(base, "p/part-0.parquet")]
    assert st.list(join(base, "missing")) == []
    # versions: the listing's files, each by size and modification time; one written
    # again with other bytes has another
    versions = st.versions(join(base, "a"))
    assert list(versions) == st.list(join(base, "a"))
    assert versions[join(base, "a/c.json")] == st.version(join(base, "a/c.json"))
    st.write_json(join(base, "a/c.json"), {"x": 12})
    assert st.version(join(base, "a/c.json")) != versions[join(base, "a/c.json")]
    st.delete(join(base, "a/b.bin"))
    assert not st.exists(join(base, "a/b.bin"))
    with pytest.raises(FileNotFoundError):
        st.read_bytes(join(base, "a/b.bin"))


def test_local_paths_and_file_uris(tmp_path):
    st = Storage()
    _roundtrip(st, str(tmp_path / "plain"))
    _roundtrip(st, f"file://{tmp_path}/uri")


def test_local_write_is_atomic(tmp_path):
    """A concurrent reader sees either nothing or the whole file, never a prefix."""
    st = Storage()
    uri = str(tmp_path / "big.bin")
    payload = os.urandom(8 << 20)
    seen = []
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            if os.path.exists(uri):
                seen.append(len(open(uri, "rb").read()))

    th = threading.Thread(target=reader)
    th.start()
    for _ in range(5):
        st.write_bytes(uri, payload)
    stop.set()
    th.join()
    assert seen and set(seen) == {len(payload)}
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]


def test_transient_classification():
    assert is_transient(OSError("AWS Error NETWORK_CONNECTION during GetObject: curl code 7"))
    assert is_transient(ConnectionError("reset"))
    assert not is_transient(FileNotFoundError("x"))
    assert not is_transient(OSError("Access Denied"))


def test_retry_with_backoff(tmp_path):
    st = Storage(load_config(None, ["storage.retry_backoff_s=0.001"]).storage)
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("connection reset by peer")
        return "ok"

    assert st.retry(flaky, "flaky") == "ok" and len(calls) == 3


@pytest.mark.integration
def test_s3_roundtrip_over_http(s3_bucket):
    bucket, overrides = s3_bucket
    cfg = load_config(ROOT / "configs/local.yaml", [f"storage.root=s3://{bucket}/root", *overrides])
    st = Storage(cfg.storage)
    _roundtrip(st, f"s3://{bucket}/root")
    # boto3 sees what pyarrow wrote
    keys = [o["Key"] for o in st.boto3_client().list_objects_v2(Bucket=bucket)["Contents"]]
    assert "root/p/part-0.parquet" in keys


@pytest.mark.integration
def test_s3_write_from_a_ray_task(s3_bucket, ray_local):
    bucket, overrides = s3_bucket
    cfg = load_config(ROOT / "configs/local.yaml", [f"storage.root=s3://{bucket}/r", *overrides])
    st = Storage(cfg.storage)

    @ray_local.remote
    def write(storage: Storage, i: int) -> str:
        uri = f"s3://{bucket}/r/from-ray-{i}.json"
        storage.write_json(uri, {"i": i, "pid": os.getpid()})
        return uri

    uris = ray_local.get([write.remote(st, i) for i in range(3)])
    assert [st.read_json(u)["i"] for u in uris] == [0, 1, 2]


def test_parquet_keeps_statistics_for_scalar_columns_only(tmp_path):
    """A blob column's min / max would be two whole blobs per row group (~9 % of a target
    shard); scalar columns keep theirs."""
    import pyarrow.parquet as pq

    st = Storage()
    uri = str(tmp_path / "t.parquet")
    blobs = [os.urandom(4000) for _ in range(20)]
    n = st.write_parquet(uri, pa.table({"utt_id": [f"u{i}" for i in range(20)],
                                        "num_frames": list(range(20)), "blob": blobs}))
    rg = pq.ParquetFile(uri).metadata.row_group(0)
    stats = {rg.column(i).path_in_schema: rg.column(i).statistics for i in range(3)}
    assert stats["num_frames"].has_min_max and stats["num_frames"].max == 19
    assert stats["utt_id"].has_min_max
    assert stats["blob"] is None or not stats["blob"].has_min_max
    assert n < 20 * 4000 + 4000  # random blobs do not compress: no second copy of two
    assert st.read_parquet(uri).column("blob").to_pylist() == blobs


def test_a_reader_elsewhere_resolves_relative_paths_where_the_steps_ran(tmp_path, monkeypatch):
    """A summary written by a step that ran in a user's folder names ./mine/runs/...; the
    Airflow API server, in another folder, reads it with that folder as its base."""
    import pickle

    from core.storage import Storage

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "r.json").write_text('{"wer": 0.1}')
    monkeypatch.chdir("/")
    st = Storage(base=str(tmp_path))
    assert st.exists("./mine/r.json") and st.read_json("mine/r.json") == {"wer": 0.1}
    assert not Storage().exists("./mine/r.json")  # the process's cwd by default
    assert pickle.loads(pickle.dumps(st)).exists("./mine/r.json")
