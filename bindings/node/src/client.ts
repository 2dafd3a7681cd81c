/**
 * SpecSteerClient: spawns `python -m specsteer bridge` and speaks its JSON-RPC 2.0 over stdio.
 *
 * One process per client. Requests are matched to answers by id; `generate` streams pieces as an
 * AsyncIterable and an AbortSignal (or leaving the loop early) sends `cancel`. If the process dies,
 * every pending call is rejected at once with BridgeExitedError; `restart()` starts a new one.
 */

import { spawn, type ChildProcessWithoutNullStreams } from "node:child_process";
import { EventEmitter } from "node:events";
import { createInterface } from "node:readline";

import { BridgeError, BridgeExitedError, BridgeStartError } from "./errors.js";
import type {
  ForgetOptions,
  GenerateRequest,
  GenerateResult,
  InitializeResult,
  ListOptions,
  FrameEvent,
  MethodName,
  ModeEvent,
  NewRecord,
  ParamsOf,
  Piece,
  PrepareParams,
  RequestId,
  ResultOf,
  SearchOptions,
} from "./types.js";

export const PROTOCOL_VERSION = 1;
const STDERR_KEEP = 8192;

export interface ClientOptions {
  /** Python interpreter with the specsteer package (default: $SPECSTEER_PYTHON or python3). */
  python?: string;
  /** Arguments after `python -m specsteer bridge`: --specialist, --history, --companion... */
  bridgeArgs?: string[];
  env?: NodeJS.ProcessEnv;
  cwd?: string;
  /** How long the bridge may take to load its model and answer `initialize` (default 120 s). */
  startTimeoutMs?: number;
}

interface Pending {
  resolve: (value: any) => void;
  reject: (error: Error) => void;
}

interface Stream {
  pieces: Piece[];
  wake: (() => void) | null;
}

export interface GenerateOptions {
  signal?: AbortSignal;
}

/** An AsyncIterable of pieces; `result` resolves with the final answer once the stream ends. */
export interface Generation extends AsyncIterable<Piece> {
  readonly id: RequestId;
  readonly result: Promise<GenerateResult>;
}

export interface SpecSteerClientEvents {
  mode: [ModeEvent];
  frame: [FrameEvent];
  exit: [BridgeExitedError];
  stderr: [string];
}

export class SpecSteerClient extends EventEmitter<SpecSteerClientEvents> {
  readonly options: ClientOptions;
  info: InitializeResult | null = null;
  private child: ChildProcessWithoutNullStreams | null = null;
  private pending = new Map<RequestId, Pending>();
  private streams = new Map<RequestId, Stream>();
  private nextId = 0;
  private stderrTail = "";
  private exited: BridgeExitedError | null = null;

  constructor(options: ClientOptions = {}) {
    super();
    this.options = options;
  }

  /** Spawn a client's bridge and wait until it answers `initialize`. */
  static async start(options: ClientOptions = {}): Promise<SpecSteerClient> {
    const client = new SpecSteerClient(options);
    await client.start();
    return client;
  }

  /** The bridge's process id (undefined before start). */
  get pid(): number | undefined {
    return this.child?.pid;
  }

  get running(): boolean {
    return this.child !== null && this.exited === null;
  }

