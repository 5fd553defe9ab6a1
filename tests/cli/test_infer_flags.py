"""``graphrun infer serve`` takes its ``--max-*`` flags from ``serving.protocol.Bounds``
(issue 41, item 8): the names, defaults, help and values the command spelled out before."""

from __future__ import annotations

import pytest

from graphrun.arguments import from_fields
from graphrun.cli import build_parser
from graphrun.serving.protocol import Bounds

FLAGS = ("--max-body-bytes", "--max-ids", "--max-neighbors", "--max-batch-ids", "--max-queue")


def test_the_bounds_flags_parse_to_the_values_they_did() -> None:
    parser = build_parser()
    args = parser.parse_args(["infer", "serve", "job.yaml"])
    got = (args.max_body_bytes, args.max_ids, args.max_neighbors, args.max_batch_ids,
           args.max_queue)  # fmt: skip
    assert got == (1 << 20, 1024, 1024, 4096, 256)
    assert from_fields(Bounds, args) == Bounds()
    given = [x for flag, v in zip(FLAGS, (512, 7, 8, 9, 10), strict=True) for x in (flag, str(v))]
    args = parser.parse_args(["infer", "serve", "job.yaml", *given])
    assert from_fields(Bounds, args) == Bounds(512, 7, 8, 9, 10)
    assert args.window_ms == 2.0 and args.port == 8080  # the flags beside them are unchanged


@pytest.mark.parametrize("flag", FLAGS)
def test_a_bounds_flag_takes_only_an_integer(flag: str) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["infer", "serve", "job.yaml", flag, "1.5"])


def test_the_bounds_flags_help_is_what_it_was(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["infer", "serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag in FLAGS:
        assert f"{flag} {flag[2:].upper().replace('-', '_')}" in text
    assert "--max-ids MAX_IDS node ids of one request --max-neighbors" in text
    assert "--max-queue MAX_QUEUE requests in flight (more: 503) --window-ms" in text
