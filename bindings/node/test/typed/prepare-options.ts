// Compiled (never run) by test/types.test.mjs against src/: prepare takes generate's decoding
// options with their types, and the compiler refuses what the bridge would refuse. Each line
// marked as an expected error must be one, or the compilation fails (an unused directive).
import type { DecodingOptions, SpecSteerClient } from "../../src/index.js";

declare const client: SpecSteerClient;
const request = { query: "Budget for the next quarter", task: "email" };
// one object of options for both calls: what prepare makes ahead is what generate then uses
const options: DecodingOptions = { preset: "fast", method: "slm_rag", max_new_tokens: 64,
  temperature: 0, gamma: 0.1, alpha: 1, k: 4, adaptive_k: false, top_k: 32, top_p: 0.9,
  seed: 7, no_repeat_ngram: 8, leak_guard: "redact" };
void client.prepare({ ...request, ...options, open_session: false });
// each option written out, so that the compiler checks it against prepare's params
void client.prepare({ ...request, preset: "fast", method: "slm_rag", max_new_tokens: 64,
  temperature: 0, gamma: 0.1, alpha: 1, k: 4, adaptive_k: false, top_k: 32, top_p: 0.9,
  seed: 7, no_repeat_ngram: 8, leak_guard: "redact", open_session: false });
void client.complete({ ...request, ...options, stop: ["\n"], offline: "fail", min_token_ms: 20 });

// @ts-expect-error a misspelt option
void client.prepare({ ...request, temprature: 0.5 });
// @ts-expect-error presets are named
void client.prepare({ ...request, preset: "turbo" });
// @ts-expect-error options have their types
void client.prepare({ ...request, max_new_tokens: "many" });
// @ts-expect-error stop, offline and min_token_ms are generate's own (they shape a stream)
void client.prepare({ ...request, stop: ["\n"] });
// @ts-expect-error open_session is prepare's own
void client.complete({ ...request, open_session: false });
// @ts-expect-error the options hold no request
const notOptions: DecodingOptions = { query: "Budget" };
void notOptions;