  /** Start the bridge process (again, after an exit) and initialize it. */
  async start(): Promise<InitializeResult> {
    if (this.running) throw new Error("the bridge is already running");
    const python = this.options.python ?? process.env.SPECSTEER_PYTHON ?? "python3";
    const args = ["-m", "specsteer", "bridge", ...(this.options.bridgeArgs ?? [])];
    this.exited = null;
    this.stderrTail = "";
    const child = spawn(python, args, {
      env: this.options.env ?? process.env,
      cwd: this.options.cwd,
      stdio: ["pipe", "pipe", "pipe"],
    });
    this.child = child;
    const spawnFailed = new Promise<never>((_, reject) => {
      child.once("error", (error: NodeJS.ErrnoException) => {
        const hint = error.code === "ENOENT" ? ` (is ${python} installed and on PATH?)` : "";
        reject(new BridgeStartError(`cannot run ${python}: ${error.message}${hint}`, ""));
      });
    });
    child.stdin.on("error", () => {}); // EPIPE after a crash: the exit handler reports it
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (chunk: string) => {
      this.stderrTail = (this.stderrTail + chunk).slice(-STDERR_KEEP);
      this.emit("stderr", chunk);
    });
    createInterface({ input: child.stdout, crlfDelay: Infinity }).on("line", (line) =>
      this.receive(line),
    );
    child.once("exit", (code, signal) => this.onExit(child, code, signal));

