// `specsteer bridge --http` driven by the Vercel AI SDK (`ai` + `@ai-sdk/openai-compatible`,
// what Electron apps commonly use; nobody here wrote them): text, streamed text, usage, and
// errors, against a real bridge started by SpecSteerClient and a real companion (tiny models).
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { APICallError, generateText, streamText } from "ai";

import { SpecSteerClient } from "../dist/index.js";
import { startHttpBridge } from "./helpers.mjs";

const PROMPT = "Budget for the next quarter";
let served;
let bridge;
let provider;
let requests = 0; // every HTTP request the SDK made (its retries included)

before(async () => {
  served = await startHttpBridge(SpecSteerClient);
  bridge = served.bridge;
  provider = createOpenAICompatible({
    name: "specsteer", baseURL: bridge.info.http, includeUsage: true, apiKey: served.token,
    fetch: (...args) => { requests += 1; return fetch(...args); },
  });
});
after(async () => { await served?.close(); });

test("generateText and streamText write the same text, with usage", async () => {
  const model = provider.chatModel(bridge.info.specialist);
  const done = await generateText({ model, prompt: PROMPT, maxOutputTokens: 16, maxRetries: 0 });
  assert.ok(done.text.length > 0);
  assert.ok(done.usage.outputTokens > 0 && done.usage.outputTokens <= 16, JSON.stringify(done.usage));
  assert.ok(done.usage.inputTokens > 20, JSON.stringify(done.usage));
  assert.equal(done.usage.totalTokens, done.usage.inputTokens + done.usage.outputTokens);
  assert.ok(["stop", "length"].includes(done.finishReason), done.finishReason);

  const streamed = streamText({ model, prompt: PROMPT, maxOutputTokens: 16, maxRetries: 0 });
  let text = "";
  for await (const delta of streamed.textStream) text += delta;
  assert.equal(text, done.text); // greedy: the same text, streamed
  assert.deepEqual(await streamed.usage, done.usage); // from the stream's usage chunk
  assert.equal(await streamed.finishReason, done.finishReason);
});

test("errors come back as APICallErrors with OpenAI's body, 4xx ones not retried", async () => {
  const before = requests;
  const wrong = provider.chatModel("gpt-4o");
  await assert.rejects(generateText({ model: wrong, prompt: PROMPT, maxRetries: 2 }),
    (e) => APICallError.isInstance(e) && e.statusCode === 404 && !e.isRetryable
      && JSON.parse(e.responseBody).error.code === "model_not_found");
  const model = provider.chatModel(bridge.info.specialist);
  await assert.rejects(generateText({ model, prompt: "Budget ".repeat(1200), maxRetries: 2 }),
    (e) => APICallError.isInstance(e) && e.statusCode === 400
      && JSON.parse(e.responseBody).error.code === "context_length_exceeded");
  await assert.rejects(generateText({ model, system: "You are a pirate.", prompt: PROMPT,
    maxRetries: 2 }),
  (e) => APICallError.isInstance(e) && e.statusCode === 400
    && /messages\[0\] \(role 'system'\) is not read/.test(e.message));
  assert.equal(requests - before, 3); // each sent once
});
