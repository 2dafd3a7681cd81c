// Test helpers: this repository's Python, the tiny model pair, a real companion process.
import { spawn, execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

export const REPO = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
export const PYTHON = process.env.SPECSTEER_PYTHON
  ?? [join(REPO, ".venv", "bin", "python")].find(existsSync) ?? "python3";
export const ENV = {
  ...process.env,
  PYTHONPATH: [join(REPO, "sdk"), join(REPO, "cloud_companion"), process.env.PYTHONPATH]
    .filter(Boolean).join(":"),
  PYTHONUNBUFFERED: "1",
};

export function tinyModel(seed) {
  return execFileSync(PYTHON, ["-c",
    `from specsteer.models.tiny import tiny_model_dir; print(tiny_model_dir("llama", seed=${seed}))`],
  { env: ENV, encoding: "utf8" }).trim();
}

/** `specsteer-companion serve` on the tiny pair; resolves { url, kill }. */
export function startCompanion() {
  const child = spawn(PYTHON, ["-m", "specsteer_companion.cli", "serve", "--generalist",
    tinyModel(1), "--specialist", tinyModel(0), "--port", "0", "--open"],
  { env: ENV, stdio: ["ignore", "pipe", "inherit"] });
  return new Promise((resolve, reject) => {
    const lines = createInterface({ input: child.stdout });
    const timer = setTimeout(() => reject(new Error("the companion did not start")), 120_000);
    lines.on("line", (line) => {
      if (line.startsWith("companion ready:")) {
        clearTimeout(timer);
        resolve({ url: line.split(/\s+/)[2], process: child,
          kill: () => new Promise((done) => {
            if (child.exitCode !== null || child.signalCode !== null) return done();
            child.once("exit", done);
            child.kill("SIGKILL");
          }) });
      }
    });
    child.once("exit", (code) => reject(new Error(`the companion exited with ${code}`)));
  });
}

export function clientOptions(...bridgeArgs) {
  return { python: PYTHON, env: ENV, bridgeArgs: ["--specialist", tinyModel(0), ...bridgeArgs] };
}

/**
 * A real companion and a bridge serving `--http` on a free loopback port, the bearer token in a
 * fresh folder: resolves { companion, bridge, tokenFile, token, close }.
 */
export async function startHttpBridge(SpecSteerClient) {
  const companion = await startCompanion();
  const dir = mkdtempSync(join(tmpdir(), "specsteer-http-"));
  const tokenFile = join(dir, "token");
  let bridge;
  try {
    bridge = await SpecSteerClient.start(clientOptions("--companion", companion.url,
      "--http", "127.0.0.1:0", "--http-token-file", tokenFile));
  } catch (error) {
    await companion.kill();
    throw error;
  }
  return { companion, bridge, tokenFile, token: readFileSync(tokenFile, "utf8").trim(),
    close: async () => {
      await bridge.close();
      await companion.kill();
      rmSync(dir, { recursive: true, force: true });
    } };
}
