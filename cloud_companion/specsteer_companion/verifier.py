"""Per-session verification on the companion: the Generalist and the generic Specialist.

The companion holds, per device session, one scoring session of the Generalist (P_G) and,
unless the device computes P_S0 itself, one of the context-free Specialist (P_S0, the very same
compiled artifact the device runs). A round appends the newly committed ids and the draft to
both in one pass each, decides acceptance and builds the candidates with `specsteer.steer` (the
only home of the method's rules), and keeps the accepted prefix. The passes run on an engine
behind the `scoring` seam: ONNX Runtime in-process (the default), or vLLM for the Generalist
(`vllm_engine`). It never sees, and has no way to receive, the private context. Mismatched
tokenizers go to `cross` (ONNX Runtime only: it reads whole rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from specsteer import steer
from specsteer.protocol import Mode, OpenSession
from specsteer.runtime.base import LanguageModel
from specsteer_companion.cross import CrossVerifierSession
from specsteer_companion.scoring import Scores, ScoringModel, ScoringSession, scoring


@dataclass(frozen=True)
class ScoredDraft:
    """A draft the Generalist has scored, waiting for its ratio test (`VerifierSession.decide`)."""

    seq: list[int]  # the committed ids, then the draft
    offset: int  # where the draft starts in `seq`
    g: Scores


@dataclass
class Verifier:
    """The companion's models. `specialist` may be None when devices send P_S0 themselves.

    Either may be a `specsteer.runtime` model (run on ONNX Runtime through a `Track`) or a
    `scoring.ScoringModel` engine (the Generalist on vLLM).
    """

    generalist: LanguageModel | ScoringModel
    specialist: LanguageModel | ScoringModel | None = None
    max_session_tokens: int = 4096
    g_scoring: ScoringModel = field(init=False, repr=False)
    s0_scoring: ScoringModel | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.g_scoring = scoring(self.generalist)
        self.s0_scoring = None if self.specialist is None else scoring(self.specialist)
        if self.cross and not self.g_scoring.whole_rows:
            raise ValueError(
                f"the Generalist {self.g_scoring.name} runs on an engine that returns top-k "
                "log-probabilities, not whole rows, and the Specialist's tokenizer differs from "
                "its own: verification across tokenizers re-expresses whole Generalist rows over "
                "the Specialist's tokens; serve this pair on the ONNX Runtime engine"
            )

    @property
    def cross(self) -> bool:
        """Whether the two models' tokenizers differ (the text path, `cross`)."""
        s = self.specialist
        return s is not None and s.tokenizer.vocab_hash != self.generalist.tokenizer.vocab_hash

    @property
    def max_top_k(self) -> int:
        """The most candidates a verdict can carry: what every hosted engine can return."""
        engines = [self.g_scoring, *([self.s0_scoring] if self.s0_scoring else [])]
        return min(engine.max_top_k for engine in engines)

    def check(self) -> None:
        """Run one token through every hosted model (a health check): raises if one is dead."""
        for engine in (self.g_scoring, self.s0_scoring):
            if engine is not None:
                session = engine.open([0, 0], max_length=8, temperature=1.0, owner="health")
                session.score([0], 0, 1)
                session.close()

    def open(
        self, request: OpenSession, committed: Sequence[int] = (), owner: str = ""
    ) -> VerifierSession | CrossVerifierSession:
        """A session on the token path, or on the text path when the tokenizers differ.

        `committed`: tokens the device generated before this session (a `Resume`): the
        session holds prompt and committed tokens as if it had verified them itself.
        `owner`: the device's identity (engines that share a prefix cache keep owners apart).
        """
        if self.cross:
            return CrossVerifierSession(self, request, committed=committed)
        return VerifierSession(self, request, committed, owner)


