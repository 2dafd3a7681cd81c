/**
 * The client's names for the bridge protocol v1 types. Every type is derived from
 * ./generated/protocol.ts, which is generated from bindings/schema/v1 (the schemas the bridge
 * validates against), so a schema change reaches these types or fails `npm test`.
 */
import type {
  CompanionFrameParams,
  GenerateModeParams,
  GeneratePieceParams,
  HistoryAddParams,
  HistoryForgetParams,
  HistoryListParams,
  HistorySearchParams,
  Methods,
} from "./generated/protocol.js";

export type {
  DecodingOptions,
  FinishReason,
  GenerateParams as GenerateRequest,
  GenerateResult,
  GenerationRequest,
  GenerationStats,
  HistoryRecord,
  HistoryStatsResult,
  InitializeResult,
  Methods,
  Mode,
  Notifications,
  PrepareParams,
  PrepareResult,
  Provenance,
  RequestId,
  StatusResult,
} from "./generated/protocol.js";

/** One streamed piece of a generation (a `generate.piece` notification without its id). */
export type Piece = Omit<GeneratePieceParams, "id">;
/** A switch between collaborative and local decoding (`generate.mode`). */
export type ModeEvent = GenerateModeParams;
/** A frame to ("up") or from ("down") the companion, decoded: only with `--audit-frames`. */
export type FrameEvent = CompanionFrameParams;
export type NewRecord = HistoryAddParams;
export type SearchOptions = Omit<HistorySearchParams, "query">;
export type ListOptions = HistoryListParams;
export type ForgetOptions = HistoryForgetParams;

export type MethodName = keyof Methods;
export type ParamsOf<M extends MethodName> = Methods[M]["params"];
export type ResultOf<M extends MethodName> = Methods[M]["result"];
