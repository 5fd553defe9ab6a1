"""The write-ahead log: round trip, where a log written in place ends after a crash (torn
groups, stale records of an earlier generation), corruption named, the format-1 log
read and rewritten, extents, truncation, bounds, and every acknowledged record back
after real ``kill -9``s of the writing process."""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import zlib

import pytest

from graphrun.errors import StoreError
from graphrun.store.wal import (
    FORMAT_VERSION,
    MAGIC,
    RECORD,
    SLOT,
    SLOTS,
    START,
    Record,
    WriteAheadLog,
)
from graphrun.store.wal_v1 import FRAME_V1, HEADER_V1


def payload(v: int, n: int = 100) -> bytes:
    return bytes((v + i) % 251 for i in range(n))


def written(path, versions, n=100, **kw):
    with WriteAheadLog(path, **kw) as wal:
        for v in versions:
            wal.append(v, payload(v, n))
        wal.sync()
    return path


def replayed(path, **kw) -> list[Record]:
    with WriteAheadLog(path, **kw) as wal:
        return list(wal.records())


def versions(path, **kw) -> list[int]:
    return [r.version for r in replayed(path, **kw)]


def poke(path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_round_trip_in_file_order(tmp_path):
    path = written(tmp_path / "wal", [3, 1, 2, 7])
    recs = replayed(path)
    assert [r.version for r in recs] == [3, 1, 2, 7]
    assert all(r.data == payload(r.version) for r in recs)
    assert recs[0].offset == START
    with WriteAheadLog(path) as wal:  # appends after a reopen follow the old records
        assert wal.count == 4
        wal.append(9, b"", sync=True)
    assert [(r.version, r.data) for r in replayed(path)][-2:] == [(7, payload(7)), (9, b"")]


def test_syncs_overwrite_and_never_grow_the_file(tmp_path):
    """The point of the layout: a sync writes inside extents of zeros made before it."""
    path = tmp_path / "wal"
    with WriteAheadLog(path) as wal:
        size = path.stat().st_size
        assert size == 1 << 20 and path.read_bytes()[START:].count(0) == size - START
        for v in range(1, 51):
            wal.append(v, payload(v, 5000), sync=True)
            assert path.stat().st_size == size
        assert wal.syncs == 50 and wal.size == START + 50 * (RECORD.size + 5000)
    assert versions(path) == list(range(1, 51))


def test_one_sync_writes_more_records_than_one_pwritev_takes(tmp_path):
    """A group of 700 records (1,400 buffers, past the 512 of one ``pwritev``) and empty
    payloads among them: written in order, every byte, with one ``fdatasync``."""
    vs = list(range(1, 701))
    with WriteAheadLog(tmp_path / "wal") as wal:
        for v in vs:
            wal.append(v, payload(v, v % 3 * 50))
        wal.sync()
        assert wal.syncs == 1
    recs = replayed(tmp_path / "wal")
    assert [(r.version, r.data) for r in recs] == [(v, payload(v, v % 3 * 50)) for v in vs]


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
    shutil.copy(tmp_path / "wal", tmp_path / "copy")
    assert versions(tmp_path / "copy") == [1]
    wal.close()  # close syncs
    assert versions(tmp_path / "wal") == [1, 2]


def groups(path, *, extent=None):
    """Group 1 (versions 1, 2) synced, then group 2 (3, 4, 5, records of 5,000 bytes)
    synced: the slot its sync wrote says the synced end is group 1's. Returns the
    offsets of records 3, 4, 5 and the end."""
    kw = {"extent": extent} if extent else {}
    with WriteAheadLog(path, **kw) as wal:
        wal.append(1, payload(1, 5000))
        wal.append(2, payload(2, 5000), sync=True)
        at = [wal.size]
        for v in (3, 4, 5):
            wal.append(v, payload(v, 5000))
            at.append(wal.size)
        wal.sync()
    return at


@pytest.mark.parametrize(
    ("damage", "left"),
    [
        ("zeros over record 3's first page", [1, 2]),
        ("garbage over record 4", [1, 2, 3]),
        ("record 4's header only", [1, 2, 3]),
        ("record 5's last bytes", [1, 2, 3, 4]),
        ("nothing", [1, 2, 3, 4, 5]),
    ],
)
def test_a_torn_last_group_ends_the_log_and_is_overwritten(tmp_path, caplog, damage, left):
    """After a crash any subset of the last group's pages may be on disk: the log ends
    at the first record that does not check, with a warning, and the next records are
    written there; nothing of the torn group comes back later."""
    path = tmp_path / "wal"
    r3, r4, r5, end = groups(path)
    if damage.startswith("zeros"):
        poke(path, r3, bytes(4096))
    elif damage.startswith("garbage"):
        poke(path, r4, os.urandom(r5 - r4))
    elif damage.startswith("record 4's"):
        poke(path, r4 + RECORD.size, bytes(100))
    elif damage.startswith("record 5's"):
        poke(path, end - 10, b"\xff" * 10)
    with caplog.at_level(logging.WARNING, "graphrun.store"):
        assert versions(path) == left
    warned = damage not in ("nothing", "zeros over record 3's first page")  # zeros: quiet
    assert ("the log ends there" in caplog.text) == warned
    with WriteAheadLog(path) as wal:
        wal.append(9, payload(9, 10), sync=True)
    assert versions(path) == [*left, 9]
    assert versions(path) == [*left, 9]  # and again: nothing stale after 9 passes


def test_stale_records_of_an_earlier_generation_are_not_replayed(tmp_path):
    """Record 3 torn, 4 and 5 whole (a group's pages out of order); the next generation
    writes a record of record 3's size exactly where 3 was and is killed: 4 and 5 sit
    where the chain goes on, valid, numbered right, and are not replayed."""
    path = tmp_path / "wal"
    r3, r4, _, _ = groups(path)
    poke(path, r3 + RECORD.size + 7, b"\x00\x01")
    assert versions(path) == [1, 2]
    with WriteAheadLog(path) as wal:
        wal.append(6, payload(6, 5000), sync=True)  # record 3's size: it ends at r4
        assert wal.size == r4
    assert versions(path) == [1, 2, 6]
    with WriteAheadLog(path) as wal:
        wal.append(7, payload(7, 1), sync=True)
    assert versions(path) == [1, 2, 6, 7]


def test_a_record_out_of_its_place_ends_the_log(tmp_path):
    """A whole record of this generation where the chain goes on, but numbered for
    another place (record 2's bytes again after 3): the numbers end the log there."""
    path = written(tmp_path / "wal", [1, 2, 3])
    second, end = START + RECORD.size + 100, START + 3 * (RECORD.size + 100)
    raw = path.read_bytes()
    poke(path, end, raw[second : second + RECORD.size + 100])
    assert versions(path) == [1, 2, 3]


def test_a_record_planted_without_the_salt_ends_the_log(tmp_path):
    """A writer's own bytes left after the end can hold a record with the right place,
    number and generation, but not the CRC: the file's salt is not theirs to know."""
    path = written(tmp_path / "wal", [1, 2, 3])
    end = START + 3 * (RECORD.size + 100)
    gen = RECORD.unpack_from(path.read_bytes(), START)[2]
    rest = RECORD.pack(0, 5, gen, 3, 4)[4:]
    poke(path, end, RECORD.pack(zlib.crc32(b"evil!", zlib.crc32(rest)), 5, gen, 3, 4) + b"evil!")
    assert versions(path) == [1, 2, 3]


def test_damage_before_the_synced_end_names_file_and_offset(tmp_path):
    path = tmp_path / "wal"
    groups(path)
    second = START + RECORD.size + 5000
    poke(path, second + RECORD.size + 20, b"\xee")
    before = path.read_bytes()
    with pytest.raises(StoreError, match=rf"{path}: corrupt at offset {second}: .*CRC.*synced"):
        WriteAheadLog(path)
    assert path.read_bytes() == before  # nothing written over a damaged log
    poke(path, second, RECORD.pack(0, 0xFFFFFFF0, 2, 1, 2))
    with pytest.raises(StoreError, match=f"offset {second}: a record length of 4294967280 bytes"):
        WriteAheadLog(path, max_record=1 << 20)  # never allocated


def test_a_torn_slot_leaves_the_other(tmp_path):
    """Each sync writes the slots in turn; a torn one (its CRC fails) is passed over for
    the other, whose end is older and so still a safe bound."""
    path = tmp_path / "wal"
    groups(path)
    raw = path.read_bytes()
    slots = [SLOT.unpack_from(raw, at) for at in SLOTS]
    newer = max(range(2), key=lambda i: (slots[i][3], slots[i][4]))
    poke(path, SLOTS[newer] + 20, b"\x99")
    assert versions(path) == [1, 2, 3, 4, 5]


def test_a_group_across_an_extent_end(tmp_path):
    """Extents of 8 KiB: groups of 3,000-byte records cross extent ends; the file grows
    by whole extents of zeros before the records are written, and all replay."""
    path = tmp_path / "wal"
    with WriteAheadLog(path, extent=8192) as wal:
        assert path.stat().st_size == 8192
        for g in range(7):
            for v in range(3 * g + 1, 3 * g + 4):
                wal.append(v, payload(v, 3000))
            wal.sync()
            size = path.stat().st_size
            assert size % 8192 == 0 and wal.size <= size < wal.size + 8192
    assert versions(path, extent=8192) == list(range(1, 22))
    r = replayed(path, extent=8192)
    assert any(
        a.offset < k * 8192 < b.offset for a, b in itertools.pairwise(r) for k in range(2, 9)
    )


def test_a_crash_while_growing_leaves_the_log(tmp_path):
    """The file is longer than its extents (a grow not synced) with zeros or stale
    bytes: the log ends at the records and the file size is taken as it is."""
    path = written(tmp_path / "wal", [1, 2], extent=8192)
    with open(path, "ab") as f:
        f.write(bytes(5000))
    assert versions(path, extent=8192) == [1, 2]
    with WriteAheadLog(path, extent=8192) as wal:
        for v in range(3, 9):
            wal.append(v, payload(v, 3000), sync=True)
    assert versions(path) == list(range(1, 9))


def v1_log(path, vs, n=100) -> bytes:
    data = HEADER_V1.pack(MAGIC, 1, 0)
    for v in vs:
        body = v.to_bytes(8, "little") + payload(v, n)
        data += FRAME_V1.pack(len(body), zlib.crc32(body)) + body
    path.write_bytes(data)
    return data


def test_a_format_1_log_is_read_and_rewritten(tmp_path, caplog):
    path = tmp_path / "wal"
    v1_log(path, [3, 1, 2])
    with caplog.at_level(logging.INFO, "graphrun.store"), WriteAheadLog(path) as wal:
        assert [(r.version, r.data) for r in wal.records()] == [(v, payload(v)) for v in (3, 1, 2)]
        wal.append(4, payload(4), sync=True)
    assert "a log of format 1, rewritten in format 2 (3 records)" in caplog.text
    assert SLOT.unpack_from(path.read_bytes())[1] == FORMAT_VERSION
    assert versions(path) == [3, 1, 2, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wal"]
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_a_format_1_log_keeps_its_rules(tmp_path, caplog):
    """Its torn tail is cut as before; damage in its middle is refused, the file kept."""
    path = tmp_path / "wal"
    data = v1_log(path, [1, 2, 3])
    path.write_bytes(data[:-50])
    with caplog.at_level(logging.WARNING, "graphrun.store"):
        assert versions(path) == [1, 2]
    assert "cut off at offset" in caplog.text
    data = bytearray(v1_log(path, [1, 2, 3]))
    second = HEADER_V1.size + FRAME_V1.size + 108
    data[second + 30] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=rf"{path}: corrupt at offset {second}: .*CRC"):
        WriteAheadLog(path)
    assert path.read_bytes() == bytes(data)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wal"]


def test_header_and_format_version_checked(tmp_path):
    (tmp_path / "junk").write_bytes(b"not a log at all")
    with pytest.raises(StoreError, match="junk: not a graphrun write-ahead log"):
        WriteAheadLog(tmp_path / "junk")
    (tmp_path / "v3").write_bytes(HEADER_V1.pack(MAGIC, 3, 0) + bytes(100))
    with pytest.raises(StoreError, match="v3: log format version 3; this graphrun reads 2"):
        WriteAheadLog(tmp_path / "v3")
    path = written(tmp_path / "wal", [1])
    for at in SLOTS:  # both slots gone with a record after them: not a blank log
        poke(path, at, bytes(SLOT.size))
    with pytest.raises(StoreError, match="wal: not a graphrun write-ahead log"):
        WriteAheadLog(path)


@pytest.mark.parametrize("made", [b"", MAGIC[:5], MAGIC + bytes(4000), bytes(1 << 20)])
def test_a_log_whose_making_was_cut_is_begun_again(tmp_path, made):
    path = tmp_path / "wal"
    path.write_bytes(made)
    wal = WriteAheadLog(path)
    wal.append(1, b"x", sync=True)
    wal.close()
    assert [r.data for r in replayed(path)] == [b"x"]
    wal.append(2, b"y")
    with pytest.raises(StoreError, match="wal: the log is closed"):
        wal.sync()


def test_record_is_crc_length_generation_sequence_version(tmp_path):
    path = written(tmp_path / "wal", [5, 6], n=3)
    raw = path.read_bytes()
    crc, length, gen, seq, version = RECORD.unpack_from(raw, START)
    assert (length, seq, version) == (3, 0, 5) and gen >= 2
    assert raw[START + RECORD.size : START + RECORD.size + 3] == payload(5, 3)
    assert RECORD.unpack_from(raw, START + RECORD.size + 3)[2:] == (gen, 1, 6)
    salt = SLOT.unpack_from(raw)[5]
    seed = zlib.crc32(salt.to_bytes(8, "little"))
    rest = raw[START + 4 : START + RECORD.size]
    assert crc == zlib.crc32(payload(5, 3), zlib.crc32(rest, seed))


def test_truncate_before_drops_old_versions_atomically(tmp_path):
    path = tmp_path / "wal"
    with WriteAheadLog(path) as wal:
        for v in [1, 2, 5, 3, 6]:
            wal.append(v, payload(v))
        assert wal.truncate_before(4) == 3  # syncs the appended records first
        assert wal.count == 2
        wal.append(7, payload(7), sync=True)
        assert [r.version for r in wal.records()] == [5, 6, 7]
    assert versions(path) == [5, 6, 7]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wal"]  # no temporary left
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert path.stat().st_size == 1 << 20  # extents of zeros again


def test_size_bounds(tmp_path):
    wal = WriteAheadLog(tmp_path / "wal", max_bytes=START + 2 * (RECORD.size + 100))
    wal.append(1, payload(1))
    wal.append(2, payload(2), sync=True)
    with pytest.raises(StoreError, match=r"the log is full .*compact"):
        wal.append(3, payload(3))
    wal.truncate_before(2)
    wal.append(3, payload(3), sync=True)  # room again after compaction
    with pytest.raises(StoreError, match="a record of 1008 bytes is over the bound of 1000"):
        WriteAheadLog(tmp_path / "w2", max_record=1000).append(1, bytes(1000))
    wal.close()


def test_group_commit_from_threads(tmp_path):
    wal = WriteAheadLog(tmp_path / "wal", extent=8192)

    def writer(base: int) -> None:
        for i in range(50):
            wal.append(base + i, payload(base + i, 170))
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
    assert all(r.data == payload(r.version, 170) for r in recs)


CHILD = textwrap.dedent(
    """
    import sys
    from graphrun.store.wal import WriteAheadLog
    wal = WriteAheadLog(sys.argv[1], extent=16384)
    v = wal.count
    while True:
        for _ in range(4):  # a group of four, then one fsync
            v += 1
            wal.append(v, bytes([v % 251]) * (1000 + 37 * (v % 50)))
        wal.sync()
        print(v, flush=True)
    """
)


def killed(path, groups: int) -> list[int]:
    """Run the child until it acknowledged ``groups`` groups, ``kill -9`` it mid-append,
    return every version it acknowledged."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        acked = [int(child.stdout.readline()) for _ in range(groups)]
        os.kill(child.pid, signal.SIGKILL)  # mid-append: the child never stops writing
        rest, _ = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL
    return acked + [int(line) for line in rest.split()]


@pytest.mark.integration
def test_every_acknowledged_record_survives_kill_9(tmp_path):
    """Killed three times on one log (16 KiB extents: it grows under the writes): each
    restart writes a new generation over what the last kill left after its end."""
    path = tmp_path / "wal"
    for _ in range(3):
        acked = killed(path, 150)
        recs = replayed(path)
        vs = [r.version for r in recs]
        assert vs == list(range(1, len(vs) + 1))  # a prefix, in order
        assert len(vs) >= acked[-1]  # every acknowledged one, maybe a few more
        assert all(
            r.data == bytes([r.version % 251]) * (1000 + 37 * (r.version % 50)) for r in recs
        )
