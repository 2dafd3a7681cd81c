/**
 * Types of the SpecSteer bridge protocol v1, generated from bindings/schema/v1 by
 * scripts/generate-types.mjs (json-schema-to-typescript). Do not edit: change the schema and run
 * `npm run generate`; test/types.test.mjs fails while this file and the schemas differ.
 */

/**
 * the JSON-RPC id of a generate request
 */
export type RequestId = string | number;
export type GenerateParams = GenerationRequest &
  DecodingOptions & {
    /**
     * @maxItems 16
     */
    stop?: string[];
    /**
     * 'degrade', 'fail' or 'wait(SECONDS)'
     */
    offline?: string;
    /**
     * at least this long between two pieces: paces a fast model's stream for reading (the decoding waits, so a reconnect can land mid-text)
     */
    min_token_ms?: number;
  };
/**
 * ISO-8601 date/time or a year
 */
export type TimeLike = string | number;
export type Provenance = "draft" | "recovered" | "bonus" | "local" | "generalist";
export type FinishReason = "stop" | "length" | "cancelled";
export type HistoryForgetParams =
  | {
      /**
       * @minItems 1
       */
      kinds?: string[];
      before?: TimeLike;
    }
  | {
      all: true;
    };
export type PrepareParams = GenerationRequest &
  DecodingOptions & {
    /**
     * also open the companion session over the public request now (default true: the first round then needs no hello and no companion prefill); false: nothing leaves the device until generate (preparing while the user types text not yet offered for help)
     */
    open_session?: boolean;
    /**
     * answer once the prefill (and the session opening) is done, waiting at most this many seconds; ready in the result says whether it was (default 0: answer at once). An app shows "ready" on it
     */
    wait_s?: number;
  };
export type Mode = "collaborative" | "local";
/**
 * the failure's stable name, one per code (`codes`)
 */
export type ErrorReason =
  | "parse_error"
  | "invalid_request"
  | "method_not_found"
  | "invalid_params"
  | "internal_error"
  | "line_too_long"
  | "busy"
  | "unknown_task"
  | "invalid_query"
  | "prompt_too_long"
  | "history_locked"
  | "history_error"
  | "record_not_found"
  | "invalid_record"
  | "no_history"
  | "history_corrupt"
  | "companion_unavailable"
  | "companion_error"
  | "model_error"
  | "generation_failed";

export interface BridgeProtocol {
  methods: Methods;
  notifications: Notifications;
  error: ErrorData;
  common?: {
    record?: HistoryRecord;
    provenance?: Provenance;
    stats?: GenerationStats;
    request_id?: RequestId;
    time_like?: TimeLike;
    mode?: Mode;
    finish_reason?: FinishReason;
    request?: GenerationRequest;
    decoding_options?: DecodingOptions;
  };
}
/**
 * Every method: its params and result.
 */
export interface Methods {
  cancel: {
    params: CancelParams;
    result: CancelResult;
  };
  generate: {
    params: GenerateParams;
    result: GenerateResult;
  };
  "history.add": {
    params: HistoryAddParams;
    result: HistoryAddResult;
  };
  "history.delete": {
    params: HistoryDeleteParams;
    result: HistoryDeleteResult;
  };
  "history.forget": {
    params: HistoryForgetParams;
    result: HistoryForgetResult;
  };
  "history.list": {
    params: HistoryListParams;
    result: HistoryListResult;
  };
  "history.search": {
    params: HistorySearchParams;
    result: HistorySearchResult;
  };
  "history.stats": {
    params: HistoryStatsParams;
    result: HistoryStatsResult;
  };
  initialize: {
    params: InitializeParams;
    result: InitializeResult;
  };
  prepare: {
    params: PrepareParams;
    result: PrepareResult;
  };
  shutdown: {
    params: ShutdownParams;
    result: ShutdownResult;
  };
  status: {
    params: StatusParams;
    result: StatusResult;
  };
}
export interface CancelParams {
  id: RequestId;
}
export interface CancelResult {
  /**
   * false when no generation with this id was running
   */
  cancelled: boolean;
}
/**
 * What generate and prepare are asked: the request, its task, the history's horizon and the user's draft. A part of their params (allOf), which close the object with unevaluatedProperties.
 */
