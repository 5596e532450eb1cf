import { randomBytes } from "node:crypto"
import { createServer, request } from "node:http"
import { AddressInfo } from "node:net"
import { pipeline } from "node:stream"
import { DcbEvent, Tags } from "@dcb-es/event-store"
import { AnnalsEventStore } from "../src/index.js"

/** The server the tests run against: ANNALS_URL, started by the project's test command. */
export function serverUrl(): string {
  const url = process.env.ANNALS_URL
  if (!url) throw new Error("ANNALS_URL names no server (the project's test command starts one)")
  return url
}

/**
 * A balancer in front of two servers of one log, as a deployment may put one: appends go to
 * ANNALS_URL, every other request to ANNALS_SECOND_URL (a read replica, or a second server of
 * the database). Undefined when the test command started no second server.
 */
export async function balancer(): Promise<{ url: string; close: () => Promise<void> } | undefined> {
  const second = process.env.ANNALS_SECOND_URL
  if (!second) return undefined
  const appends = new URL(serverUrl())
  const others = new URL(second)
  const server = createServer((incoming, outgoing) => {
    const to = incoming.method === "POST" && incoming.url?.startsWith("/v1/append") ? appends : others
    const forwarded = request(
      { host: to.hostname, port: to.port, path: incoming.url, method: incoming.method, headers: incoming.headers },
      answer => {
        outgoing.writeHead(answer.statusCode ?? 502, answer.headers)
        pipeline(answer, outgoing, () => {})
      },
    )
    forwarded.on("error", e => outgoing.destroy(e))
    // A client that lets go of its answer early (a read of one event) lets go of the server's.
    outgoing.on("close", () => forwarded.destroy())
    pipeline(incoming, forwarded, () => {})
  })
  await new Promise<void>(resolve => server.listen(0, "127.0.0.1", resolve))
  const { port } = server.address() as AddressInfo
  return {
    url: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>(resolve => {
        server.closeAllConnections()
        server.close(() => resolve())
      }),
  }
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
