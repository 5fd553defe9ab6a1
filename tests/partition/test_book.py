"""Property tests of the PartitionBook against a brute-force reference."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphrun.errors import ArgumentError, PartitionFormatError
from graphrun.partition.book import PartitionBook, check_ids


@st.composite
def layouts(draw: st.DrawFn) -> tuple[int, int, list[list[int]], int, list[list[int]]]:
    parts = draw(st.integers(1, 5))
    ntypes = draw(st.integers(1, 4))
    etypes = draw(st.integers(1, 3))
    cell = st.integers(0, 6)
    ncounts = draw(
        st.lists(st.lists(cell, min_size=parts, max_size=parts), min_size=ntypes, max_size=ntypes)
    )
    ecounts = draw(
        st.lists(st.lists(cell, min_size=parts, max_size=parts), min_size=etypes, max_size=etypes)
    )
    return parts, ntypes, ncounts, etypes, ecounts


def make_book(parts: int, ncounts: list[list[int]], ecounts: list[list[int]]) -> PartitionBook:
    nc, ec = np.array(ncounts), np.array(ecounts)
    zero = np.zeros((1,), dtype=np.int64)

    def ranges(c: np.ndarray) -> np.ndarray:
        return np.concatenate([np.zeros((len(c), 1), np.int64), np.cumsum(c, axis=1)], axis=1)

    ntypes = [f"n{i}" for i in range(len(ncounts))]
    return PartitionBook(
        num_parts=parts,
        node_types=tuple(ntypes),
        edge_types=tuple((ntypes[0], f"r{i}", ntypes[-1]) for i in range(len(ecounts))),
        node_offsets=np.concatenate([zero, np.cumsum(nc.sum(axis=0))]),
        edge_offsets=np.concatenate([zero, np.cumsum(ec.sum(axis=0))]),
        node_ranges_all=ranges(nc),
        edge_ranges_all=ranges(ec),
    )


def reference(counts: list[list[int]]) -> list[tuple[int, int, int, int]]:
    """Brute force: (homo id, part, type, per-type id) by walking parts, then types."""
    out = []
    h = 0
    per_type_next = [0] * len(counts)
    for p in range(len(counts[0])):
        for t in range(len(counts)):
            for _ in range(counts[t][p]):
                out.append((h, p, t, per_type_next[t]))
                h += 1
                per_type_next[t] += 1
    return out


@settings(max_examples=150, deadline=None)
@given(layouts())
def test_node_lookups_match_reference(layout) -> None:  # type: ignore[no-untyped-def]
    parts, _, ncounts, _, ecounts = layout
    book = make_book(parts, ncounts, ecounts)
    ref = reference(ncounts)
    if not ref:
        return
    homo = np.array([r[0] for r in ref])
    part = np.array([r[1] for r in ref])
    typ = np.array([r[2] for r in ref])
    per = np.array([r[3] for r in ref])
    assert book.nid2part(homo).tolist() == part.tolist()
    assert book.nid2local(homo).tolist() == (homo - book.node_offsets[part]).tolist()
    t_out, per_out = book.to_per_type(homo)
    assert t_out.dtype == np.int32 and per_out.dtype == np.int64
    assert t_out.tolist() == typ.tolist() and per_out.tolist() == per.tolist()
    for t, name in enumerate(book.node_types):
        sel = typ == t
        if not sel.any():
            continue
        assert book.to_homo(name, per[sel]).tolist() == homo[sel].tolist()
        assert book.nid2part(per[sel], name).tolist() == part[sel].tolist()
        local = per[sel] - book.node_ranges(name)[part[sel]]
        assert book.nid2local(per[sel], name).tolist() == local.tolist()
        # per-type local rows are 0..n-1 inside each part
        for p in range(parts):
            rows = book.nid2local(per[sel][part[sel] == p], name)
            assert rows.tolist() == list(range(len(rows)))


@settings(max_examples=100, deadline=None)
@given(layouts())
def test_edge_lookups_match_reference(layout) -> None:  # type: ignore[no-untyped-def]
    parts, _, ncounts, _, ecounts = layout
    book = make_book(parts, ncounts, ecounts)
    ref = reference(ecounts)
    if not ref:
        return
    homo, part, typ, per = (np.array(c) for c in zip(*ref, strict=True))
    assert book.eid2part(homo).tolist() == part.tolist()
    t_out, per_out = book.eid_to_per_type(homo)
    assert t_out.tolist() == typ.tolist() and per_out.tolist() == per.tolist()
    for r, et in enumerate(book.edge_types):
        sel = typ == r
        if sel.any():
            assert book.etype_to_homo(et, per[sel]).tolist() == homo[sel].tolist()
            assert book.eid2part(per[sel], et).tolist() == part[sel].tolist()
            key = ":".join(et)
            assert (
                book.eid2local(per[sel], key).tolist()
                == (per[sel] - book.edge_ranges(et)[part[sel]]).tolist()
            )


@settings(max_examples=50, deadline=None)
@given(layouts())
def test_config_round_trip(layout) -> None:  # type: ignore[no-untyped-def]
    parts, _, ncounts, _, ecounts = layout
    book = make_book(parts, ncounts, ecounts)
    cfg = json.loads(json.dumps(book.to_config()))
    again = PartitionBook.from_config(cfg)
    assert again.to_config() == book.to_config()
    for p in range(parts):
        assert again.owned_nodes(p) == book.owned_nodes(p)
        for t in book.node_types:
            assert again.owned_nodes(p, t) == book.owned_nodes(p, t)


def test_out_of_range_names_argument_and_index() -> None:
    book = make_book(2, [[2, 3]], [[1, 1]])
    with pytest.raises(ArgumentError, match=r"ids\[2\] = 5 is out of range \[0, 5\)"):
        book.nid2part(np.array([0, 4, 5, -1]))
    with pytest.raises(ArgumentError, match=r"per_type_ids\[0\] = -1"):
        book.to_homo("n0", [-1])
    with pytest.raises(ArgumentError, match="unknown node type"):
        book.nid2part([0], "nope")
    with pytest.raises(ArgumentError, match="integer"):
        book.nid2part(np.array([0.5]))
    with pytest.raises(ArgumentError, match="part"):
        book.owned_nodes(2)


def test_scalar_and_empty_inputs() -> None:
    book = make_book(2, [[2, 3]], [[1, 1]])
    assert int(book.nid2part(4)) == 1
    assert book.nid2part(np.array([], dtype=np.int64)).shape == (0,)
    assert book.nid2part([]).shape == (0,)


def test_relation_name_selects_unique_edge_type() -> None:
    book = make_book(1, [[1], [1]], [[1], [2]])
    assert book.etype_id("r1") == 1
    assert book.num_edges_of(("n0", "r1", "n1")) == 2


def test_a_relation_two_edge_types_share_is_ambiguous() -> None:
    book = make_book(1, [[1], [1]], [[1], [2]])
    shared = replace(book, edge_types=(("n0", "r", "n1"), ("n1", "r", "n1")))
    with pytest.raises(ArgumentError, match="relation 'r' is ambiguous"):
        shared.etype_id("r")


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("num_parts", "2", "num_parts"),
        ("node_offsets", [0, 3, 4], r"node_offsets.*end|disagrees"),
        ("node_offsets", [0, 6, 5], "node_offsets' decreases"),
        ("node_ranges", {}, r"node_ranges\.n0' is missing"),
        ("edge_types", [["a", "b"]], "edge_types"),
        ("edge_offsets", [0, 1], "edge_offsets"),
    ],
)
def test_bad_config_names_field(field: str, value: object, match: str) -> None:
    cfg = make_book(2, [[2, 3]], [[1, 1]]).to_config()
    cfg[field] = value
    with pytest.raises(PartitionFormatError, match=match) as info:
        PartitionBook.from_config(cfg, source="x/partition.json")
    assert str(info.value).startswith("x/partition.json: ")


def test_check_ids_names_the_first_bad_id_and_the_space() -> None:
    assert check_ids(np.array([[0, 2], [1, 0]], np.int32), "ids", 3).dtype == np.int64
    assert check_ids([], "ids", 0).dtype == np.int64
    with pytest.raises(ArgumentError, match=r"ids\[2\] = 5 is out of range \[0, 3\) of paper"):
        check_ids([0, 1, 5, 7], "ids", 3, "paper")
    with pytest.raises(ArgumentError, match="expected integer ids, got dtype float64"):
        check_ids([0.5], "ids", 3)