export interface GenerationRequest {
  /**
   * a plain string fills the task's first field
   */
  query:
    | string
    | {
        [k: string]: string;
      };
  task?: string;
  before?: TimeLike;
  /**
   * the user's draft so far: the output continues it (trailing spaces and tabs dropped). Part of the public request: the companion reads it to help continue it (the history stays on the device)
   */
  prefix?: string;
}
/**
 * The decoding options of generate; prepare takes them too, so that what it makes ahead (the first round's draft, the companion session) is what the generate with the same options uses. A part of their params (allOf), which close the object with unevaluatedProperties. Generated from the SDK's option registry (Params).
 */
export interface DecodingOptions {
  /**
   * a preset's settings, explicit options on top: default (gamma 0.5), fast (gamma 0.1, top_k 32), strict (gamma 1)
   */
  preset?: "default" | "fast" | "strict";
  /**
   * the decoding method: SpecSteer, or a baseline (slm / slm_rag: the Specialist alone without / with the history; llm: the Generalist alone; speculative: classic speculative decoding; light_costeer, costeer)
   */
  method?: "slm" | "slm_rag" | "llm" | "speculative" | "light_costeer" | "costeer" | "specsteer";
  /**
   * verification threshold of the ratio test P_G >= gamma * P_S0: 1 strict, 0.5 the default, 0.1 fast (more drafts accepted)
   */
  gamma?: number;
  /**
   * steering strength of the private term (the user's history) in the fusion
   */
  alpha?: number;
  /**
   * tokens drafted per round (the paper's K; the first K with adaptive_k)
   */
  k?: number;
  /**
   * candidates the companion sends for a recovered or bonus token (preset fast: 32, fewer bytes)
   */
  top_k?: number;
  /**
   * nucleus cut of the candidates: the fewest best ones holding this share of the Generalist's probability (fewer bytes; 1: all top_k)
   */
  top_p?: number;
  /**
   * 0: greedy; above 0: sample at this temperature (seeded by seed)
   */
  temperature?: number;
  /**
   * the most tokens written (the user's usual length for the task caps it further: Client's user_length)
   */
  max_new_tokens?: number;
  /**
   * before min_new_tokens an end-of-text still stands when the deciding model (the Specialist, which sees the user's texts; the Generalist for the LLM alone) gives it more than this probability, so a finished letter ends instead of growing filler (1: always held back)
   */
  end_release?: number;
  /**
   * ...but only from this share of min_new_tokens on: an end before it is held back whatever the model says (a text that short is a title or a one-liner; 0: anywhere below the minimum)
   */
  end_release_from?: number;
  /**
   * never repeat an n-gram of this length of the output itself (stops the verbatim loops of greedy small models; the prompt's n-grams stay free)
   */
  no_repeat_ngram?: number;
  /**
   * never write an n-gram of this length a third time (paraphrase loops; measured at 4 it ends them but the models respell words to get past it: docs/BENCHMARKS.md, "Sixth pass")
   */
  loop_ngram?: number;
  /**
   * end the text at the next sentence end once an n-gram of this length came a third time (nothing is banned, so nothing is respelled; stats.loop_ended; measured: -0.68 ROUGE-1 for SpecSteer at 6 on 20 senders, so off: "Seventh pass")
   */
  loop_end_ngram?: number;
  /**
   * phrases the text may not open with: meta answers ("I'm sorry, but I can't assist", "As an AI"; English: specsteer.meta_answers; an app writing in another language gives its own); empty: off
   *
   * @maxItems 64
   */
  meta_openings?: string[];
  /**
   * a chat assistant's openings ("I'm glad you found", "I hope this post finds you well", "Dear ["), banned too unless the user's own retrieved texts use them (decided on the device: Params.for_user); empty: off
   *
   * @maxItems 64
   */
  assistant_openings?: string[];
  /**
   * phrases the text may never contain, anywhere (the app's own; the token that would complete one is never chosen)
   *
   * @maxItems 64
   */
  banned_phrases?: string[];
  /**
   * the assistant's voice anywhere in the text ("As an AI", "feel free to ask", markdown bold, code fences), banned unless the user's retrieved texts use it (Params.for_user); empty: off
   *
   * @maxItems 64
   */
  assistant_phrases?: string[];
  /**
   * seed of the sampling (temperature > 0), on both sides
   */
  seed?: number;
  /**
   * choose K each round in 1..k_max from the measured acceptance, draft step and verdict latency (specsteer/draft_length.py; starts at k)
   */
  adaptive_k?: boolean;
  /**
   * what a draft that copies private history does: redact (the default: the copied word and the tokens after it are cut from the draft, and the pick at that place writes another word), hold (nothing of the copy, nor after it, is sent; the rest is written on the device alone), allow (sent, counted; warns PrivateDraftsWarning); the counts are in stats.leak_flagged / leak_redacted / leak_held (docs/companion-security.md; the default measured: docs/BENCHMARKS.md, "Leak guard", run 8)
   */
  leak_guard?: "allow" | "redact" | "hold";
}
export interface GenerateResult {
  text: string;
  provenance: Provenance[];
  finish_reason: FinishReason;
  stats: GenerationStats | null;
}
/**
 * What one generation cost, as the device measured it (generated from GenerationStats).
 */
