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
 * The decoding options of generate; prepare takes them too, so that what it makes ahead (the first round's draft, the companion session) is what the generate with the same options uses. A part of their params (allOf), which close the object with unevaluatedProperties.
 */
export interface DecodingOptions {
  preset?: "default" | "fast" | "strict";
  method?: "specsteer" | "slm" | "slm_rag" | "llm" | "speculative" | "light_costeer" | "costeer";
  max_new_tokens?: number;
  temperature?: number;
  gamma?: number;
  alpha?: number;
  k?: number;
  adaptive_k?: boolean;
  top_k?: number;
  top_p?: number;
  seed?: number;
  /**
   * never repeat an n-gram of this length in the output (a device-only rule that stops greedy decoding from looping); default 8 (the SDK's), 0 is off, otherwise at least 2
   */
  no_repeat_ngram?: number;
  /**
   * never write an n-gram of this length a third time (paraphrase loops; a device-only rule); 0 (the default) is off, otherwise at least 2; measured at 4 it ends loops but models respell words to get past it (docs/BENCHMARKS.md)
   */
  loop_ngram?: number;
  /**
   * end the text at the first sentence end after an n-gram of this length came a third time (paraphrase loops; a device-only rule that bans nothing, so nothing is respelled); 0 (the default) is off, otherwise at least 2; stats.loop_ended says when it did
   */
  loop_end_ngram?: number;
  /**
   * what a draft that copies private history verbatim does: allow (sent, counted; the default), redact (cut from the draft), hold (the rest is written on the device alone); the counts are in stats.leak_flagged / leak_redacted / leak_held
   */
  leak_guard?: "allow" | "redact" | "hold";
  /**
   * before the user's minimum length an end-of-text still stands when the deciding model gives it more than this probability (default 0.5; 1: always held back, the text is padded to the minimum)
   */
  end_release?: number;
  /**
   * phrases the text may not open with (meta answers such as "I'm sorry, but I can't …"); default: the SDK's English list (specsteer.meta_answers); [] turns the rule off; give your own for another language
   *
   * @maxItems 64
   */
  meta_openings?: string[];
  /**
   * phrases of an assistant's voice the text may not open with unless the user's own retrieved texts use them ("I'm glad you found …", "I hope this post finds you well"); decided on the device; default: the SDK's English list (specsteer.meta_answers.ASSISTANT_OPENINGS); [] turns the rule off
   *
   * @maxItems 64
   */
  assistant_openings?: string[];
  /**
   * phrases the text may not contain anywhere (the token that would complete one is never chosen); default: none
   *
   * @maxItems 64
   */
  banned_phrases?: string[];
  /**
   * phrases of an assistant's voice the text may not contain anywhere unless the user's own retrieved texts use them ("As an AI", "feel free to ask", "**" for markdown bold); decided on the device; default: the SDK's English list (specsteer.meta_answers.ASSISTANT_PHRASES); [] turns the rule off
   *
   * @maxItems 64
   */
  assistant_phrases?: string[];
}
export interface GenerateResult {
  text: string;
  provenance: Provenance[];
  finish_reason: FinishReason;
  stats: GenerationStats | null;
}
export interface GenerationStats {
  method: string;
  tokens: number;
  rounds: number;
  drafted?: number;
  accepted?: number;
  acceptance_rate?: number;
  total_s?: number;
  tokens_per_s?: number;
  first_token_s?: number | null;
  retrieval_s?: number;
  prefill_s?: number;
  device_s?: number;
  wait_s?: number;
  bytes_up: number;
  bytes_down: number;
  bytes_per_token?: number;
  degraded: boolean;
  offline_reason?: string | null;
  reconnects?: number;
  pipelined?: number;
  records?: string[];
  truncated?: string[];
  prefill_reused?: number;
  prefill_tokens?: number;
  /**
   * tokens of the prompt the Specialist read (the private prompt; the public one for the slm method): the OpenAI endpoint's usage.prompt_tokens
   */
  prompt_tokens?: number;
  warm_tokens?: number;
  /**
   * the companion session prepare opened ahead was used as it was (prepared with the generate's decoding options)
   */
  session_reused?: boolean;
  /**
   * tokens of the first round's draft prepare made after its prefill (greedy drafting with the generate's draft settings)
   */
  drafted_ahead?: number;
  switch_s?: number | null;
  /**
   * seconds from the start until the companion held the session (hello, its prefill of the public prompt); a cold start's private prefill runs beside it
   */
  session_ready_s?: number | null;
  cancelled?: boolean;
  /**
   * loop_end_ngram ended a looping text at a sentence end
   */
  loop_ended?: boolean;
  /**
   * private spans the leak guard found in what was about to leave
   */
  leak_flagged?: number;
  /**
   * drafted tokens the leak guard cut (leak_guard redact)
   */
  leak_redacted?: number;
  /**
   * tokens written on the device alone after the leak guard held (leak_guard hold)
   */
  leak_held?: number;
  [k: string]: unknown;
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
