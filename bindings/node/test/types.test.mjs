// The TypeScript types cannot drift from the protocol's JSON Schemas: src/generated/protocol.ts
// must be exactly what json-schema-to-typescript makes of bindings/schema/v1 today.
import assert from "node:assert/strict";
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import ts from "typescript";

import { generate, OUTPUT, SCHEMA_DIR } from "../scripts/generate-types.mjs";

test("src/generated/protocol.ts is what the schemas give (run npm run generate)", async () => {
  assert.equal(readFileSync(OUTPUT, "utf8"), await generate(),
    "the schemas changed and the TypeScript types did not follow: run npm run generate");
});

test("a schema change changes the generated types", async (t) => {
  const dir = mkdtempSync(join(tmpdir(), "specsteer-schema-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  cpSync(SCHEMA_DIR, dir, { recursive: true });
  const path = join(dir, "generate.piece.json");
  const piece = JSON.parse(readFileSync(path, "utf8"));
  piece.$defs.params.properties.logprob = { type: "number" };
  piece.$defs.params.required.push("logprob");
  writeFileSync(path, JSON.stringify(piece));
  const changed = await generate(dir);
  assert.notEqual(changed, readFileSync(OUTPUT, "utf8"));
  assert.match(changed, /export interface GeneratePieceParams \{[^}]*\n {2}logprob: number;/);
});

test("prepare takes generate's decoding options, typed; wrong ones do not compile", () => {
  const file = join(dirname(fileURLToPath(import.meta.url)), "typed", "prepare-options.ts");
  const program = ts.createProgram([file], {
    strict: true, noEmit: true, target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.NodeNext,
    moduleResolution: ts.ModuleResolutionKind.NodeNext, skipLibCheck: true, types: ["node"] });
  const problems = ts.getPreEmitDiagnostics(program).map((d) =>
    `${d.file ? d.file.fileName.split("/").pop() + ":" + (d.file.getLineAndCharacterOfPosition(d.start).line + 1) : ""} ${ts.flattenDiagnosticMessageText(d.messageText, " ")}`);
  assert.deepEqual(problems, []);
});
