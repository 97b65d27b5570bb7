"""A checkpoint's hash is read once per unchanged file: eval keys its cached reference by
it, and hashing a 7B checkpoint again on every run cost more than what it keyed."""

import hashlib
import os

from compress.model import known_hash
from compress.model.loading import weights_sha256


def test_an_unchanged_file_is_hashed_once_and_any_write_is_noticed(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(known_hash, "MIN_BYTES", 0)
    monkeypatch.setattr(known_hash, "_memo", {})
    reads = []
    real = known_hash.file_sha256
    monkeypatch.setattr(known_hash, "file_sha256", lambda p: reads.append(p) or real(p))
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    a.write_bytes(b"x" * 1000)
    b.write_bytes(b"y" * 1000)
    for f in (a, b):  # written a while ago (a file written just now is hashed each time)
        os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns - 10**10))
    want = hashlib.sha256()
    for f in (a, b):
        want.update(f"{f.name}:{hashlib.sha256(f.read_bytes()).hexdigest()}\n".encode())
    assert weights_sha256([a, b]) == want.hexdigest() and len(reads) == 2
    assert weights_sha256([a, b]) == want.hexdigest() and len(reads) == 2  # this process
    known_hash._memo.clear()  # another process: the cache folder remembers
    assert weights_sha256([a, b]) == want.hexdigest() and len(reads) == 2
    stat = a.stat()
    a.write_bytes(b"z" * 1000)  # same size; a write moves the modification time
    os.utime(a, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert known_hash.known_sha256(a) == hashlib.sha256(b"z" * 1000).hexdigest()
    assert reads[-1] == a and len(reads) == 3
    for f in (tmp_path / "cache" / "sha256").iterdir():  # a damaged entry is computed again
        f.write_text("not a hash")
    known_hash._memo.clear()
    assert known_hash.known_sha256(b) == hashlib.sha256(b"y" * 1000).hexdigest()
    assert len(reads) == 4


def test_a_file_written_just_now_is_hashed_every_time(tmp_path, monkeypatch):
    """Two same-size writes within one tick of the file system's clock keep the stat the
    same: such a file's hash is not remembered until it has been left alone a while."""
    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(known_hash, "MIN_BYTES", 0)
    monkeypatch.setattr(known_hash, "_memo", {})
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"1" * 1000)
    mtime = f.stat().st_mtime_ns
    assert known_hash.known_sha256(f) == hashlib.sha256(b"1" * 1000).hexdigest()
    f.write_bytes(b"2" * 1000)
    os.utime(f, ns=(f.stat().st_atime_ns, mtime))  # as if in the same tick
    assert known_hash.known_sha256(f) == hashlib.sha256(b"2" * 1000).hexdigest()
    assert not (tmp_path / "cache" / "sha256").exists()


def test_small_files_and_an_unwritable_cache_are_only_slower(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(known_hash, "_memo", {})
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"w" * 100)
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns - 10**10))
    assert known_hash.known_sha256(f) == hashlib.sha256(b"w" * 100).hexdigest()
    assert not (tmp_path / "cache").exists()  # under MIN_BYTES: nothing kept
    monkeypatch.setattr(known_hash, "MIN_BYTES", 0)
    (tmp_path / "cache").write_text("")  # mkdir of cache/sha256 fails
    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache" / "sub"))
    assert known_hash.known_sha256(f) == hashlib.sha256(b"w" * 100).hexdigest()


def test_loading_an_artifact_reads_its_weights_once_and_verify_reads_every_byte(
    tmp_path, monkeypatch
):
    """The load-time check trusts a remembered hash while the file's stat is unchanged (a
    7B artifact is 5 GB to read on every load); an edit moves the stat and is refused;
    `verify` (problems with its default hash) reads every byte and finds what the stat
    cannot show."""
    import json

    import pytest

    from compress.artifact import integrity
    from compress.errors import LlmpressError

    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(known_hash, "MIN_BYTES", 0)
    monkeypatch.setattr(known_hash, "_memo", {})
    monkeypatch.setattr(integrity, "_verified", {})
    reads = []
    real = known_hash.file_sha256
    monkeypatch.setattr(known_hash, "file_sha256", lambda p: reads.append(p) or real(p))
    art = tmp_path / "artifact"
    art.mkdir()
    weights = art / "model.safetensors"
    weights.write_bytes(b"w" * 1000)
    old = weights.stat()
    os.utime(weights, ns=(old.st_atime_ns, old.st_mtime_ns - 10**10))
    digest = hashlib.sha256(b"w" * 1000).hexdigest()
    (art / "manifest.json").write_text(json.dumps({"sha256": {weights.name: digest}}))
    integrity.check_artifact(art, known_hash.known_sha256)
    integrity._verified.clear()
    known_hash._memo.clear()  # a second process
    integrity.check_artifact(art, known_hash.known_sha256)
    assert reads == [weights]
    stat = weights.stat()
    with open(weights, "r+b") as f:  # one byte rots; size and times restored
        f.write(b"v")
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    integrity._verified.clear()
    integrity.check_artifact(art, known_hash.known_sha256)  # the stat cannot show it
    assert integrity.problems(art) == [
        f"{weights.name}: altered (sha256 differs from manifest.json)"
    ]
    weights.write_bytes(b"x" * 1000)  # an edit: the modification time moves
    integrity._verified.clear()
    with pytest.raises(LlmpressError, match="altered"):
        integrity.check_artifact(art, known_hash.known_sha256)
