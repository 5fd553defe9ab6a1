"""The write-ahead log: round trip, torn tails cut off, corruption named, truncation, bounds,
and every acknowledged record back after a real ``kill -9`` of the writing process."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import zlib

import pytest

from graphrun.errors import StoreError
from graphrun.store.wal import FORMAT_VERSION, FRAME, HEADER, MAGIC, Record, WriteAheadLog


def payload(v: int, n: int = 100) -> bytes:
    return bytes((v + i) % 251 for i in range(n))


def written(path, versions, n=100):
    with WriteAheadLog(path) as wal:
        for v in versions:
            wal.append(v, payload(v, n))
        wal.sync()
    return path


def replayed(path) -> list[Record]:
    with WriteAheadLog(path) as wal:
        return list(wal.records())


def test_round_trip_in_file_order(tmp_path):
    path = written(tmp_path / "wal", [3, 1, 2, 7])
    recs = replayed(path)
    assert [r.version for r in recs] == [3, 1, 2, 7]
    assert all(r.data == payload(r.version) for r in recs)
    assert recs[0].offset == HEADER.size
    with WriteAheadLog(path) as wal:  # appends after a reopen follow the old records
        assert wal.count == 4
        wal.append(9, b"", sync=True)
    assert [(r.version, r.data) for r in replayed(path)][-2:] == [(7, payload(7)), (9, b"")]


def test_one_sync_writes_more_records_than_one_pwritev_takes(tmp_path):
    """A group of 700 records (1,400 buffers, past the 512 of one ``pwritev``) and empty
    payloads among them: written in order, every byte, with one ``fdatasync``."""
    versions = list(range(1, 701))
    with WriteAheadLog(tmp_path / "wal") as wal:
        for v in versions:
            wal.append(v, payload(v, v % 3 * 50))
        wal.sync()
        assert wal.syncs == 1 and wal.size == (tmp_path / "wal").stat().st_size
    recs = replayed(tmp_path / "wal")
    assert [(r.version, r.data) for r in recs] == [(v, payload(v, v % 3 * 50)) for v in versions]


def test_short_writes_are_resumed(tmp_path, monkeypatch):
    """``pwritev`` may write less than asked (a signal, a full disk's last blocks): the
    rest follows from where it stopped, mid-buffer too."""
    real = os.pwritev

    def short(fd, bufs, offset):
        first = bytes(bufs[0])[:37]  # at most 37 bytes, often mid-record
        return real(fd, [first], offset)

    monkeypatch.setattr(os, "pwritev", short)
    path = written(tmp_path / "wal", [4, 2, 9], n=100)
    monkeypatch.undo()
    assert [(r.version, r.data) for r in replayed(path)] == [(v, payload(v)) for v in (4, 2, 9)]


def test_unsynced_appends_are_not_on_disk(tmp_path):
    wal = WriteAheadLog(tmp_path / "wal")
    wal.append(1, b"a", sync=True)
    wal.append(2, b"b")
    assert os.path.getsize(tmp_path / "wal") == HEADER.size + FRAME.size + 9
    wal.close()  # close syncs
    assert [r.version for r in replayed(tmp_path / "wal")] == [1, 2]


@pytest.mark.parametrize("cut", [1, 5, FRAME.size, FRAME.size + 3, FRAME.size + 107])
def test_torn_tail_is_cut_off_and_logged(tmp_path, caplog, cut):
    path = written(tmp_path / "wal", [1, 2, 3])
    full = os.path.getsize(path)
    os.truncate(path, full - (FRAME.size + 108) + cut)  # the last record, cut bytes of it
    with caplog.at_level(logging.WARNING, "graphrun.store"):
        recs = replayed(path)
    assert [r.version for r in recs] == [1, 2]
    assert "cut off at offset" in caplog.text
    assert os.path.getsize(path) == full - (FRAME.size + 108)  # the file was cut there
    with WriteAheadLog(path) as wal:
        wal.append(4, payload(4), sync=True)
    assert [r.version for r in replayed(path)] == [1, 2, 4]


def test_corrupt_last_record_is_cut_off(tmp_path, caplog):
    path = written(tmp_path / "wal", [1, 2, 3])
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 0x40]))
    with caplog.at_level(logging.WARNING, "graphrun.store"):
        assert [r.version for r in replayed(path)] == [1, 2]
    assert "CRC does not match" in caplog.text


def test_zeros_after_the_last_record_are_a_torn_tail(tmp_path):
    path = written(tmp_path / "wal", [1, 2])
    with open(path, "ab") as f:
        f.write(bytes(4096))  # a file extended but never written
    assert [r.version for r in replayed(path)] == [1, 2]


def test_crc_flip_in_the_middle_names_file_and_offset(tmp_path):
    path = written(tmp_path / "wal", [1, 2, 3])
    second = HEADER.size + FRAME.size + 108
    with open(path, "r+b") as f:
        f.seek(second + FRAME.size + 20)
        byte = f.read(1)
        f.seek(second + FRAME.size + 20)
        f.write(bytes([byte[0] ^ 1]))
    before = path.read_bytes()
    with pytest.raises(StoreError, match=rf"{path}: corrupt at offset {second}: .*CRC"):
        WriteAheadLog(path)
    assert path.read_bytes() == before  # nothing cut from a damaged log


def test_bad_length_in_the_middle_is_corruption(tmp_path):
    path = written(tmp_path / "wal", [1, 2, 3])
    with open(path, "r+b") as f:
        f.seek(HEADER.size)
        f.write(FRAME.pack(3, 0))  # shorter than a version
    with pytest.raises(StoreError, match=rf"corrupt at offset {HEADER.size}: a record length of 3"):
        WriteAheadLog(path)


def test_header_and_format_version_checked(tmp_path):
    (tmp_path / "junk").write_bytes(b"not a log at all")
    with pytest.raises(StoreError, match="junk: not a graphrun write-ahead log"):
        WriteAheadLog(tmp_path / "junk")
    path = written(tmp_path / "wal", [1])
    data = bytearray(path.read_bytes())
    data[8:12] = (2).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="log format version 2; this graphrun reads 1"):
        WriteAheadLog(path)


def test_a_torn_header_is_a_new_log_and_a_closed_log_refuses(tmp_path):
    path = tmp_path / "wal"
    path.write_bytes(HEADER.pack(MAGIC, FORMAT_VERSION, 0)[:5])
    wal = WriteAheadLog(path)  # a crash while the header was written: begun again
    wal.append(1, b"x", sync=True)
    wal.close()
    assert [r.data for r in replayed(path)] == [b"x"]
    wal.append(2, b"y")
    with pytest.raises(StoreError, match="wal: the log is closed"):
        wal.sync()


def test_frame_is_length_crc_payload(tmp_path):
    path = written(tmp_path / "wal", [5], n=3)
    raw = path.read_bytes()[HEADER.size :]
    length, crc = FRAME.unpack_from(raw)
    body = raw[FRAME.size :]
    assert length == len(body) == 11 and crc == zlib.crc32(body)
    assert int.from_bytes(body[:8], "little") == 5 and body[8:] == payload(5, 3)


def test_truncate_before_drops_old_versions_atomically(tmp_path):
    path = tmp_path / "wal"
    with WriteAheadLog(path) as wal:
        for v in [1, 2, 5, 3, 6]:
            wal.append(v, payload(v))
        assert wal.truncate_before(4) == 3  # syncs the appended records first
        assert wal.count == 2
        wal.append(7, payload(7), sync=True)
        assert [r.version for r in wal.records()] == [5, 6, 7]
    assert [r.version for r in replayed(path)] == [5, 6, 7]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wal"]  # no temporary left
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_size_bounds(tmp_path):
    wal = WriteAheadLog(tmp_path / "wal", max_bytes=HEADER.size + 2 * (FRAME.size + 108))
    wal.append(1, payload(1))
    wal.append(2, payload(2), sync=True)
    with pytest.raises(StoreError, match=r"the log is full .*compact"):
        wal.append(3, payload(3))
    wal.truncate_before(2)
    wal.append(3, payload(3), sync=True)  # room again after compaction
    with pytest.raises(StoreError, match="a record of 1008 bytes is over the bound of 1000"):
        WriteAheadLog(tmp_path / "w2", max_record=1000).append(1, bytes(1000))
    wal.close()


def test_a_length_over_the_record_bound_is_not_allocated(tmp_path):
    path = written(tmp_path / "wal", [1, 2])
    with open(path, "r+b") as f:
        f.seek(HEADER.size)
        f.write(FRAME.pack(0xFFFFFFF0, 0))
    with pytest.raises(StoreError, match="a record length of 4294967280 bytes"):
        WriteAheadLog(path, max_record=1 << 20)


def test_group_commit_from_threads(tmp_path):
    wal = WriteAheadLog(tmp_path / "wal")

    def writer(base: int) -> None:
        for i in range(50):
            wal.append(base + i, payload(base + i, 17))
            if i % 10 == 9:
                wal.sync()

    threads = [threading.Thread(target=writer, args=(k * 1000,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wal.close()
    recs = replayed(tmp_path / "wal")
    assert sorted(r.version for r in recs) == sorted(
        k * 1000 + i for k in range(4) for i in range(50)
    )
    assert all(r.data == payload(r.version, 17) for r in recs)


CHILD = textwrap.dedent(
    """
    import sys
    from graphrun.store.wal import WriteAheadLog
    wal = WriteAheadLog(sys.argv[1])
    v = 0
    while True:
        for _ in range(4):  # a group of four, then one fsync
            v += 1
            wal.append(v, bytes([v % 251]) * (1000 + 37 * (v % 50)))
        wal.sync()
        print(v, flush=True)
    """
)


@pytest.mark.integration
def test_every_acknowledged_record_survives_kill_9(tmp_path):
    path = tmp_path / "wal"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        acked = [int(child.stdout.readline()) for _ in range(300)]
        os.kill(child.pid, signal.SIGKILL)  # mid-append: the child never stops writing
        rest, _ = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    acked += [int(line) for line in rest.split()]
    assert child.returncode == -signal.SIGKILL
    recs = replayed(path)
    versions = [r.version for r in recs]
    assert versions == list(range(1, len(versions) + 1))  # a prefix, in order
    assert len(versions) >= acked[-1]  # every acknowledged one, maybe a few more
    assert all(r.data == bytes([r.version % 251]) * (1000 + 37 * (r.version % 50)) for r in recs)
