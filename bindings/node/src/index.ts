/** @specsteer/bridge: spawn the SpecSteer bridge and generate personalized text from Node. */
export { PROTOCOL_VERSION, SpecSteerClient } from "./client.js";
export type { ClientOptions, GenerateOptions, Generation } from "./client.js";
export { BridgeError, BridgeExitedError, BridgeStartError, ErrorCodes } from "./errors.js";
export type * from "./types.js";
