// SpecSteer Mail: a small Node HTTP server embedding the SDK the way an Electron main process
// would — through bindings/node (a `specsteer bridge` child process) — and a plain HTML/JS page.
//
//   node sample_apps/mail/server.mjs [--help] [--port 8400] [--tiny] [--companion ws://HOST:PORT]
//                                    [--no-companion] [--history PATH] [--python PATH]
//                                    [--max-new-tokens N] [--min-token-ms MS]
//
// Runs the Qwen2.5 0.5B/1.5B pair `./dev demo` compiles (--tiny: the tiny test models, which
// write random text, with a banner saying so). Without --companion it starts one
// (sample_apps/companion.py, which starts it again if it dies). The history store starts with the persona's sent mail; the inbox is
// sample_apps/data/inbox.json. Routes: GET /api/inbox, /api/sent, /api/status, /api/frames,
// /api/settings; POST /api/prepare (the composer while the user types: retrieve and prefill),
// /api/draft (the same body; answered with server-sent events), /api/send, /api/cancel,
// /api/import, /api/settings. Binds to 127.0.0.1 only.
import { spawn, execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { createServer, get as httpGet } from "node:http";
import { get as httpsGet } from "node:https";
import { mkdirSync, readFileSync, writeFileSync, mkdtempSync, rmSync } from "node:fs";
import { homedir, tmpdir } from "node:os";
import { dirname, extname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

// bindings/node/dist is imported when the bridge starts, so --help works before it is built
const CLIENT = "../../bindings/node/dist/index.js";

const HERE = dirname(fileURLToPath(import.meta.url));
const APPS = resolve(HERE, "..");
const REPO = resolve(APPS, "..");
const DATA = join(APPS, "data");
const STATIC = [join(HERE, "static"), join(APPS, "shared_ui")];
// the bridge's decoding options, generated from the SDK's option registry: choices and defaults
const DECODING = JSON.parse(readFileSync(join(REPO, "bindings", "schema", "v1", "common.json"),
                                         "utf8")).$defs.decoding_options.properties;
const PRESETS = DECODING.preset.enum;
const TYPES = { ".html": "text/html", ".js": "text/javascript", ".css": "text/css" };

const OPTIONS = {
  port: { type: "string", default: "8400", help: "port on 127.0.0.1 (0 picks a free one)" },
  tiny: { type: "boolean", default: false,
          help: "the tiny test models instead of the Qwen pair (test models: random text; for tests)" },
  companion: { type: "string", default: "", help: "ws://HOST:PORT of a running companion (default: start one)" },
  "no-companion": { type: "boolean", default: false, help: "on-device only" },
  token: { type: "string", default: "", help: "device token for the companion" },
  preset: { type: "string", default: "default", help: "default | fast | strict" },
  history: { type: "string", default: "", help: "history file (default: $SPECSTEER_HOME/apps/mail.db)" },
  python: { type: "string", default: process.env.SPECSTEER_PYTHON || "python3",
            help: "the Python with specsteer installed (default: $SPECSTEER_PYTHON or python3)" },
  "max-new-tokens": { type: "string", default: "", help: "tokens per draft (default 160; 200 with --tiny)" },
  "min-token-ms": { type: "string", default: "", help: "pace the stream for reading (default 0; 25 with --tiny)" },
  help: { type: "boolean", short: "h", default: false, help: "show this help and exit" },
};

function usage() {
  const lines = ["usage: ./dev mail [options]   (node sample_apps/mail/server.mjs [options])", "",
    "SpecSteer Mail: drafts and replies in your voice (Qwen2.5 0.5B on this device, steered by",
    "1.5B in a companion), on http://127.0.0.1:8400.", "", "options:"];
  for (const [name, option] of Object.entries(OPTIONS)) {
    const flag = `--${name}${option.type === "string" ? " VALUE" : ""}${option.short ? `, -${option.short}` : ""}`;
    lines.push(`  ${flag.padEnd(24)} ${option.help}`);
  }
  return lines.join("\n");
}

function parseOptions() {
  const options = Object.fromEntries(Object.entries(OPTIONS).map(([name, { help, ...o }]) => [name, o]));
  try {
    return parseArgs({ options }).values;
  } catch (error) { // an unknown or malformed option: say which, and how to get help
    console.error(`SpecSteer Mail: ${error.message}\n\n${usage()}`);
    process.exit(2);
  }
}

const opts = parseOptions();
if (opts.help) {
  console.log(usage());
  process.exit(0);
}

const specsteerHome = process.env.SPECSTEER_HOME || join(homedir(), ".cache", "specsteer");
const historyPath = opts.history || join(specsteerHome, "apps", "mail.db");
const inbox = JSON.parse(readFileSync(join(DATA, "inbox.json"), "utf8"));
const LEAK_GUARDS = DECODING.leak_guard.enum;
// never repeat an n-gram of a draft (the SDK's default, 8): greedy decoding otherwise loops
const NO_REPEAT_NGRAM = DECODING.no_repeat_ngram.default;
const settings = { companion: opts.companion, token: opts.token, preset: opts.preset,
                   leak_guard: DECODING.leak_guard.default };
const maxNewTokens = Number(opts["max-new-tokens"]) || (opts.tiny ? 200 : 160);
// paces the stream for reading: the tiny models write far faster than anyone reads
const minTokenMs = opts["min-token-ms"] !== "" ? Number(opts["min-token-ms"]) : (opts.tiny ? 25 : 0);
const state = { client: null, specialist: "", frames: [], mode: "unknown", reason: "",
                generation: null, launcher: null };

// ------------------------------------------------------------------ the SDK (bindings/node)
function python(args) {
  return new Promise((resolveRun, reject) => {
    execFile(opts.python, args, { cwd: REPO, maxBuffer: 1 << 20 }, (error, stdout, stderr) => {
      if (error) reject(new Error(`${args.slice(0, 4).join(" ")} failed: ${stderr || error.message}`));
      else resolveRun(stdout);
    });
  });
}

// Stop sample_apps/companion.py (and with it the companion it keeps), waiting up to 15 s.
function stopLauncher() {
  const child = state.launcher;
  if (!child || child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((done) => {
    const timer = setTimeout(() => { child.kill("SIGKILL"); done(); }, 15_000);
    child.once("exit", () => { clearTimeout(timer); done(); });
    child.kill("SIGTERM");
  });
}

async function launchModels() {
  // the models (and, unless one was named, a companion) from sample_apps/companion.py
  const args = [join(APPS, "companion.py"), ...(opts.tiny ? ["--tiny"] : [])];
  if (settings.companion || opts["no-companion"]) args.push("--no-companion");
  const child = spawn(opts.python, args, { cwd: REPO, stdio: ["pipe", "pipe", "inherit"] });
  state.launcher = child;
  const [line] = await new Promise((ok, fail) => {
    const lines = createInterface({ input: child.stdout });
    lines.once("line", (l) => ok([l]));
    child.once("exit", (code) => fail(new Error(`the models could not be loaded (exit ${code})`)));
  });
  const launched = JSON.parse(line);
  if (!settings.companion && launched.companion) settings.companion = launched.companion;
  return launched.specialist;
}

async function startBridge() {
  if (state.client) await state.client.close();
  // how long the bridge waits for a companion reply before writing locally: the real pair's
  // session opening prefills a reply's public prompt (the message answered) on both companion
  // models, over 4 s on one core (measured: the reply then went all local); the tiny models
  // answer in milliseconds, and the offline tests want the switch quickly
  const args = ["--specialist", state.specialist, "--history", historyPath, "--audit-frames",
                "--timeout-s", opts.tiny ? "4" : "30"];
  if (settings.companion) args.push("--companion", settings.companion);
  const { SpecSteerClient } = await import(CLIENT);
  const client = await SpecSteerClient.start({
    python: opts.python, bridgeArgs: args, cwd: REPO,
    env: { ...process.env, ...(settings.token ? { SPECSTEER_TOKEN: settings.token } : {}) },
  });
  client.on("frame", (frame) => state.frames.push({ ...frame, n: state.frames.length + 1 }));
  client.on("mode", (event) => {
    state.mode = event.mode;
    state.reason = event.reason;
    if (state.generation) state.generation.send("mode", { mode: event.mode, reason: event.reason });
  });
  client.on("stderr", () => {});
  state.client = client;
}

async function seedHistory() {
  const stats = await state.client.history.stats();
  if (stats.records === 0) await importMbox(join(DATA, "sent.mbox"));
}

async function importMbox(path) {
  // the SDK's importer (`specsteer history import`): Message-IDs make re-imports idempotent
  const out = await python(["-m", "specsteer", "history", "import", "--db", historyPath,
                            "--kind", "email", path]);
  return out.trim();
}

// ------------------------------------------------------------------ the badge
function probe(url) {
  // a websocket opening handshake: 101 means the companion (or a proxy) accepts connections
  return new Promise((done) => {
    if (!url) return done(false);
    const target = new URL(url.replace(/^ws/, "http")); // ws: -> http:, wss: -> https:
    const request = (target.protocol === "https:" ? httpsGet : httpGet)(target, {
      timeout: 1500,
      headers: { Connection: "Upgrade", Upgrade: "websocket", "Sec-WebSocket-Version": "13",
                 "Sec-WebSocket-Key": randomBytes(16).toString("base64") },
    });
    request.on("upgrade", (_res, socket) => { socket.destroy(); done(true); });
    request.on("response", (res) => { res.resume(); done(false); });
    request.on("timeout", () => { request.destroy(); done(false); });
    request.on("error", () => done(false));
  });
}

async function status() {
  const reachable = await probe(settings.companion);
  if (!state.generation && settings.companion) {
    state.mode = reachable ? "collaborative" : "local";
    state.reason = reachable ? "" : "the companion is unreachable";
  }
  return { mode: settings.companion ? state.mode : "none", reason: state.reason, reachable,
           generating: !!state.generation, settings, specialist: state.specialist,
           test_models: opts.tiny };
}

// ------------------------------------------------------------------ drafting
// The request for the composer's state: a reply to an inbox message (task `reply`) or a new
// message (task `email`), continuing what the user has written so far (`prefix`: it stays on
// this device — the bridge ends the on-device model's prompt with it and never sends it).
function draftRequest(composer) {
  const message = inbox.find((m) => m.id === composer.reply_to);
  const request = message
    ? { task: "reply", query: { message: message.body, subject: message.subject, to: message.from } }
    : { task: "email", query: { subject: String(composer.subject || "") || "(no subject)", to: String(composer.to || "") } };
  return { ...request, prefix: String(composer.body || "") };
}

// The decoding options of a draft, sent with prepare too: the first round's draft that
// prepare makes ahead is kept only for a generate with the same draft settings.
const PREPARE_WAIT_S = 30; // how long /api/prepare waits for the prefill before answering

function draftOptions() {
  return { preset: settings.preset, max_new_tokens: maxNewTokens, no_repeat_ngram: NO_REPEAT_NGRAM,
           leak_guard: settings.leak_guard };
}

async function prepare(composer) {
  // debounced by the page while the user types; the next draft reuses the prefilled prompt
  if (state.generation) return { prefilling: false, reason: "a draft is being written" };
  // the device only: the draft goes up when the user asks for help, not while they type
  // answered once the prefill is done (at most 30 s): the page shows "ready to draft" then
  return state.client.prepare({ ...draftRequest(composer), ...draftOptions(), open_session: false,
                                wait_s: PREPARE_WAIT_S });
}

async function draft(res, composer) {
  res.writeHead(200, { "Content-Type": "text/event-stream", "Cache-Control": "no-store",
                       Connection: "close" });
  const send = (event, data) => res.write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
  if (state.generation) return send("failed", { error: "a draft is already being written" }), res.end();
  const controller = new AbortController();
  state.generation = { send, controller };
  res.on("close", () => { if (!res.writableFinished) controller.abort(); }); // the page went away
  if (settings.companion) { state.mode = "collaborative"; state.reason = ""; }
  send("mode", { mode: settings.companion ? state.mode : "local", reason: state.reason });
  try {
    const generation = state.client.generate(
      { ...draftRequest(composer), ...draftOptions(), min_token_ms: minTokenMs },
      { signal: controller.signal });
    for await (const piece of generation) send("piece", piece);
    const result = await generation.result;
    const s = result.stats;
    send("done", { tokens: s.tokens, acceptance_rate: s.acceptance_rate, drafted: s.drafted,
                   accepted: s.accepted,
                   local_tokens: result.provenance.filter((p) => p === "local").length,
                   bytes_up: s.bytes_up,
                   bytes_down: s.bytes_down, degraded: s.degraded, reconnects: s.reconnects,
                   prefill_reused: s.prefill_reused, prefill_tokens: s.prefill_tokens,
                   drafted_ahead: s.drafted_ahead, leak_guard: settings.leak_guard, leak_flagged: s.leak_flagged,
                   leak_redacted: s.leak_redacted, leak_held: s.leak_held });
  } catch (error) {
    send(error.name === "AbortError" ? "cancelled" : "failed", { error: error.message });
  } finally {
    state.generation = null;
    res.end();
  }
}

// ------------------------------------------------------------------ HTTP
function readBody(req, limit = 32 << 20) {
  return new Promise((ok, fail) => {
    const chunks = [];
    let size = 0;
    req.on("data", (c) => { size += c.length; if (size > limit) fail(new Error("too large")); else chunks.push(c); });
    req.on("end", () => ok(Buffer.concat(chunks)));
    req.on("error", fail);
  });
}

function json(res, value, code = 200) {
  const body = JSON.stringify(value);
  res.writeHead(code, { "Content-Type": "application/json", "Cache-Control": "no-store" });
  res.end(body);
}

function serveStatic(res, name) {
  for (const folder of STATIC) {
    const target = resolve(folder, name);
    if (!target.startsWith(folder + "/")) continue;
    try {
      const body = readFileSync(target);
      res.writeHead(200, { "Content-Type": `${TYPES[extname(target)] || "application/octet-stream"}; charset=utf-8` });
      return res.end(body);
    } catch { /* try the next folder */ }
  }
  json(res, { error: `no such file: ${name}` }, 404);
}

async function route(req, res) {
  const url = new URL(req.url, "http://localhost");
  const path = url.pathname;
  if (req.method === "GET") {
    if (path === "/") return serveStatic(res, "index.html");
    if (path === "/favicon.ico") return res.writeHead(204).end();
    if (path.startsWith("/static/")) return serveStatic(res, path.slice(8));
    if (path === "/api/inbox") return json(res, inbox);
    if (path === "/api/sent") {
      return json(res, await state.client.history.list({ kinds: ["email"], limit: 200 }));
    }
    if (path === "/api/frames") return json(res, state.frames.slice(Number(url.searchParams.get("since") || 0)));
    if (path === "/api/status") return json(res, await status());
    if (path === "/api/settings") return json(res, { ...settings, presets: PRESETS, leak_guards: LEAK_GUARDS });
  }
  if (req.method === "POST") {
    if (path === "/api/draft" || path === "/api/prepare") {
      const composer = JSON.parse((await readBody(req, 1 << 20)).toString("utf8") || "{}");
      return path === "/api/draft" ? draft(res, composer) : json(res, await prepare(composer));
    }
    if (path === "/api/cancel") {
      const running = !!state.generation;
      state.generation?.controller.abort();
      return json(res, { cancelled: running });
    }
    if (path === "/api/send") {
      const mail = JSON.parse((await readBody(req)).toString("utf8") || "{}");
      if (!mail.body || !String(mail.body).trim()) return json(res, { error: "the message is empty" }, 400);
      const record = await state.client.history.add({
        kind: "email", title: String(mail.subject || ""), body: String(mail.body),
        created_at: new Date().toISOString().slice(0, 19) + "Z",
        meta: { to: String(mail.to || "") }, source: "mail-app" });
      return json(res, record);
    }
    if (path === "/api/import") {
      const folder = mkdtempSync(join(tmpdir(), "specsteer-mail-"));
      try {
        const file = join(folder, "upload.mbox");
        writeFileSync(file, await readBody(req));
        // the report names the user's file, not the temporary copy
        const name = decodeURIComponent(String(req.headers["x-file-name"] || "your mailbox"));
        return json(res, { report: (await importMbox(file)).replaceAll(file, name) });
      } finally {
        rmSync(folder, { recursive: true, force: true });
      }
    }
    if (path === "/api/settings") {
      const next = JSON.parse((await readBody(req)).toString("utf8") || "{}");
      const companion = String(next.companion ?? settings.companion).trim();
      if (companion && !/^wss?:\/\//.test(companion)) return json(res, { error: "the companion URL must start with ws:// or wss://" }, 400);
      if (next.preset && !PRESETS.includes(next.preset)) return json(res, { error: `preset must be one of ${PRESETS.join(", ")}` }, 400);
      if (next.leak_guard && !LEAK_GUARDS.includes(next.leak_guard)) return json(res, { error: `leak_guard must be one of ${LEAK_GUARDS.join(", ")}` }, 400);
      if (state.generation) return json(res, { error: "wait for the draft to finish, or cancel it" }, 409);
      Object.assign(settings, { companion, token: String(next.token ?? settings.token),
                                preset: next.preset || settings.preset,
                                leak_guard: next.leak_guard || settings.leak_guard });
      await startBridge(); // the bridge holds its companion link: start it again
      return json(res, settings);
    }
  }
  json(res, { error: `no such route: ${req.method} ${path}` }, 404);
}

async function main() {
  mkdirSync(dirname(historyPath), { recursive: true });
  console.log("loading the models and the companion...");
  state.specialist = await launchModels();
  await startBridge();
  await seedHistory();
  const server = createServer((req, res) => route(req, res).catch((error) => {
    if (!res.headersSent) json(res, { error: error.message }, 500);
    else res.end();
  }));
  server.listen(Number(opts.port), "127.0.0.1", () => {
    console.log(`SpecSteer Mail on http://127.0.0.1:${server.address().port}  (companion: ${settings.companion || "none"})`);
  });
  const stop = async () => {
    server.close();
    await state.client?.close();
    await stopLauncher(); // it stops the companion it keeps: wait for that
    process.exit(0);
  };
  process.on("SIGINT", stop);
  process.on("SIGTERM", stop);
}

main().catch((error) => {
  console.error(`SpecSteer Mail could not start: ${error.message}`);
  state.launcher?.kill("SIGTERM");
  process.exit(1);
});
