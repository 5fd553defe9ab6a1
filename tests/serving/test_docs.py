"""docs/serving.md's curl example, sent as written to a real endpoint."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from .conftest import TOKEN, Served

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


def test_the_curl_example_works_as_written(served: Served) -> None:
    text = (ROOT / "docs" / "serving.md").read_text()
    block = next(b for b in re.findall(r"```sh\n(.*?)```", text, re.S) if b.startswith("curl"))
    argv = shlex.split(block.replace("\\\n", " "))
    assert argv[:4] == ["curl", "-s", "-X", "POST"]
    url, headers = argv[4], dict(h.split(": ", 1) for h in argv[argv.index("-H") + 1 :: 2][:1])
    body = argv[argv.index("-d") + 1]
    path = url.removeprefix("http://127.0.0.1:8080")
    with served.client() as c:  # the docs' "with --token-file" header
        r = c.post(path, content=body, headers=headers)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["model_name"] == "small" and got["parameters"] == {"mode": "sampled", "seed": 0}
    logits, predictions = got["outputs"]
    assert logits["shape"] == [2, 4] and predictions["shape"] == [2]
    assert json.loads(body)["inputs"][0]["data"] == [1, 5]
    assert TOKEN not in text
