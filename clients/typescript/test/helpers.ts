import { randomBytes } from "node:crypto"
import { DcbEvent, Tags } from "@dcb-es/event-store"
import { AnnalsEventStore } from "../src/index.js"

/** The server the tests run against: ANNALS_URL, started by the project's test command. */
export function serverUrl(): string {
  const url = process.env.ANNALS_URL
  if (!url) throw new Error("ANNALS_URL names no server (the project's test command starts one)")
  return url
}

export function store(): AnnalsEventStore {
  return new AnnalsEventStore({ url: serverUrl() })
}

/** A name no other test (or earlier run against the same server) uses. */
export function unique(prefix: string): string {
  return `${prefix}_${randomBytes(6).toString("hex")}`
}

export function event(type: string, tags: Record<string, string> | string[], data: unknown = {}, metadata: unknown = {}): DcbEvent {
  return {
    type,
    tags: Array.isArray(tags) ? Tags.from(tags) : Tags.fromObj(tags),
    data,
    metadata,
  }
}

export async function collect<T>(items: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = []
  for await (const item of items) out.push(item)
  return out
}

/** Positions as numbers, to compare across a server whose log other tests share. */
export const n = (p: { toString(): string }): number => Number(p.toString())
