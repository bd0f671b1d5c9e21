"""core/records.py: every array column as an Arrow list of its real dtype, round trips
through Parquet, runs written as binary blobs (format 1) read or refused with the step to
re-run, and readers other than amflow's see arrays."""
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core import records
from core.storage import Storage
from training.data import SplitIndex

RNG = np.random.default_rng(7)


def _feature_rows(dtype: str, n: int = 4, dim: int = 12, stack: int = 3) -> list[dict]:
    out = []
    for i in range(n):
        t = int(RNG.integers(2, 9))
        fl = RNG.integers(0, 40, t * stack)
        out.append({"utt_id": f"u{i}", "speaker_id": "s", "split": "labeled", "condition": "DP1",
                    "shard": "x", **records.encode_feats(
                        RNG.standard_normal((t, dim)).astype(np.float32), dtype, stack),
                    "labels": records.encode_int16(records.offset_labels(fl, 0, stack, t)),
                    "frame_labels": None if i == 1 else records.encode_int16(fl)})
    return out


def _target_rows(code: str, classes: int, pruned: bool, n: int = 4, k: int = 5) -> list[dict]:
    out = []
    for i in range(n):
        t = int(RNG.integers(2, 9))
        logits = RNG.standard_normal((t, classes)).astype(np.float32)
        idx = np.argsort(-logits, axis=1)[:, :k]
        val = np.take_along_axis(logits, idx, 1)
        if code != "fp16":
            val = val - np.log(np.exp(logits).sum(1, keepdims=True))
        lens = RNG.integers(1, k + 1, t) if pruned else None
        out.append({"utt_id": f"u{i}", **records.encode_topk(idx, val, lens, code, classes)})
    return out


def _write_read(tmp_path, rows: list[dict], schema: pa.Schema) -> tuple[str, list[dict]]:
    uri = str(tmp_path / "t.parquet")
    Storage().write_parquet(uri, records.to_table(rows, schema))
    return uri, list(records.iter_rows(records.read_table(Storage(), uri)))


@pytest.mark.parametrize("dtype", ["uint8", "float16"])
def test_feature_columns_round_trip_as_typed_lists(tmp_path, dtype):
    rows = _feature_rows(dtype)
    uri, back = _write_read(tmp_path, rows, records.feature_schema(dtype))
    schema = pq.read_schema(uri)
    assert schema.metadata[b"amflow.records"] == b"2"
    assert schema.field("feats").type.value_type == records.FEAT_TYPES[dtype]
    assert schema.field("frame_labels").type.value_type == pa.int16()
    assert b"feat_dim" in schema.field("feats").metadata[b"amflow.shape"]
    for r, b in zip(rows, back):
        assert isinstance(b["feats"], np.ndarray) and b["feats"].dtype == np.dtype(dtype)
        assert np.array_equal(records.decode_feats(b), records.decode_feats(r))
        assert np.array_equal(records.decode_int16(b["labels"]),
                              records.decode_int16(r["labels"]))
        assert (b["frame_labels"] is None) == (r["frame_labels"] is None)
        assert (b["feat_min"] is None) == (dtype == "float16")
    # the values sit in byte-stream-split (or plain, float16) pages, not dictionaries
    meta = pq.ParquetFile(uri).metadata.row_group(0)
    enc = {meta.column(i).path_in_schema: meta.column(i).encodings
           for i in range(meta.num_columns)}
    want = "PLAIN" if dtype == "float16" else "BYTE_STREAM_SPLIT"
    assert want in enc["feats.list.element"]
    assert "BYTE_STREAM_SPLIT" in enc["labels.list.element"]
    assert not any("DICTIONARY" in e for e in enc["feats.list.element"])


@pytest.mark.parametrize("code,classes,pruned,types", [
    ("fp16", 30, False, (pa.int16(), pa.float16())),
    ("fp16", 30, True, (pa.int16(), pa.float16())),
    ("sqrt31", 200, True, (pa.uint8(), pa.uint8())),
    ("sqrt31", 3183, True, (pa.uint16(), pa.uint8())),
])
def test_target_columns_round_trip_in_their_codec_dtypes(tmp_path, code, classes, pruned, types):
    rows = _target_rows(code, classes, pruned)
    uri, back = _write_read(tmp_path, rows, records.target_schema(rows[0]["topk_code"]))
    schema = pq.read_schema(uri)
    assert (schema.field("topk_idx").type.value_type,
            schema.field("topk_logit").type.value_type) == types
    for r, b in zip(rows, back):
        (i0, v0), (i1, v1) = records.decode_topk(r), records.decode_topk(b)
        assert np.array_equal(i0, i1) and np.array_equal(v0, v1)
        assert (b["topk_len"] is None) == (not pruned)
    # one table holds one code: rows of another are refused, not silently cast
    with pytest.raises(ValueError, match="one table holds one code"):
        other = _target_rows("sqrt31", 30, False, n=1) if code == "fp16" else \
            _target_rows("fp16", 30, False, n=1)
        records.to_table(rows + other,
                         records.target_schema(rows[0]["topk_code"]))


def _blob_table(rows: list[dict], schema: pa.Schema) -> pa.Table:
    """The rows as the code before typed columns wrote them: each array's raw bytes."""
    cols = {}
    for f in schema:
        vals = [r.get(f.name) for r in rows]
        if pa.types.is_list(f.type):
            cols[f.name] = pa.array([None if v is None else v.tobytes() for v in vals],
                                    pa.binary())
        else:
            cols[f.name] = pa.array(vals, f.type)
    return pa.table(cols)


