"""What a generation yields and counts: `TokenEvent`, `DecodeStats`, and its two prompts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specsteer.options import stat


@dataclass(frozen=True)
class TokenEvent:
    """One emitted token and where it came from.

    provenance: "draft" (Specialist draft accepted by the companion), "recovered" (chosen after a
    reject by fusing the companion's sparse vector with the private term), "bonus" (same fusion
    after a fully accepted draft), "generalist" (baselines steered by the Generalist's row every
    token), "local" (the Specialist alone: local methods or offline-degraded mode).
    """

    token: int
    provenance: str
    round: int


@dataclass
class DecodeStats:
    """What the decoding loop counts of one generation; timings in seconds. Each field says
    what it is (`options.stat`): the bridge's stats schema is generated from these."""

    rounds: int = stat(0, "rounds: collaborative rounds, or tokens decided one at a time")
    drafted: int = stat(0, "tokens the Specialist drafted and sent for verification")
    accepted: int = stat(0, "drafted tokens the companion accepted")
    tokens: int = stat(0, "tokens written (an end-of-text is not counted)")
    prefill_s: float = stat(0.0, "seconds the device spent prefilling its private prompt")
    device_s: float = stat(0.0, "seconds of device compute after the prefill (drafts, fusion)")
    first_token_s: float | None = stat(
        None, "seconds from the start of decoding to the first token (None: no token)")
    degraded: bool = stat(False, "the companion was lost and the device went on alone")
    offline_reason: str | None = stat(None, "why the generation went local, when it did")
    reconnects: int = stat(0, "times collaboration resumed after the companion came back")
    resyncs: int = stat(
        0, "dropped links replaced at once by a session resumed on a fresh one (no local "
        "token in between)")
    pipelined: int = stat(0, "rounds drafted while the previous round was being verified")
    cancelled: bool = stat(False, "the caller's cancel event stopped the generation")
    loop_ended: bool = stat(False, "loop_end_ngram ended a looping text at a sentence end")
    warm_tokens: int = stat(0, "Generalist tokens written during a warm start, before the "
                               "switch to Draft-Verify-Recover")
    switch_s: float | None = stat(
        None, "seconds from the start until Draft-Verify-Recover took over from a warm start "
        "(None: no warm start)")
    session_ready_s: float | None = stat(
        None, "seconds from the start until the companion held the session (hello, its prefill "
        "of the public prompt; a cold start's private prefill runs beside them)")
    session_reused: bool = stat(
        False, "the companion session prepare opened ahead was used as it was (prepared with "
        "the generate's decoding options)")
    drafted_ahead: int = stat(
        0, "tokens of the first round's draft prepare made after its prefill (greedy "
        "drafting with the generate's draft settings)")
    drafted_beside_opening: int = stat(
        0, "tokens of the first round's draft a cold start made after its prefill while the "
        "companion was still opening the session (the same greedy draft the round makes)")
    accept_lengths: list[int] = stat(None, "drafts accepted in each round, in order",
                                     factory=list)
    leak_flagged: int = stat(0, "private spans the leak guard found in what was about to "
                                "leave")
    leak_redacted: int = stat(0, "drafted tokens the leak guard cut or picks it turned away "
                                 "(leak_guard redact)")
    leak_held: int = stat(0, "tokens written on the device alone after the leak guard held "
                             "(leak_guard hold)")

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens (0 with no draft)."""
        return self.accepted / self.drafted if self.drafted else 0.0


@dataclass(frozen=True)
class DevicePrompt:
    """The two views of one request: with the private context (device only) and without."""

    private_ids: Sequence[int]  # chat prompt with the retrieved history: P_Sc, never sent
    public_ids: Sequence[int]  # the same request without it: what the companion sees
