"""Draft length K chosen each round from measured acceptance and measured round times.

Why: on a CPU the companion's verification pass grows with every drafted token (~40 % of a
decode step each), so the best K depends on how often drafts are accepted: a weak drafter
accepted 70 % of the time is best served by K = 2, a strong one at 97 % by K = 5-6; a fixed
K = 4 leaves throughput on the table at both ends. On a GPU companion the pass is nearly flat
in K and the same rule picks long drafts.

Model (all inputs measured by the device, nothing asked of the companion):
  * acceptance p: per-token, from accepted / (accepted + rejections), exponentially forgotten;
  * a round of K drafts yields E[tokens] = (1 - p^(K+1)) / (1 - p) (the accepted run plus the
    recovered or bonus token);
  * waiting for a verdict on n sent tokens costs a + b*n seconds (companion passes plus the
    network), fitted by least squares on the observed (n, latency) pairs with a weak prior;
  * drafting costs d seconds per token on the device; with pipelining the next draft is hidden
    behind the verification when the bet (all K accepted, bonus = own argmax) wins, which
    happens with probability ~ p^K * q (q: the measured share of won bets among full accepts).
K maximizes E[tokens] / E[seconds per round]; every `probe_every`-th round drafts K+2 or K-2 so
the cost slope is measured, not assumed. Pure: no clock, no I/O; the caller feeds it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PRIOR_WEIGHT = 3.0  # the prior counts as this many rounds
PRIOR_PER_TOKEN = 0.3  # prior b/a: between a CPU companion (~0.5) and a GPU one (~0)


@dataclass
class DraftLength:
    """Adaptive K in [k_min, k_max], starting at `k`."""

    k: int = 4
    k_min: int = 1
    k_max: int = 8
    pipelined: bool = True  # the device drafts the next round during the verification
    forget: float = 0.95  # per-round decay of old observations: the text's difficulty drifts
    probe_every: int = 5  # every n-th round drafts K +- 2: without varied K the slope is a guess
    rounds: int = 0
    accepted: float = 0.0
    rejected: float = 0.0
    full_rounds: float = 0.0  # rounds whose drafts were all accepted
    bets_won: float = 0.0
    draft_step_s: float | None = None
    _fit: list[float] = field(default_factory=lambda: [0.0] * 5)  # sums: w, n, t, nn, nt

    def __post_init__(self) -> None:
        if not 1 <= self.k_min <= self.k <= self.k_max:
            raise ValueError(f"need 1 <= k_min <= k <= k_max, got {self.k_min}, {self.k}, "
                             f"{self.k_max}")

    @property
    def acceptance(self) -> float:
        """Per-token acceptance estimate (Beta(1, 1) prior)."""
        return (self.accepted + 1.0) / (self.accepted + self.rejected + 2.0)

    def observe(
        self,
        drafted: int,
        accepted: int,
        sent: int,
        latency_s: float | None,
        draft_step_s: float | None = None,
        bet_won: bool | None = None,
    ) -> int:
        """Record one round; return the K to draft next."""
        decay = self.forget
        self.accepted = self.accepted * decay + accepted
        self.rejected = self.rejected * decay + (1.0 if accepted < drafted else 0.0)
        if drafted and accepted == drafted and bet_won is not None:
            self.full_rounds = self.full_rounds * decay + 1.0
            self.bets_won = self.bets_won * decay + (1.0 if bet_won else 0.0)
        if draft_step_s is not None:
            previous = self.draft_step_s
            self.draft_step_s = draft_step_s if previous is None else (
                decay * previous + (1 - decay) * draft_step_s
            )
        if latency_s is not None and sent > 0:
            w, n, t, nn, nt = (x * decay for x in self._fit)
            self._fit = [w + 1, n + sent, t + latency_s, nn + sent * sent, nt + sent * latency_s]
        if self._fit[0] >= 1.0:
            self.k = self.best_k()
        self.rounds += 1
        if self.probe_every and self.rounds % self.probe_every == 0:
            up = (self.rounds // self.probe_every) % 2 == 1
            probe = self.k + 2 if up and self.k + 2 <= self.k_max else self.k - 2
            if self.k_min <= probe <= self.k_max:
                return probe
        return self.k

    def verify_cost(self) -> tuple[float, float]:
        """(a, b): seconds to wait for a verdict on n tokens is a + b*n."""
        w, n, t, nn, nt = self._fit
        mean_n, mean_t = n / w, t / w
        # Ridge towards the prior shape b = PRIOR_PER_TOKEN * a, anchored at the mean observation.
        prior_b = PRIOR_PER_TOKEN * mean_t / (1.0 + PRIOR_PER_TOKEN * mean_n)
        var = nn - w * mean_n * mean_n
        cov = nt - w * mean_n * mean_t
        b = (cov + PRIOR_WEIGHT * prior_b) / (var + PRIOR_WEIGHT)
        b = max(b, 0.0)
        a = max(mean_t - b * mean_n, 0.0)
        return a, b

    def best_k(self) -> int:
        """The K with the most expected tokens per second under the current estimates."""
        p = min(self.acceptance, 0.999)
        a, b = self.verify_cost()
        d = self.draft_step_s or 0.0
        q = (self.bets_won + 1.0) / (self.full_rounds + 2.0) if self.pipelined else 0.0
        best, best_rate = self.k, -1.0
        for k in range(self.k_min, self.k_max + 1):
            tokens = (1.0 - p ** (k + 1)) / (1.0 - p)
            hidden = p**k * q  # share of rounds whose draft ran during the previous wait
            seconds = a + b * (k + 1) + (1.0 - hidden) * d * k
            rate = tokens / seconds if seconds > 0 else float(k)
            if rate > best_rate * (1 + 1e-9):
                best, best_rate = k, rate
        return best
