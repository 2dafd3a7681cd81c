// The Node client against a real `specsteer bridge` and a real companion (tiny models).
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { BridgeError, BridgeExitedError, BridgeStartError, ErrorCodes, SpecSteerClient }
  from "../dist/index.js";
import { clientOptions, REPO, startCompanion } from "./helpers.mjs";

let companion;
before(async () => { companion = await startCompanion(); });
after(async () => { await companion?.kill(); });

test("ErrorCodes are bindings/schema/v1/error.json's codes", () => {
  const schema = JSON.parse(readFileSync(join(REPO, "bindings", "schema", "v1", "error.json"),
    "utf8"));
  assert.deepEqual(Object.fromEntries(Object.entries(ErrorCodes)
    .map(([name, code]) => [name.toLowerCase(), code])), schema.codes);
});

// paced 20 ms a piece: the tiny model may reach end-of-text early, in well under a second
const LONG = { query: "Budget for the next quarter", max_new_tokens: 1500, min_token_ms: 20 };

test("generate streams pieces with provenance; complete, history, prepare", async (t) => {
  const dir = mkdtempSync(join(tmpdir(), "specsteer-node-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const client = await SpecSteerClient.start(clientOptions(
    "--companion", companion.url, "--history", join(dir, "h.db")));
  try {
    assert.equal(client.info.protocol_version, 1);
    const record = await client.history.add({ kind: "email", title: "Budget", body: "Dear team" });
    const hits = await client.history.search("budget", { k: 2 });
    assert.deepEqual(hits.map((h) => h.record.id), [record.id]);
    assert.equal((await client.history.list({ kinds: ["email"] })).length, 1);

    const generation = client.generate({ query: "Budget for the next quarter",
      max_new_tokens: 32, offline: "fail" });
    const pieces = [];
    for await (const piece of generation) pieces.push(piece);
    const result = await generation.result;
    assert.equal(pieces.map((p) => p.text).join(""), result.text);
    assert.ok(pieces.length > 0 && pieces.every((p) => p.provenance !== "local"));
    assert.deepEqual(result.stats.records, [record.id]);

    const again = await client.complete({ query: "Budget for the next quarter",
      max_new_tokens: 32, offline: "fail" });
    assert.equal(again.text, result.text); // greedy: same request, same text

    assert.deepEqual(await client.prepare({ query: "Budget for the next quarter", wait_s: 30 }),
      { task: "email", prefilling: true, ready: true }); // answered once the prefill is done
    await assert.rejects(client.prepare({}),
      (e) => e instanceof BridgeError && e.code === ErrorCodes.INVALID_PARAMS);
    // prepared with the options of the generate that follows: its session and first draft
    // are used (wait_s: prepare answers once they are made)
    const options = { preset: "fast", no_repeat_ngram: 8, max_new_tokens: 16 };
    assert.ok((await client.prepare({ query: "Budget for the next quarter", ...options, wait_s: 30 })).ready);
    const prepared = await client.complete({ query: "Budget for the next quarter", ...options,
      offline: "fail" });
    assert.ok(prepared.stats.session_reused && prepared.stats.drafted_ahead > 0, prepared.stats);
    await assert.rejects(client.prepare({ query: "x", no_repeat_ngram: 1 }),
      (e) => e instanceof BridgeError && e.code === ErrorCodes.INVALID_PARAMS
        && e.message.includes("no_repeat_ngram"));
    await assert.rejects(client.history.delete(["nope"]),
      (e) => e instanceof BridgeError && e.code === ErrorCodes.RECORD_NOT_FOUND);
    await assert.rejects(client.complete({ query: "x", max_new_tokens: "many" }),
      (e) => e instanceof BridgeError && e.code === ErrorCodes.INVALID_PARAMS);
    assert.equal(await client.history.forget({ all: true }), 1);
  } finally {
    await client.close();
  }
});

test("an AbortSignal cancels a running generation quickly", async () => {
  const client = await SpecSteerClient.start(clientOptions("--companion", companion.url));
  try {
    const controller = new AbortController();
    const generation = client.generate(LONG, { signal: controller.signal });
    let pieces = 0;
    let abortedAt = 0;
    await assert.rejects(async () => {
      for await (const _ of generation) {
        if (++pieces === 3) {
          abortedAt = performance.now();
          controller.abort();
        }
      }
    }, (e) => e.name === "AbortError");
    const elapsed = performance.now() - abortedAt;
    assert.ok(elapsed < 500, `cancel took ${elapsed} ms`);
    assert.equal((await generation.result).finish_reason, "cancelled");
    // the bridge is free again
    const next = await client.complete({ query: "Notes", max_new_tokens: 8 });
    assert.notEqual(next.finish_reason, "cancelled");
    // two at once: the second is refused with BUSY
    const first = client.complete(LONG);
    await assert.rejects(client.complete({ query: "x" }),
      (e) => e instanceof BridgeError && e.code === ErrorCodes.BUSY);
    await first;
  } finally {
    await client.close();
  }
});

test("the companion killed mid-stream: mode event, the stream goes on locally", async () => {
  const own = await startCompanion();
  const client = await SpecSteerClient.start(clientOptions("--companion", own.url));
  try {
    const modes = [];
    client.on("mode", (event) => modes.push(event));
    const generation = client.generate({ query: "Budget", max_new_tokens: 600 });
    const provenance = [];
    for await (const piece of generation) {
      provenance.push(piece.provenance);
      if (provenance.length === 5) await own.kill();
    }
    const result = await generation.result;
    assert.equal(modes.at(-1).mode, "local");
    assert.equal(modes.at(-1).id, generation.id);
    assert.notEqual(provenance[0], "local");
    assert.equal(provenance.at(-1), "local");
    assert.ok(result.stats.degraded);
  } finally {
    await client.close();
    await own.kill().catch(() => {});
  }
});

test("a dying bridge rejects every pending call at once, and restart() brings it back", async () => {
  const client = await SpecSteerClient.start(clientOptions("--companion", companion.url));
  const generation = client.generate(LONG);
  const status = client.status();
  const iterate = (async () => { for await (const _ of generation) { /* drain */ } })();
  await new Promise((resolve) => setTimeout(resolve, 100));
  process.kill(client.pid, "SIGKILL");
  for (const pending of [generation.result, iterate]) {
    await assert.rejects(pending, (e) => e instanceof BridgeExitedError && e.signal === "SIGKILL");
  }
  await status.catch(() => {}); // answered before the kill or rejected: never hangs
  await assert.rejects(client.status(), BridgeExitedError);
  await client.restart();
  assert.equal((await client.status()).generating, null);
  await client.close();
});

test("a bridge that cannot start gives a clear error", async () => {
  await assert.rejects(SpecSteerClient.start({ python: "/nonexistent/python3" }),
    (e) => e instanceof BridgeStartError && /nonexistent\/python3/.test(e.message));
  await assert.rejects(SpecSteerClient.start({ ...clientOptions(), bridgeArgs: ["--specialist",
    "/nonexistent/model"] }),
  (e) => e instanceof BridgeStartError && /cannot start/.test(e.stderr));
});
