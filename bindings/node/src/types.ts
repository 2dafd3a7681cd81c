/**
 * Types of the bridge protocol v1, written by hand after bindings/schema/v1 (the schemas are the
 * reference: the bridge validates every request against them).
 */

export type Provenance = "draft" | "recovered" | "bonus" | "local" | "generalist";
export type Mode = "collaborative" | "local";
export type FinishReason = "stop" | "length" | "cancelled";
export type RequestId = string | number;

export interface GenerateRequest {
  query: string | Record<string, string>;
  task?: string;
  preset?: "default" | "fast" | "strict";
  stop?: string[];
  offline?: string;
  before?: string | number;
  /** the user's draft so far: the output continues it; sent with the public request */
  prefix?: string;
  /** at least this long between two pieces (paces a fast model's stream for reading) */
  min_token_ms?: number;
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
}

export interface Piece {
  text: string;
  token: number;
  provenance: Provenance;
  round: number;
}

export interface GenerationStats {
  method: string;
  tokens: number;
  rounds: number;
  drafted: number;
  accepted: number;
  acceptance_rate: number;
  total_s: number;
  tokens_per_s: number;
  first_token_s: number | null;
  bytes_up: number;
  bytes_down: number;
  bytes_per_token: number;
  degraded: boolean;
  offline_reason: string | null;
  reconnects: number;
  records: string[];
  [more: string]: unknown;
}

export interface GenerateResult {
  text: string;
  provenance: Provenance[];
  finish_reason: FinishReason;
  stats: GenerationStats | null;
}

export interface ModeEvent {
  id: RequestId;
  mode: Mode;
  tokens: number;
  reason: string;
}

/** A frame to ("up") or from ("down") the companion, decoded: only with `--audit-frames`. */
export interface FrameEvent {
  n: number;
  generation: RequestId | null;
  direction: "up" | "down";
  type: string;
  bytes: number;
  fields: Record<string, unknown>;
  tokens: Record<string, { id: number; text: string | null }[]>;
}

export interface InitializeResult {
  protocol_version: number;
  package_version: string;
  specialist?: string;
  companion?: string | null;
  history?: string | null;
  http?: string | null;
  methods: string[];
  notifications: string[];
  capabilities: Record<string, unknown>;
}

export interface StatusResult {
  generating: RequestId | null;
  uptime_s: number;
  generations: number;
  companion?: string | null;
  last_mode?: Mode | null;
  history?: string | null;
  http?: string | null;
}

export interface HistoryRecord {
  id: string;
  kind: string;
  title: string;
  body: string;
  created_at: string | null;
  meta: Record<string, unknown>;
  source: string;
}

export interface NewRecord {
  kind: string;
  body: string;
  title?: string;
  created_at?: string | number | null;
  meta?: Record<string, unknown>;
  source?: string;
  id?: string;
}

export interface SearchOptions {
  k?: number;
  kinds?: string[];
  before?: string | number;
}

export interface ListOptions {
  kinds?: string[];
  before?: string | number;
  limit?: number;
  offset?: number;
}

export type ForgetOptions = { kinds?: string[]; before?: string | number } | { all: true };