class VerifierSession:
    """One device's generation on the companion (the two models share a tokenizer)."""

    def __init__(self, verifier: Verifier, request: OpenSession,
                 committed: Sequence[int] = (), owner: str = "") -> None:
        self.request = request
        self.settings = settings = request.settings
        self.mode = Mode(settings.mode)
        prompt = [*request.prompt_ids, *committed]  # one prefill pass for both
        self.temperature = settings.temperature if settings.temperature > 0 else 1.0
        limit = verifier.max_session_tokens
        if settings.companion_s0 and verifier.specialist is None:
            raise ValueError(
                "this companion hosts no generic Specialist; send logp_S0 from the device"
            )
        if settings.select == "difference" and not verifier.g_scoring.whole_rows:
            raise ValueError(
                f"select='difference' ranks whole rows; the Generalist's engine "
                f"({verifier.g_scoring.name}) returns the top-k of logp_G only: use "
                "select='generalist'"
            )
        self.whole_rows = verifier.g_scoring.whole_rows
        self.g: ScoringSession = verifier.g_scoring.open(
            prompt, max_length=limit, temperature=self.temperature, owner=owner)
        self.s0: ScoringSession | None = None
        if settings.companion_s0 and verifier.s0_scoring is not None:
            try:
                self.s0 = verifier.s0_scoring.open(
                    prompt, max_length=limit, temperature=self.temperature, owner=owner)
            except BaseException:
                self.g.close()
                raise
        self.rng = np.random.default_rng(settings.seed) if settings.temperature > 0 else None

    def opening_candidates(self) -> steer.SparseSteer | None:
        """The first position's candidates, as a first-round verdict that rejects its first
        draft carries them (SessionOpened sends them, in the sessions
        `protocol.takes_opening_candidates` names, so that a greedy device holding P_S0
        settles its first token as the opening ends); None where they cost a pass (an engine
        that returns top-k lists scores only with the draft)."""
        settings = self.settings
        if not self.whole_rows:
            return None
        scores = self.g.score([], 0, settings.top_k)  # the row the prefill left: no pass
        self.g.keep(0)
        ids, lg = scores.top(0, settings.top_k)
        return steer.steer_top(ids, lg, None, settings.alpha, settings.top_p)

    def verify(
        self,
        committed: Sequence[int],
        draft: Sequence[int],
        logp_s0_draft: Sequence[float] | None = None,
    ) -> steer.RoundVerdict:
        """One Draft–Verify–Recover round (or a classic speculative round in SPECULATIVE mode)."""
        return self.decide(self.score(committed, draft), logp_s0_draft)

    def score(self, committed: Sequence[int], draft: Sequence[int]) -> ScoredDraft:
        """A round's first half: the Generalist's pass over the committed ids and the draft
        (run while the device computes P_S0's values, when it sends them)."""
        seq = [*committed, *draft]
        top_k = 1 if self.mode is Mode.SPECULATIVE else self.settings.top_k
        return ScoredDraft(seq, len(committed), self.g.score(seq, len(committed), top_k))

    def decide(self, scored: ScoredDraft, logp_s0_draft: Sequence[float] | None = None
               ) -> steer.RoundVerdict:
        """A round's second half: the ratio test (P_S0 hosted here, or `logp_s0_draft` from
        the device), the candidates after the accepted prefix, and the kept prefix."""
        g, seq, offset = scored.g, scored.seq, scored.offset
        n = len(seq) - offset  # drafted ids
        if self.mode is Mode.SPECULATIVE:
            best = [int(g.top(offset + j, 1)[0][0]) for j in range(n + 1)]
            accepted, token = steer.classic_accept_best(seq[offset:], best)
            self._keep(offset + accepted, s0=False)
            return steer.RoundVerdict(accepted, steer.SparseSteer([token], [0.0]))
        lg_draft = g.taken()
        s0 = self.s0.score(seq, offset, 0) if self.s0 is not None else None
        if s0 is not None:
            ls0_draft = s0.taken() if n else lg_draft
        else:
            ls0_draft = np.asarray(logp_s0_draft, np.float32)
        accepted = steer.ratio_accept_count(lg_draft, ls0_draft, self.settings.gamma, self.rng)
        at = offset + accepted
        if self.settings.select == "difference" and s0 is not None:
            candidates = steer.sparse_steer(g.whole(at), s0.whole(at), self.settings.alpha,
                                            self.settings.top_k, "difference", self.settings.top_p)
        else:
            ids, lg = g.top(at, self.settings.top_k)
            candidates = steer.steer_top(ids, lg, None if s0 is None else s0.at(at, ids),
                                         self.settings.alpha, self.settings.top_p)
        self._keep(at, s0=s0 is not None)
        return steer.RoundVerdict(accepted, candidates)

    def row(self, committed: Sequence[int]) -> steer.RoundVerdict:
        """ROWS mode: top-k of logp_G for the next position, with logp_S0 at the same ids."""
        n = len(committed)
        ids, lg = self.g.score(committed, n, self.settings.top_k).top(n, self.settings.top_k)
        candidates = steer.steer_top(ids, lg, None, 0.0, self.settings.top_p)
        if self.s0 is not None:
            s0_values = self.s0.score(committed, n, 0).at(n, candidates.ids).astype(np.float16)
        else:
            s0_values = np.zeros(len(candidates.ids), np.float16)
        self._keep(n, s0=self.s0 is not None)
        return steer.RoundVerdict(0, candidates, s0_values)

    def _keep(self, advance: int, *, s0: bool) -> None:
        """Hold the tokens before and the `advance` new ones; everything after is dropped."""
        self.g.keep(advance)
        if s0 and self.s0 is not None:
            self.s0.keep(advance)

    def close(self) -> None:
        self.g.close()
        if self.s0 is not None:
            self.s0.close()
