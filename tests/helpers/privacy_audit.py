"""What the companion could read: uplink frames decoded to id lists, audited for a canary.

A canary leaks if any id list that goes up (prompt, committed, drafted ids) holds one of its
tokenizations as a contiguous run, or if the bytes those ids spell contain it. Tokenizations:
the canary alone, after a space, and every run of tokens covering it inside surrounding text
(a merge at the boundary can change the first and last token), plus the runs strictly inside
it (what survives any boundary merge).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from helpers.ci import skip_or_fail  # noqa: F401 - privacy tests never skip silently in CI
from specsteer import protocol, steer
from specsteer.tokenizer import Tokenizer
from specsteer_companion.cross import alignment as al

_BEFORE = ["", " ", "\n", "x", "Dear team, ", "(", ".", ": ", "\n\n", "-", "'"]
_AFTER = ["", ".", " ", "\n", ",", "x", ")", "!", " and"]


def canary_tokenizations(
    tok: Tokenizer, canary: str, *, inner_min: int = 3
) -> set[tuple[int, ...]]:
    """Every token run that can spell `canary` (or its inside) in context."""
    table = al.token_table(tok)
    runs = {tuple(tok.encode(canary)), tuple(tok.encode(" " + canary))}
    for before in _BEFORE:
        for after in _AFTER:
            ids = tok.encode(before + canary + after)
            ends = al.ends_of(table, ids).tolist()
            start, stop = len(before.encode()), len((before + canary).encode())
            starts = [0, *ends[:-1]]
            covering = [i for i, (s, e) in enumerate(zip(starts, ends, strict=True))
                        if e > start and s < stop]
            runs.add(tuple(ids[covering[0] : covering[-1] + 1]))
            inside = [i for i in covering if starts[i] >= start and ends[i] <= stop]
            if len(inside) >= inner_min:
                runs.add(tuple(ids[inside[0] : inside[-1] + 1]))
    return runs


def uplink(frames: list[tuple[str, bytes]]) -> list[protocol.Message]:
    """The device's messages, decoded."""
    return [protocol.decode(f, protocol.Limits()) for d, f in frames if d == "up"]


def uplink_id_lists(frames: list[tuple[str, bytes]]) -> list[list[int]]:
    """Every id list that went up, and the stream of committed + drafted ids joined (a span
    can straddle two messages)."""
    lists, stream = [], []
    for msg in uplink(frames):
        if isinstance(msg, protocol.OpenSession):
            lists.append(list(msg.prompt_ids))
        elif isinstance(msg, protocol.Draft):
            lists += [list(msg.committed_ids), list(msg.draft_ids)]
            stream += [*msg.committed_ids, *msg.draft_ids]
        elif isinstance(msg, protocol.Resume):  # a resync carries the text committed so far
            lists += [list(msg.prompt_ids), list(msg.committed_ids)]
            stream += list(msg.committed_ids)
        elif isinstance(msg, protocol.RowRequest):
            lists.append(list(msg.committed_ids))
            stream += list(msg.committed_ids)
    return [*lists, stream]


def contains(haystack: list[int], needle: tuple[int, ...] | list[int]) -> bool:
    n = len(needle)
    return n > 0 and any(tuple(haystack[i : i + n]) == tuple(needle)
                         for i in range(len(haystack) - n + 1))


def assert_canary_not_sent(tok: Tokenizer, frames: list[tuple[str, bytes]], canary: str) -> None:
    """No uplink id list holds a tokenization of `canary`, and no bytes they spell (what a
    companion with another tokenizer aligns them to) contain it; nor does any raw frame."""
    assert any(d == "up" for d, _ in frames), "no frame went up"
    assert all(canary.encode() not in f for _, f in frames)
    runs = canary_tokenizations(tok, canary)
    table = al.token_table(tok)
    for ids in uplink_id_lists(frames):
        leaked = [run for run in runs if contains(ids, run)]
        assert not leaked, f"canary tokenization {leaked[0]} went up"
        assert canary.encode() not in table.bytes_of(ids), "the ids sent up spell the canary"


def private_windows(private_ids: list[int], public_ids: list[int], n: int) -> set[tuple[int, ...]]:
    """Windows of `n` ids in the private prompt that the public one lacks (written here apart
    from the leak guard's own, so a test does not trust the code under test)."""
    def windows(ids: list[int]) -> set[tuple[int, ...]]:
        return {tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)}
    return windows(list(private_ids)) - windows(list(public_ids))


