"""`onjob.bucket` against a real S3 API server (moto's, its own process)."""

from __future__ import annotations

import pytest

from onjob.bucket import Bucket, BucketError, ObjectExists, ObjectMissing

from .s3_server import bucket_url, s3_endpoint  # noqa: F401  (fixtures)


@pytest.fixture
def bucket(bucket_url, s3_endpoint) -> Bucket:  # noqa: F811
    return Bucket.from_url(bucket_url, endpoint_url=s3_endpoint)


def test_objects_round_trip_under_the_prefix(bucket, tmp_path, s3_endpoint):  # noqa: F811
    bucket.put_bytes("a/one.txt", b"one")
    src = tmp_path / "two.bin"
    src.write_bytes(bytes(range(256)) * 1000)
    bucket.put_file("a/two.bin", src)
    bucket.put_bytes("b/three", b"")

    assert bucket.get_bytes("a/one.txt") == b"one"
    got = bucket.get_file("a/two.bin", tmp_path / "out" / "two.bin")
    assert got.read_bytes() == src.read_bytes()
    assert [(o.key, o.size) for o in bucket.list("a/")] == [("a/one.txt", 3), ("a/two.bin", 256000)]
    assert [o.key for o in bucket.list()] == ["a/one.txt", "a/two.bin", "b/three"]
    assert bucket.exists("b/three") and not bucket.exists("b/four")

    # The prefix is where they live: the same bucket without it sees them below it.
    whole = Bucket.from_url(bucket.url.split("/onjob")[0], endpoint_url=s3_endpoint)
    assert [o.key for o in whole.list()] == ["onjob/a/one.txt", "onjob/a/two.bin", "onjob/b/three"]

    bucket.delete("a/one.txt")
    bucket.delete("a/one.txt")  # gone already: no error
    assert [o.key for o in bucket.list("a/")] == ["a/two.bin"]
    with pytest.raises(ObjectMissing):
        bucket.get_bytes("a/one.txt")
    with pytest.raises(ObjectMissing):
        bucket.get_file("a/one.txt", tmp_path / "missing")
    assert not (tmp_path / "missing").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_create_only_write_never_replaces_an_object(bucket, tmp_path):
    bucket.put_bytes("seg", b"first")
    with pytest.raises(ObjectExists):
        bucket.put_bytes("seg", b"second")
    (tmp_path / "f").write_bytes(b"third")
    with pytest.raises(ObjectExists):
        bucket.put_file("seg", tmp_path / "f")
    assert bucket.get_bytes("seg") == b"first"
    bucket.put_bytes("seg", b"fourth", overwrite=True)
    assert bucket.get_bytes("seg") == b"fourth"


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", ".."])
def test_bad_keys_are_refused_before_any_request(bucket, key):
    with pytest.raises(BucketError, match="bad object key"):
        bucket.put_bytes(key, b"x")


@pytest.mark.parametrize("url", ["name/prefix", "http://name", "s3://", "s3:///x"])
def test_a_url_that_is_not_a_bucket_is_refused(url):
    with pytest.raises(BucketError, match="not a bucket URL"):
        Bucket.from_url(url)


def test_an_unreachable_store_is_a_bucket_error(tmp_path):
    from onjob.cli.process import free_port

    bucket = Bucket.from_url("s3://nowhere", endpoint_url=f"http://127.0.0.1:{free_port()}")
    bucket._client.meta.config.retries = {"max_attempts": 1}
    with pytest.raises(BucketError):
        bucket.put_bytes("k", b"x")
    with pytest.raises(BucketError):
        bucket.list()


def test_a_missing_bucket_is_a_bucket_error(s3_endpoint):  # noqa: F811
    bucket = Bucket.from_url("s3://no-such-bucket-here", endpoint_url=s3_endpoint)
    with pytest.raises(BucketError, match="NoSuchBucket"):
        bucket.put_bytes("k", b"x")
    with pytest.raises(BucketError, match="NoSuchBucket"):
        bucket.list()
