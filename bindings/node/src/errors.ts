/** Errors of the client: what the bridge answered, and what happened to the bridge process. */

/** A JSON-RPC error object from the bridge (`code` is stable; docs/bindings.md lists them). */
export class BridgeError extends Error {
  readonly code: number;
  readonly data: { reason: string; [key: string]: unknown };

  constructor(code: number, message: string, data?: { reason: string; [key: string]: unknown }) {
    super(message);
    this.name = "BridgeError";
    this.code = code;
    this.data = data ?? { reason: "unknown" };
  }
}

/** The bridge could not start: no Python, no specsteer package, a model that does not load... */
export class BridgeStartError extends Error {
  readonly stderr: string;

  constructor(message: string, stderr: string) {
    super(stderr ? `${message}\n--- bridge stderr ---\n${stderr}` : message);
    this.name = "BridgeStartError";
    this.stderr = stderr;
  }
}

/** The bridge process exited or was killed; every call pending at that moment gets this. */
export class BridgeExitedError extends Error {
  readonly exitCode: number | null;
  readonly signal: string | null;
  readonly stderr: string;

  constructor(exitCode: number | null, signal: string | null, stderr: string) {
    const how = signal ? `killed by ${signal}` : `exited with code ${exitCode}`;
    super(`the specsteer bridge ${how}` + (stderr ? `\n--- bridge stderr ---\n${stderr}` : ""));
    this.name = "BridgeExitedError";
    this.exitCode = exitCode;
    this.signal = signal;
    this.stderr = stderr;
  }
}

/** The application codes of protocol v1 (JSON-RPC's own codes included): bindings/schema/v1/
 * error.json's `codes` (test/client.test.mjs checks they are the same). */
export const ErrorCodes = {
  PARSE_ERROR: -32700,
  INVALID_REQUEST: -32600,
  METHOD_NOT_FOUND: -32601,
  INVALID_PARAMS: -32602,
  INTERNAL_ERROR: -32603,
  LINE_TOO_LONG: -32001,
  BUSY: -32020,
  UNKNOWN_TASK: -32030,
  INVALID_QUERY: -32031,
  PROMPT_TOO_LONG: -32032,
  HISTORY_LOCKED: -32040,
  HISTORY_ERROR: -32041,
  RECORD_NOT_FOUND: -32042,
  INVALID_RECORD: -32043,
  NO_HISTORY: -32044,
  HISTORY_CORRUPT: -32045,
  COMPANION_UNAVAILABLE: -32050,
  COMPANION_ERROR: -32051,
  MODEL_ERROR: -32060,
  GENERATION_FAILED: -32061,
} as const;
