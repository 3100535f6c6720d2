"""The request body's one parse (gateway/inbound.py): its fast path answers exactly as json.loads,
documents and errors alike, so the 400 a client gets for a bad body says the same."""

from __future__ import annotations

import json

import pytest

from gateway.inbound import BadRequest, _loads, model_of

BODIES = [
    b'{"model": "m"}', b'{"model": "m"}  \r\n\t', b'{"model": "m"} \x0c', b'{"model": "m"} x', b'{"a":', b"{", b"{}",
    b'{"model": "\xff"}', b'{"model": "\xed\xa0\x80"}', b'{"model": "\\ud800"}', b"[1]", b' {"model": "m"}',
    b'\xef\xbb\xbf{"model": "m"}', '{"model": "m"}'.encode("utf-16-le"), '{"model": "m"}'.encode("utf-32"),
    b'{"n": NaN, "big": 123456789012345678901234567890, "f": 1e999}', b'{"model": "a", "model": "b"}',
    '{"model": "m"}\u00a0'.encode(), b"", b"{not json",
]


def _outcome(parse: object, body: bytes) -> str:
    try:
        return repr(parse(body))  # type: ignore[operator]
    except Exception as e:
        return f"{type(e).__name__}: {e}"


@pytest.mark.parametrize("body", BODIES)
def test_the_fast_parse_answers_as_json_loads(body: bytes) -> None:
    assert _outcome(_loads, body) == _outcome(json.loads, body)


def test_a_bad_body_gets_json_s_own_message() -> None:
    with pytest.raises(BadRequest) as e:
        model_of(b'{"model": "m",}')
    assert str(e.value) == "request body is not valid JSON: Expecting property name enclosed in double quotes: " \
        "line 1 column 15 (char 14)"
