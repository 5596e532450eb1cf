export { AnnalsEventStore, jsonCodec } from "./AnnalsEventStore.js"
export type { AnnalsEventStoreOptions, Codec } from "./AnnalsEventStore.js"
export { AnnalsError, AnnalsUnreachableError } from "./errors.js"
export type { Violation } from "./errors.js"