    const timeoutMs = this.options.startTimeoutMs ?? 120_000;
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new BridgeStartError(
        `the bridge did not answer initialize within ${timeoutMs} ms`, this.stderrTail)), timeoutMs);
    });
    try {
      const info = await Promise.race([
        this.request("initialize", { protocol_version: PROTOCOL_VERSION,
          client: { name: "@specsteer/bridge", version: "0.1.0" } }),
        spawnFailed,
        timedOut,
      ]);
      if (info.protocol_version !== PROTOCOL_VERSION) {
        throw new BridgeStartError(
          `the bridge speaks protocol ${info.protocol_version}, this client ${PROTOCOL_VERSION}; ` +
          `install matching versions of specsteer and @specsteer/bridge`, "");
      }
      this.info = info;
      return info;
    } catch (error) {
      child.kill("SIGKILL");
      if (error instanceof BridgeExitedError) {
        throw new BridgeStartError(`the bridge exited before it was ready (${error.message.split("\n")[0]})`,
          error.stderr);
      }
      throw error;
    } finally {
      clearTimeout(timer);
    }
  }

  /** Stop and start the bridge (after a crash, or to pick up new arguments). */
  async restart(): Promise<InitializeResult> {
    if (this.running) await this.close();
    return this.start();
  }

  /** Close stdin (the bridge's signal to stop) and wait for the process to exit. */
  async close(timeoutMs = 10_000): Promise<void> {
    const child = this.child;
    if (!child || this.exited) return;
    const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
    child.stdin.end();
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    await exited;
    clearTimeout(timer);
  }

  // -- protocol ------------------------------------------------------------------------------
  /** Call a method; params and result are typed by the protocol schemas (Methods). */
  request<M extends MethodName>(method: M, ...params: OptionalIfEmpty<ParamsOf<M>>):
    Promise<ResultOf<M>> {
    if (!this.child || this.exited) {
      return Promise.reject(this.exited ?? new Error("the bridge is not started: call start()"));
    }
    const id = ++this.nextId;
    return new Promise<ResultOf<M>>((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.child!.stdin.write(
        JSON.stringify({ jsonrpc: "2.0", id, method, params: params[0] ?? {} }) + "\n");
    });
  }

  private receive(line: string): void {
    let frame: any;
    try {
      frame = JSON.parse(line);
    } catch {
      this.emit("stderr", `unreadable frame from the bridge: ${line.slice(0, 200)}\n`);
      return;
    }
    if (typeof frame.method === "string") {
      this.notification(frame.method, frame.params ?? {});
      return;
    }
    const waiting = this.pending.get(frame.id);
    if (!waiting) return;
    this.pending.delete(frame.id);
    if (frame.error) {
      waiting.reject(new BridgeError(frame.error.code, frame.error.message, frame.error.data));
    } else {
      waiting.resolve(frame.result);
    }
  }

  private notification(method: string, params: any): void {
    if (method === "companion.frame") {
      this.emit("frame", params as FrameEvent);
      return;
    }
    if (method === "generate.mode") {
      this.emit("mode", params as ModeEvent);
      return;
    }
    if (method === "generate.piece") {
      const stream = this.streams.get(params.id);
      if (!stream) return;
      const { text, token, provenance, round } = params;
      stream.pieces.push({ text, token, provenance, round });
      stream.wake?.();
    }
  }

  private onExit(child: ChildProcessWithoutNullStreams, code: number | null,
                 signal: NodeJS.Signals | null): void {
    if (child !== this.child) return;
    const error = new BridgeExitedError(code, signal, this.stderrTail);
    this.exited = error;
    const pending = [...this.pending.values()];
    this.pending.clear();
    for (const call of pending) call.reject(error);
    for (const stream of this.streams.values()) stream.wake?.();
    if (this.listenerCount("exit") > 0) this.emit("exit", error);
  }

  // -- generation ----------------------------------------------------------------------------
  /** Stream a generation: `for await (const piece of client.generate(req, { signal }))`. */
  generate(request: GenerateRequest, options: GenerateOptions = {}): Generation {
    const { signal } = options;
    if (signal?.aborted) {
      const result = Promise.reject(abortError(signal));
      result.catch(() => {});
      return { id: -1, result, async *[Symbol.asyncIterator]() { throw abortError(signal); } };
    }
    const id = this.nextId + 1;
    const stream: Stream = { pieces: [], wake: null };
    this.streams.set(id, stream);
    let finished = false;
    const result = this.request("generate", request).finally(() => {
      finished = true;
      stream.wake?.();
    });
    result.catch(() => {});
    const cancel = () => {
      if (!finished && this.running) this.request("cancel", { id }).catch(() => {});
    };
    signal?.addEventListener("abort", cancel, { once: true });
    const client = this;
    return {
      id,
      result,
      async *[Symbol.asyncIterator]() {
        try {
          while (true) {
            while (stream.pieces.length > 0) yield stream.pieces.shift()!;
            if (finished) break;
            await new Promise<void>((resolve) => { stream.wake = resolve; });
            stream.wake = null;
          }
          const answer = await result;
          while (stream.pieces.length > 0) yield stream.pieces.shift()!;
          if (answer.finish_reason === "cancelled" && signal?.aborted) throw abortError(signal);
        } finally {
          signal?.removeEventListener("abort", cancel);
          cancel(); // leaving the loop early stops the generation
          client.streams.delete(id);
        }
      },
    };
  }

  /** The whole generation at once; an aborted signal rejects with an AbortError. */
  async complete(request: GenerateRequest, options: GenerateOptions = {}): Promise<GenerateResult> {
    const generation = this.generate(request, options);
    for await (const _ of generation) {
      // pieces are collected by the bridge into the result
    }
    return generation.result;
  }

  status(): Promise<ResultOf<"status">> {
    return this.request("status");
  }

  /**
   * Retrieve and prefill while the user types; the next generate of the task reuses it. Give it
   * that generate's decoding options (`DecodingOptions`): the companion session and the first
   * round's draft made ahead are kept only for a generate with the same settings.
   */
  prepare(params: PrepareParams): Promise<ResultOf<"prepare">> {
    return this.request("prepare", params);
  }

  readonly history = {
    add: (record: NewRecord) => this.request("history.add", record).then((r) => r.record),
    search: (query: string, options: SearchOptions = {}) =>
      this.request("history.search", { query, ...options }).then((r) => r.hits),
    list: (options: ListOptions = {}) =>
      this.request("history.list", options).then((r) => r.records),
    delete: (ids: string[]) => this.request("history.delete", { ids }).then((r) => r.deleted),
    forget: (options: ForgetOptions) =>
      this.request("history.forget", options).then((r) => r.deleted),
    stats: () => this.request("history.stats"),
  };
}

/** A method whose params may all be left out takes them optionally. */
type OptionalIfEmpty<P> = {} extends P ? [params?: P] : [params: P];

function abortError(signal: AbortSignal): Error {
  return signal.reason instanceof Error ? signal.reason
    : new DOMException("the generation was aborted", "AbortError");
}
