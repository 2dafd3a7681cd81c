"""describe_frame: what a privacy panel shows of a frame (fields, token texts, token hidden)."""

from __future__ import annotations

import json

from specsteer import protocol


def test_draft_is_described_with_its_token_texts() -> None:
    frame = protocol.encode(protocol.Draft(round=3, committed_ids=(7,), draft_ids=(5, 9)))
    seen = protocol.describe_frame("up", frame, lambda i: f"<{i}>")
    assert seen["type"] == "Draft" and seen["bytes"] == len(frame) and seen["direction"] == "up"
    assert seen["fields"]["round"] == 3
    assert seen["tokens"] == {"committed_ids": [{"id": 7, "text": "<7>"}],
                              "draft_ids": [{"id": 5, "text": "<5>"}, {"id": 9, "text": "<9>"}]}
    assert seen["texts"] == {}  # no `text_of` given
    json.dumps(seen)  # JSON-friendly all the way down


def test_the_text_that_left_is_decoded_whole_and_candidates_are_not() -> None:
    """`texts`: each run of the text's ids (request, drafted, committed) decoded in one call,
    so a character split over tokens reads whole; a verdict's candidate ids are no text."""
    calls: list[list[int]] = []

    def decode(ids: list[int]) -> str:
        calls.append(ids)
        return "".join(chr(0x61 + i) for i in ids)

    opened = protocol.encode(protocol.OpenSession((1, 2, 3), protocol.SessionSettings()))
    assert protocol.describe_frame("up", opened, text_of=decode)["texts"] == {"prompt_ids": "bcd"}
    resume = protocol.encode(protocol.Resume((0, 1), (4, 5), protocol.SessionSettings(), 2))
    assert protocol.describe_frame("up", resume, text_of=decode)["texts"] == {
        "prompt_ids": "ab", "committed_ids": "ef"}
    assert calls == [[1, 2, 3], [0, 1], [4, 5]]
    verdict = protocol.Verdict(round=1, accepted=1, ids=(3, 4), values=(-0.1, -0.2))
    assert protocol.describe_frame("down", protocol.encode(verdict), text_of=decode)["texts"] \
        == {}


def test_hello_never_repeats_the_device_token() -> None:
    frame = protocol.encode(protocol.Hello("g" * 64, "s" * 64, auth_token="sekret-token-42"))
    seen = protocol.describe_frame("up", frame)
    assert "sekret" not in json.dumps(seen)
    assert seen["fields"]["auth_token"] == "(15 characters, not shown)"


def test_a_frame_that_does_not_decode_is_described_not_raised() -> None:
    seen = protocol.describe_frame("down", b"\x02\xff garbage")
    assert seen["type"] == "undecodable" and seen["bytes"] == 10 and seen["fields"]["error"]
