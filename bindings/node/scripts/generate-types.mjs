#!/usr/bin/env node
// Generates src/generated/protocol.ts from the bridge protocol's JSON Schemas
// (bindings/schema/v1) with json-schema-to-typescript, so the TypeScript types cannot drift from
// the schemas the bridge validates against. `--check` compares instead of writing and exits 1 on a
// difference (test/types.test.mjs runs it on every `npm test`).
//
// Each method's `params` and `result` become `<Method>Params` / `<Method>Result`, each
// notification's `params` `<Notification>Params`, common.json's definitions their own names, and
// the interfaces `Methods` and `Notifications` map every name to its types.
import { readFileSync, readdirSync, writeFileSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

import { compile } from "json-schema-to-typescript";

const HERE = dirname(fileURLToPath(import.meta.url));
export const SCHEMA_DIR = join(HERE, "..", "..", "schema", "v1");
export const OUTPUT = join(HERE, "..", "src", "generated", "protocol.ts");
// common.json definitions whose plain names would clash (Record) or say too little (Stats)
const COMMON_NAMES = { record: "HistoryRecord", stats: "GenerationStats", request: "GenerationRequest" };
const BANNER = `/**
 * Types of the SpecSteer bridge protocol v1, generated from bindings/schema/v1 by
 * scripts/generate-types.mjs (json-schema-to-typescript). Do not edit: change the schema and run
 * \`npm run generate\`; test/types.test.mjs fails while this file and the schemas differ.
 */`;

const pascal = (name) => name.split(/[._]/).map((w) => w[0].toUpperCase() + w.slice(1)).join("");

/**
 * Params made of shared parts (`allOf` of common.json's `request` and `decoding_options`) are
 * closed by `unevaluatedProperties: false`, which json-schema-to-typescript does not read: it
 * would give every part and the whole an index signature (`[k: string]: unknown`) and let a
 * misspelt option through the compiler. In the TypeScript copy such an object, and each part
 * (an object with `properties` and no `additionalProperties` of its own), is closed instead;
 * the intersection of closed parts is the closed whole.
 */
function closeComposedObjects(node) {
  if (Array.isArray(node)) return node.forEach(closeComposedObjects);
  if (node === null || typeof node !== "object") return;
  if (node.unevaluatedProperties === false
      || (node.properties && !("additionalProperties" in node))) {
    node.additionalProperties = false;
  }
  Object.values(node).forEach(closeComposedObjects);
}

/** Every schema file by file name, each definition titled with the name of its type. */
function titledSchemas(schemaDir) {
  const docs = {};
  for (const file of readdirSync(schemaDir).filter((f) => f.endsWith(".json")).sort()) {
    const doc = JSON.parse(readFileSync(join(schemaDir, file), "utf8"));
    closeComposedObjects(doc);
    const stem = file.slice(0, -".json".length);
    for (const [key, definition] of Object.entries(doc.$defs)) {
      definition.title = stem === "common" ? COMMON_NAMES[key] ?? pascal(key)
        : stem === "error" ? "Error" + pascal(key) : pascal(stem) + pascal(key);
    }
    docs[file] = doc;
  }
  return docs;
}

/** One schema whose members reference every method's and notification's definitions. */
function rootSchema(docs) {
  const methods = {};
  const notifications = {};
  for (const [file, doc] of Object.entries(docs)) {
    const ref = (part) => ({ $ref: `${file}#/$defs/${part}` });
    const stem = file.slice(0, -".json".length);
    if (stem === "common" || stem === "error") continue;
    const parts = Object.keys(doc.$defs);
    const entry = { type: "object", additionalProperties: false, required: parts,
      properties: Object.fromEntries(parts.map((part) => [part, ref(part)])) };
    (parts.includes("result") ? methods : notifications)[stem] = entry;
  }
  const table = (title, description, members) => ({ title, description, type: "object",
    additionalProperties: false, required: Object.keys(members), properties: members });
  return {
    title: "BridgeProtocol",
    type: "object",
    additionalProperties: false,
    required: ["methods", "notifications", "error"],
    properties: {
      methods: table("Methods", "Every method: its params and result.", methods),
      notifications: table("Notifications", "Every notification (bridge to app): its params.",
        notifications),
      error: { $ref: "error.json#/$defs/data" },
      common: { type: "object", additionalProperties: false, properties: Object.fromEntries(
        Object.keys(docs["common.json"].$defs).map((key) => [key,
          { $ref: `common.json#/$defs/${key}` }])) },
    },
  };
}

/** The TypeScript source the schemas in `schemaDir` give. */
export async function generate(schemaDir = SCHEMA_DIR) {
  const docs = titledSchemas(schemaDir);
  return compile(rootSchema(docs), "BridgeProtocol", {
    bannerComment: BANNER,
    cwd: schemaDir,
    ignoreMinAndMaxItems: true, // arrays stay arrays (not tuples); the bridge checks the sizes
    $refOptions: {
      resolve: {
        file: false,
        http: false,
        schemas: {
          order: 1,
          canRead: (file) => basename(file.url) in docs,
          read: (file) => structuredClone(docs[basename(file.url)]),
        },
      },
    },
  });
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const source = await generate();
  if (process.argv.includes("--check")) {
    let committed = "";
    try { committed = readFileSync(OUTPUT, "utf8"); } catch { /* missing: a difference */ }
    if (committed !== source) {
      console.error(`${OUTPUT} differs from what bindings/schema/v1 gives: run npm run generate`);
      process.exit(1);
    }
  } else {
    writeFileSync(OUTPUT, source);
    console.log(`wrote ${OUTPUT}`);
  }
}