def copied_ids_sent(frames: list[tuple[str, bytes]], private: set[tuple[int, ...]]) -> int:
    """Ids that went up (committed, drafted, or re-sent in a Resume) completing one of the
    `private` windows after the output the companion holds: per session, the committed ids
    and the accepted drafts (from the Verdicts that came down)."""
    n = len(next(iter(private))) if private else 0
    verdicts = iter(protocol.decode(f, protocol.Limits()) for d, f in frames if d == "down")
    held: list[int] = []
    copied = 0

    def send(ids: list[int]) -> int:
        run = [*held[max(0, len(held) - (n - 1)) :], *ids]
        lead = len(run) - len(ids)
        return sum(tuple(run[lead + j + 1 - n : lead + j + 1]) in private
                   for j in range(len(ids)) if lead + j + 1 >= n)

    for msg in uplink(frames):
        if isinstance(msg, protocol.OpenSession):
            held = []
        elif isinstance(msg, protocol.Resume):
            held = []
            copied += send(list(msg.committed_ids))
            held = list(msg.committed_ids)
        elif isinstance(msg, protocol.Draft | protocol.RowRequest):
            copied += send(list(msg.committed_ids))
            held += list(msg.committed_ids)
            if isinstance(msg, protocol.Draft):
                copied += send(list(msg.draft_ids))
                verdict = next(v for v in verdicts if isinstance(v, protocol.Verdict))
                held += list(msg.draft_ids[: verdict.accepted])
    return copied


def text_sent(tok: Tokenizer, frames: list[tuple[str, bytes]]) -> str:
    """What the committed and drafted ids that went up spell, joined (as a companion that
    decodes everything it receives would read it)."""
    return tok.decode(uplink_id_lists(frames)[-1])


UPLINK_KINDS = (protocol.Hello, protocol.OpenSession, protocol.Resume, protocol.Draft,
                protocol.DraftS0, protocol.RowRequest, protocol.Close)


def public_uplink(model, frames: list[tuple[str, bytes]], temperature: float,  # type: ignore[no-untyped-def]
                  output: list[int]) -> list[tuple]:
    """Every uplink frame with the ids taken out, after checking that what is left of each is a
    function of public data and the output: the list two runs over different histories must
    share byte for byte. Hello, OpenSession and Close are kept whole; a Resume keeps its
    public prompt and settings, and its committed ids must be the output written so far; a
    Draft's round must count the session's rounds, its committed ids must be output tokens,
    and its `logp_s0` must be P_S0 of its ids after the public text the companion holds,
    recomputed here; a RowRequest commits output tokens. A frame of any other kind, or one
    that does not re-encode to itself (bytes a decoder would skip), fails."""
    public: list[tuple] = []
    held: list[int] = []  # the public text the companion holds
    written: list[int] = []  # the output the companion was given, in order
    round_, pending = 0, None
    for direction, frame in frames:
        message = protocol.decode(frame, protocol.Limits())
        if direction == "down":
            if isinstance(message, protocol.Verdict) and pending is not None:
                held += pending.draft_ids[: message.accepted]
                written += pending.draft_ids[: message.accepted]
                round_, pending = round_ + 1, None
            continue
        assert isinstance(message, UPLINK_KINDS), f"a new uplink message: audit {message}"
        assert protocol.encode(message) == frame, f"{type(message).__name__} is not canonical"
        if isinstance(message, protocol.Hello | protocol.OpenSession | protocol.Close):
            public.append((type(message).__name__, frame))
        if isinstance(message, protocol.OpenSession):
            held, round_, pending = list(message.prompt_ids), 0, None
        elif isinstance(message, protocol.Resume):
            assert list(message.committed_ids[: len(written)]) == written
            written = list(message.committed_ids)
            held = list(message.held_ids)
            round_, pending = message.round, None
            public.append(("Resume", protocol.encode(protocol.Resume(
                message.prompt_ids, (), message.settings))))
        elif isinstance(message, protocol.Draft):
            assert message.round == round_, (message.round, round_)
            held += message.committed_ids
            written += message.committed_ids
            pending = message
        elif isinstance(message, protocol.DraftS0):
            assert pending is not None and message.round == pending.round, "a stray DraftS0"
            check_logp_s0(model, held, pending.draft_ids, message.logp_s0, temperature)
        elif isinstance(message, protocol.RowRequest):
            held += message.committed_ids
            written += message.committed_ids
    assert written == output[: len(written)], "committed ids that are not the output went up"
    return public


def check_logp_s0(model, held: list[int], draft_ids: Sequence[int],  # type: ignore[no-untyped-def]
                  logp_s0: Sequence[float], temperature: float) -> int:
    """`logp_s0` is P_S0 of `draft_ids` after the public text `held`, recomputed in a fresh
    session (a device computing it over the private prompt fails); the values checked."""
    assert len(logp_s0) == len(draft_ids)
    if not draft_ids:
        return 0
    session = model.new_session()
    rows = session.append([*held, *draft_ids])
    session.close()
    logp = steer.log_softmax(rows, temperature)
    expected = [logp[len(held) - 1 + j, t] for j, t in enumerate(draft_ids)]
    np.testing.assert_allclose(logp_s0, expected, rtol=2e-3, atol=2e-2)
    return len(expected)