@pytest.mark.parametrize("dtype", ["uint8", "float16"])
def test_format_1_feature_blobs_read_as_the_same_values(tmp_path, dtype):
    rows = _feature_rows(dtype)
    uri = str(tmp_path / "part-00000.parquet")
    pq.write_table(_blob_table(rows, records.feature_schema(dtype)), uri)
    # only some columns asked for: the dtype column needed to type `feats` is read too
    t = records.read_table(Storage(), uri, ["num_frames", "feat_dim", "feats", "feat_min",
                                            "feat_scale", "labels", "frame_labels"])
    assert t.column_names == ["num_frames", "feat_dim", "feats", "feat_min", "feat_scale",
                              "labels", "frame_labels"]
    assert t.schema.field("feats").type == records.list_type(records.FEAT_TYPES[dtype])
    full = list(records.iter_rows(records.read_table(Storage(), uri)))
    for r, b in zip(rows, full):
        assert np.array_equal(records.decode_feats(b), records.decode_feats(r))
        assert np.array_equal(b["labels"], r["labels"])
    # the trainer's index counts the same usable rows in either format
    new = str(tmp_path / "new" / "part-00000.parquet")
    Storage().write_parquet(new, records.to_table(rows, records.feature_schema(dtype)))
    old_idx, new_idx = (SplitIndex.load(Storage(), [u], "labels") for u in (uri, new))
    assert old_idx.utt_ids == new_idx.utt_ids and len(old_idx) == len(rows)
    assert old_idx.has_frame_labels.tolist() == new_idx.has_frame_labels.tolist()


def test_format_1_target_blobs_read_with_or_without_topk_code(tmp_path):
    for code, classes in (("sqrt31", 200), ("fp16", 30)):
        rows = _target_rows(code, classes, pruned=True)
        table = _blob_table(rows, records.target_schema(rows[0]["topk_code"]))
        if code == "fp16":  # targets written before topk_code existed
            table = table.drop_columns(["topk_code"])
        uri = str(tmp_path / f"{code}.parquet")
        pq.write_table(table, uri)
        back = list(records.iter_rows(records.read_table(Storage(), uri)))
        for r, b in zip(rows, back):
            (i0, v0), (i1, v1) = records.decode_topk(r), records.decode_topk(b)
            assert np.array_equal(i0, i1) and np.array_equal(v0, v1)


def test_format_1_tables_no_typed_column_can_hold_are_refused_naming_the_step(tmp_path):
    feats = _feature_rows("uint8", n=2) + _feature_rows("float16", n=2)
    uri = str(tmp_path / "mixed.parquet")
    pq.write_table(_blob_table(feats, records.FEATURE_SCHEMA), uri)
    with pytest.raises(ValueError, match=r"mix feat_dtype.*re-run `amflow features"):
        records.read_table(Storage(), uri)
    targets = _target_rows("sqrt31", 200, True, n=2) + _target_rows("sqrt31", 3183, True, n=2)
    pq.write_table(_blob_table(targets, records.TARGET_SCHEMA), uri)
    with pytest.raises(ValueError, match=r"mix topk_code.*re-run `amflow targets"):
        records.read_table(Storage(), uri)
    bad = _blob_table(_feature_rows("uint8", n=1), records.FEATURE_SCHEMA)
    bad = bad.set_column(bad.schema.get_field_index("labels"), "labels",
                         pa.array([b"\x01\x02\x03"], pa.binary()))
    with pytest.raises(ValueError, match="3 bytes, no whole number of int16"):
        records.upgrade(bad)


def test_concat_takes_the_value_type_of_the_shards_that_have_targets():
    with_t = records.to_table(_target_rows("sqrt31", 200, True, n=2),
                              records.target_schema("sqrt31-u8"))
    without = records.TARGET_SCHEMA.empty_table()  # a shard with no target rows
    both = records.concat_tables([without, with_t])
    assert both.schema.field("topk_idx").type.value_type == pa.uint8()
    fp16 = records.to_table(_target_rows("fp16", 30, False, n=1), records.TARGET_SCHEMA)
    with pytest.raises(ValueError, match="targets.codec changed within a run"):
        records.concat_tables([with_t, fp16])


def test_duckdb_and_pandas_see_arrays_in_a_features_shard(tmp_path):
    duckdb = pytest.importorskip("duckdb")
    rows = _feature_rows("uint8")
    uri = str(tmp_path / "shard.parquet")
    Storage().write_parquet(uri, records.to_table(rows, records.FEATURE_SCHEMA))
    got = duckdb.sql(f"SELECT utt_id, typeof(feats), len(feats) = num_frames * feat_dim, "
                     f"feats, feat_scale[1], labels FROM read_parquet('{uri}') "
                     f"ORDER BY utt_id").fetchall()
    assert [g[0] for g in got] == [r["utt_id"] for r in rows]
    for g, r in zip(got, rows):
        assert g[1] == "UTINYINT[]" and g[2] is True
        assert np.array_equal(np.asarray(g[3], np.uint8), r["feats"])
        assert g[4] == pytest.approx(float(r["feat_scale"][0]))
        assert g[5] == r["labels"].tolist()
    frames = duckdb.sql(f"SELECT sum(len(labels)) FROM read_parquet('{uri}')").fetchall()[0][0]
    assert frames == sum(r["num_frames"] for r in rows)
    df = pq.read_table(uri).to_pandas()
    assert df["feats"][0].dtype == np.uint8 and np.array_equal(df["feats"][0], rows[0]["feats"])
