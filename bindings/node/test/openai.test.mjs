// `specsteer bridge --http` driven by the official `openai` npm client (which nobody here wrote):
// a real bridge, started by SpecSteerClient with --http, and a real companion (tiny models).
import assert from "node:assert/strict";
import { statSync } from "node:fs";
import { after, before, test } from "node:test";

import OpenAI from "openai";

import { SpecSteerClient } from "../dist/index.js";
import { startHttpBridge } from "./helpers.mjs";

const MESSAGES = [{ role: "user", content: "Budget for the next quarter" }];
let served;
let companion;
let bridge;
let openai;

before(async () => {
  served = await startHttpBridge(SpecSteerClient);
  ({ companion, bridge } = served);
  assert.match(bridge.info.http, /^http:\/\/127\.0\.0\.1:\d+\/v1$/);
  assert.equal(statSync(served.tokenFile).mode & 0o077, 0); // created owner-only
  openai = new OpenAI({ baseURL: bridge.info.http, apiKey: served.token, maxRetries: 0 });
});
after(async () => { await served?.close(); });

/** The bridge's status once `done(status)`; fails after 30 s. */
async function statusOnce(done) {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const status = await bridge.status();
    if (done(status)) return status;
    assert.ok(Date.now() < deadline, `still ${JSON.stringify(status)}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

test("models, a completion and the same completion streamed, with provenance", async () => {
  const models = await openai.models.list();
  assert.deepEqual(models.data.map((m) => m.id), [bridge.info.specialist]);

  const done = await openai.chat.completions.create({ model: bridge.info.specialist,
    messages: MESSAGES, max_tokens: 24 });
  const { provenance, stats } = done.specsteer;
  assert.equal(provenance.length, done.usage.completion_tokens);
  assert.ok(provenance.every((p) => ["draft", "recovered", "bonus"].includes(p)), provenance);
  assert.equal(stats.degraded, false);
  assert.ok(["stop", "length"].includes(done.choices[0].finish_reason));

  const stream = await openai.chat.completions.create({ model: bridge.info.specialist,
    messages: MESSAGES, max_tokens: 24, stream: true });
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  const text = chunks.map((c) => c.choices[0].delta.content ?? "").join("");
  assert.equal(text, done.choices[0].message.content); // greedy: the same text, streamed
  const pieces = chunks.filter((c) => c.specsteer.provenance).map((c) => c.specsteer);
  // a chunk carries the token that completed its text (a character split over tokens waits)
  assert.ok(pieces.length > 0 && pieces.length <= provenance.length);
  assert.ok(pieces.every((p) => ["draft", "recovered", "bonus"].includes(p.provenance)));
  assert.ok(pieces.every((p) => Number.isInteger(p.token)));
  const last = chunks.at(-1);
  assert.equal(last.choices[0].finish_reason, done.choices[0].finish_reason);
  assert.equal(last.specsteer.stats.tokens, done.usage.completion_tokens);
});

test("usage counts prompt and completion tokens, streamed with include_usage", async () => {
  const done = await openai.chat.completions.create({ model: bridge.info.specialist,
    messages: MESSAGES, max_tokens: 10 });
  const { stats } = done.specsteer;
  assert.ok(done.usage.prompt_tokens > 20);
  assert.equal(done.usage.prompt_tokens, stats.prompt_tokens);
  assert.equal(done.usage.completion_tokens, stats.tokens);
  assert.equal(done.usage.total_tokens, done.usage.prompt_tokens + done.usage.completion_tokens);
  const stream = await openai.chat.completions.create({ model: bridge.info.specialist,
    messages: MESSAGES, max_tokens: 10, stream: true, stream_options: { include_usage: true } });
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  const last = chunks.at(-1);
  assert.deepEqual(last.choices, []);
  assert.deepEqual(last.usage, done.usage);
  assert.ok(chunks.slice(0, -1).every((c) => c.usage === null && c.choices.length === 1));
});

test("model names are checked; client errors are 4xx in OpenAI's shape, never retried", async () => {
  assert.equal((await openai.models.retrieve(bridge.info.specialist)).id, bridge.info.specialist);
  await assert.rejects(openai.models.retrieve("gpt-4o"),
    (e) => e instanceof OpenAI.NotFoundError && e.code === "model_not_found");
  const before = (await bridge.status()).generations;
  let requests = 0; // the client would retry a 5xx (maxRetries 3): a 4xx is sent once
  const patient = new OpenAI({ baseURL: bridge.info.http, apiKey: openai.apiKey, maxRetries: 3,
    fetch: (...args) => { requests += 1; return fetch(...args); } });
  await assert.rejects(patient.chat.completions.create({ model: "gpt-4o", messages: MESSAGES }),
    (e) => e instanceof OpenAI.NotFoundError && e.code === "model_not_found" && e.param === "model");
  await assert.rejects(patient.chat.completions.create({ model: bridge.info.specialist,
    messages: MESSAGES, tools: [{ type: "function", function: { name: "f", parameters: {} } }],
    response_format: { type: "json_object" } }),
  (e) => e instanceof OpenAI.BadRequestError && e.code === "unsupported_parameter"
    && e.param === "tools" && /tools=.*response_format=/.test(e.message));
  await assert.rejects(patient.chat.completions.create({ model: bridge.info.specialist,
    messages: [{ role: "user", content: "Budget ".repeat(1200) }] }),
  (e) => e instanceof OpenAI.BadRequestError && e.code === "context_length_exceeded"
    && e.param === "messages" && e.type === "invalid_request_error");
  await assert.rejects(patient.chat.completions.create({ model: bridge.info.specialist,
    messages: MESSAGES, stream: true, specsteer: { task: "limerick" } }),
  (e) => e instanceof OpenAI.BadRequestError && e.code === "unknown_task"
    && e.param === "specsteer.task");
  assert.equal(requests, 4); // none of them was retried
  assert.equal((await bridge.status()).generations, before); // none reached the model
});

test("a wrong or missing bearer token is refused with 401", async () => {
  const stranger = new OpenAI({ baseURL: bridge.info.http, apiKey: "wrong-token-of-some-length",
    maxRetries: 0 });
  await assert.rejects(stranger.models.list(),
    (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
  await assert.rejects(stranger.chat.completions.create({ model: bridge.info.specialist, messages: MESSAGES }),
    (e) => e instanceof OpenAI.AuthenticationError && e.code === "invalid_api_key");
  // the openai client will not send a request without a key: plain fetch does
  const bare = await fetch(`${bridge.info.http}/chat/completions`, { method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ model: bridge.info.specialist, messages: MESSAGES }) });
  assert.equal(bare.status, 401);
  assert.equal((await bare.json()).error.code, "invalid_api_key");
  // the refused requests reached no model, and the next one is served on the same pool
  assert.equal((await openai.chat.completions.create({ model: bridge.info.specialist, messages: MESSAGES,
    max_tokens: 2 })).usage.completion_tokens, 2);
});

test("busy while a stream runs (429); aborting the stream cancels its generation", async () => {
  const before = await bridge.status();
  // the companion stopped (SIGSTOP): the generation waits on it, deterministically running
  process.kill(companion.process.pid, "SIGSTOP");
  try {
    const stream = await openai.chat.completions.create({ model: bridge.info.specialist, messages: MESSAGES,
      max_tokens: 1500, stream: true });
    const iterator = stream[Symbol.asyncIterator]();
    const first = (await iterator.next()).value; // the role chunk: the generation has started
    let status = await statusOnce((s) => s.generating !== null);
    assert.equal(status.generating, first.id);
    await assert.rejects(openai.chat.completions.create({ model: bridge.info.specialist, messages: MESSAGES }),
      (e) => e instanceof OpenAI.RateLimitError && e.status === 429 && e.code === "busy");

    stream.controller.abort(); // the app gives up: the connection closes
    status = await statusOnce((s) => s.generating === null);
    assert.equal(status.cancelled, before.cancelled + 1);
    assert.equal(status.generations, before.generations + 1);
  } finally {
    process.kill(companion.process.pid, "SIGCONT");
  }
  const next = await openai.chat.completions.create({ model: bridge.info.specialist, messages: MESSAGES,
    max_tokens: 4 });
  assert.equal(next.usage.completion_tokens, 4);
  assert.equal(next.specsteer.stats.degraded, false); // the companion is back
});