export interface GenerationStats {
  /**
   * rounds: collaborative rounds, or tokens decided one at a time
   */
  rounds: number;
  /**
   * tokens the Specialist drafted and sent for verification
   */
  drafted: number;
  /**
   * drafted tokens the companion accepted
   */
  accepted: number;
  /**
   * tokens written (an end-of-text is not counted)
   */
  tokens: number;
  /**
   * seconds the device spent prefilling its private prompt
   */
  prefill_s: number;
  /**
   * seconds of device compute after the prefill (drafts, fusion)
   */
  device_s: number;
  /**
   * seconds from the start of decoding to the first token (None: no token)
   */
  first_token_s: number | null;
  /**
   * the companion was lost and the device went on alone
   */
  degraded: boolean;
  /**
   * why the generation went local, when it did
   */
  offline_reason: string | null;
  /**
   * times collaboration resumed after the companion came back
   */
  reconnects: number;
  /**
   * dropped links replaced at once by a session resumed on a fresh one (no local token in between)
   */
  resyncs: number;
  /**
   * rounds drafted while the previous round was being verified
   */
  pipelined: number;
  /**
   * the caller's cancel event stopped the generation
   */
  cancelled: boolean;
  /**
   * loop_end_ngram ended a looping text at a sentence end
   */
  loop_ended: boolean;
  /**
   * Generalist tokens written during a warm start, before the switch to Draft-Verify-Recover
   */
  warm_tokens: number;
  /**
   * seconds from the start until Draft-Verify-Recover took over from a warm start (None: no warm start)
   */
  switch_s: number | null;
  /**
   * seconds from the start until the companion held the session (hello, its prefill of the public prompt; a cold start's private prefill runs beside them)
   */
  session_ready_s: number | null;
  /**
   * the companion session prepare opened ahead was used as it was (prepared with the generate's decoding options)
   */
  session_reused: boolean;
  /**
   * tokens of the first round's draft prepare made after its prefill (greedy drafting with the generate's draft settings)
   */
  drafted_ahead: number;
  /**
   * tokens of the first round's draft a cold start made after its prefill while the companion was still opening the session (the same greedy draft the round makes)
   */
  drafted_beside_opening: number;
  /**
   * drafts accepted in each round, in order
   */
  accept_lengths: number[];
  /**
   * private spans the leak guard found in what was about to leave
   */
  leak_flagged: number;
  /**
   * drafted tokens the leak guard cut or picks it turned away (leak_guard redact)
   */
  leak_redacted: number;
  /**
   * tokens written on the device alone after the leak guard held (leak_guard hold)
   */
  leak_held: number;
  /**
   * bytes sent to the companion (frames as they travel)
   */
  bytes_up: number;
  /**
   * bytes received from the companion
   */
  bytes_down: number;
  /**
   * frames sent to the companion
   */
  frames_up: number;
  /**
   * frames received from the companion
   */
  frames_down: number;
  /**
   * seconds waited for the companion: its compute and the network, as measured on the device
   */
  wait_s: number;
  /**
   * replies waited for from the companion (hello, session, rounds)
   */
  requests: number;
  /**
   * the decoding method
   */
  method: string;
  /**
   * seconds spent retrieving the history records
   */
  retrieval_s: number;
  /**
   * seconds from the request to the last token
   */
  total_s: number;
  /**
   * private prompt tokens whose state prepare or an earlier generation had already computed (exact rewind)
   */
  prefill_reused: number;
  /**
   * private prompt tokens this generation prefilled itself
   */
  prefill_tokens: number;
  /**
   * tokens of the prompt the Specialist read (the private one; the public one for the SLM baseline): the OpenAI usage.prompt_tokens
   */
  prompt_tokens: number;
  /**
   * ids of the history records in the private prompt
   */
  records: string[];
  /**
   * ids of the records cut to fit the prompt budget
   */
  truncated: string[];
  /**
   * accepted / drafted tokens (0 with no draft)
   */
  acceptance_rate: number;
  /**
   * tokens / total_s
   */
  tokens_per_s: number;
  /**
   * (bytes_up + bytes_down) / tokens
   */
  bytes_per_token: number;
}
export interface HistoryAddParams {
  kind: string;
  title?: string;
  body: string;
  created_at?: TimeLike | null;
  meta?: {
    [k: string]: unknown;
  };
  source?: string;
  id?: string;
}
export interface HistoryAddResult {
  record: HistoryRecord;
}
export interface HistoryRecord {
  id: string;
  kind: string;
  title: string;
  body: string;
  created_at: string | null;
  meta: {
    [k: string]: unknown;
  };
  source: string;
}
export interface HistoryDeleteParams {
  /**
   * @minItems 1
   * @maxItems 10000
   */
  ids: string[];
}
export interface HistoryDeleteResult {
  deleted: string[];
}
export interface HistoryForgetResult {
  deleted: number;
}
export interface HistoryListParams {
  /**
   * @minItems 1
   */
  kinds?: string[];
  before?: TimeLike;
  limit?: number;
  offset?: number;
}
export interface HistoryListResult {
  records: HistoryRecord[];
}
export interface HistorySearchParams {
  query: string;
  k?: number;
  /**
   * @minItems 1
   */
  kinds?: string[];
  before?: TimeLike;
}
export interface HistorySearchResult {
  hits: {
    score: number;
    record: HistoryRecord;
  }[];
}
export interface HistoryStatsParams {}
export interface HistoryStatsResult {
  path: string;
  records: number;
  kinds: {
    [k: string]: number;
  };
  oldest?: string | null;
  newest?: string | null;
  file_bytes?: number;
  wal_bytes?: number;
  journal_mode?: string;
  schema_version?: number;
  lock_retries?: number;
  [k: string]: unknown;
}
export interface InitializeParams {
  /**
   * the protocol version the client speaks
   */
  protocol_version?: number;
  client?: {
    name?: string;
    version?: string;
  };
}
export interface InitializeResult {
  protocol_version: 1;
  package_version: string;
  specialist?: string;
  companion?: string | null;
  history?: string | null;
  methods: string[];
  notifications: string[];
  capabilities: {
    cancel?: boolean;
    concurrent_generate?: "refuse";
    max_line_bytes?: number;
    tasks?: string[];
    presets?: string[];
    offline?: string[];
    [k: string]: unknown;
  };
  /**
   * base URL of the OpenAI-compatible endpoint (--http), or null
   */
  http?: string | null;
}
export interface PrepareResult {
  task: string;
  prefilling: true;
  /**
   * the prefill (and the session opening) was done when this answer was sent
   */
  ready: boolean;
}
export interface ShutdownParams {}
export interface ShutdownResult {}
export interface StatusParams {}
export interface StatusResult {
  generating: string | number | null;
  uptime_s: number;
  /**
   * generate requests started since the bridge started
   */
  generations: number;
  /**
   * generations answered as cancelled: by cancel, or by an HTTP client that closed its connection
   */
  cancelled: number;
  companion?: string | null;
  last_mode?: Mode | null;
  history?: string | null;
  /**
   * base URL of the OpenAI-compatible endpoint (--http), or null
   */
  http?: string | null;
}
/**
 * Every notification (bridge to app): its params.
 */
export interface Notifications {
  "companion.frame": {
    params: CompanionFrameParams;
  };
  "generate.mode": {
    params: GenerateModeParams;
  };
  "generate.piece": {
    params: GeneratePieceParams;
  };
  "generate.stats": {
    params: GenerateStatsParams;
  };
}
export interface CompanionFrameParams {
  n: number;
  generation: RequestId | null;
  direction: "up" | "down";
  type: string;
  bytes: number;
  fields: {
    [k: string]: unknown;
  };
  tokens: {
    [k: string]: {
      id: number;
      text: string | null;
    }[];
  };
  /**
   * the request, drafted and committed tokens (prompt_ids, draft_ids, committed_ids) decoded whole: the text that left
   */
  texts: {
    [k: string]: string;
  };
}
export interface GenerateModeParams {
  id: RequestId;
  mode: Mode;
  tokens: number;
  reason: string;
}
export interface GeneratePieceParams {
  id: RequestId;
  text: string;
  token: number;
  provenance: Provenance;
  round: number;
}
export interface GenerateStatsParams {
  id: RequestId;
  stats: GenerationStats;
}
export interface ErrorData {
  reason: ErrorReason;
  [k: string]: unknown;
}
