import {
  AppendCommand,
  AppendCondition,
  AppendConditionError,
  DcbEvent,
  EventStore,
  Query,
  ReadOptions,
  SequencedEvent,
  SequencePosition,
  SubscribeOptions,
  Tags,
  ensureIsArray,
  validateAppendCondition,
} from "@dcb-es/event-store"
import { AnnalsError, AnnalsUnreachableError, Violation } from "./errors.js"

/** How an event's data and metadata are written to Annals and read back. */
export interface Codec {
  /** The text stored as the event's data. Default: JSON. */
  serialize: (event: DcbEvent) => string
  /** The event's data from the stored text. Default: JSON. */
  deserialize: (data: string, type: string) => unknown
}

export const jsonCodec: Codec = {
  // Data that JSON cannot write (undefined) is stored as null.
  serialize: event => JSON.stringify(event.data) ?? "null",
  deserialize: data => JSON.parse(data),
}

export interface AnnalsEventStoreOptions {
  /** The server, for example "http://127.0.0.1:7400". */
  url: string
  /** Sent as a bearer token with every request. */
  apiKey?: string
  /** How data is written and read. Default: JSON. */
  codec?: Codec
  /** The longest wait between attempts to take a dropped subscription up again. */
  maxBackoffMs?: number
}

/** An event as Annals answers it over HTTP (NDJSON lines of reads and subscriptions). */
interface WireEvent {
  type: string
  tags: string[]
  data: string
  dataEncoding?: "base64"
  metadata?: unknown
  metadataEncoding?: "base64"
  position: number
  erased?: boolean
}

interface WireQuery {
  items: { types: string[]; tags?: string[] }[]
}

/**
 * An `EventStore` of `@dcb-es/event-store` backed by an Annals server over its HTTP API.
 * Positions are Annals' own (`SequencePosition.fromString` of the decimal position), data is
 * stored as JSON text and metadata as Annals' JSON metadata, and a subscription follows the
 * server's live stream, taken up again after the last event delivered when the connection
 * drops.
 */
export class AnnalsEventStore implements EventStore {
  readonly #base: string
  readonly #headers: Record<string, string>
  readonly #codec: Codec
  readonly #maxBackoffMs: number

  constructor(options: AnnalsEventStoreOptions) {
    const base = new URL(options.url)
    if (base.protocol !== "http:" && base.protocol !== "https:") {
      throw new Error(`Annals: the server's URL ${options.url}: expected http:// or https://`)
    }
    this.#base = options.url.replace(/\/+$/, "")
    this.#headers = options.apiKey ? { authorization: `Bearer ${options.apiKey}` } : {}
    this.#codec = options.codec ?? jsonCodec
    this.#maxBackoffMs = options.maxBackoffMs ?? 5000
  }

  /**
   * Appends the events of every command, all or none, and answers the position of the last.
   * Each command's condition is judged against the log as it was before the call (never
   * against events of the same call). A failed one throws `AppendConditionError` naming the
   * command (`commandIndex`, when more than one was given).
   */
  async append(command: AppendCommand | AppendCommand[]): Promise<SequencePosition> {
    const commands = ensureIsArray(command)
    const events = commands.flatMap(c => ensureIsArray(c.events))
    if (events.length === 0) throw new Error("Cannot append zero events")
    const conditioned: { index: number; condition: AppendCondition }[] = []
    commands.forEach((c, index) => {
      if (c.condition) {
        validateAppendCondition(c.condition)
        conditioned.push({ index, condition: c.condition })
      }
    })
    const body = { events: events.map(e => this.#toWire(e)) }
    if (conditioned.length === 0) return this.#appended(await this.#post(body))
    // One condition guards the whole append: the union of every command's items, after the
    // earliest position any of them reads after. A conflict with an event that only a later
    // `after` allows is not one: the log through that event is checked against each command
    // (what it holds there never changes), and the append is sent again after it. Each such
    // read must come from a log that holds the conflicting event (`annals-head`): another
    // server of the same database may not have taken it in yet.
    const items = conditioned.flatMap(c => wireQuery(c.condition.failIfEventsMatch).items)
    let after = Math.min(...conditioned.map(c => positionOf(c.condition.after)))
    for (;;) {
      const answer = await this.#post({ ...body, condition: { failIfEventsMatch: { items }, after } })
      if (!answer.appendConditionFailed) return this.#appended(answer)
      const conflict: number = answer.conflictPosition
      const deadline = Date.now() + CATCH_UP_MS
      for (const { index, condition } of conditioned) {
        const first = await this.#firstThrough(condition.failIfEventsMatch, positionOf(condition.after), conflict, deadline)
        if (first !== undefined && first <= conflict) {
          throw new AppendConditionError(condition, commands.length > 1 ? index : undefined)
        }
      }
      after = conflict
    }
  }

  /** The events `query` matches, in order of position (newest first with `backwards`). */
  async *read(query: Query, options?: ReadOptions): AsyncGenerator<SequencedEvent> {
    const params = new URLSearchParams()
    if (!query.isAll) params.set("query", JSON.stringify(wireQuery(query)))
    const wireOptions: Record<string, unknown> = {}
    if (options?.after) wireOptions.after = positionOf(options.after)
    if (options?.backwards) wireOptions.backwards = true
    if (options?.limit) wireOptions.limit = options.limit
    if (Object.keys(wireOptions).length > 0) params.set("options", JSON.stringify(wireOptions))
    const controller = new AbortController()
    try {
      const response = await this.#request("GET", `/v1/read?${params}`, undefined, controller.signal)
      for await (const wire of lines(response, controller.signal, this.#base)) {
        yield this.#fromWire(wire)
      }
    } finally {
      controller.abort()
    }
  }

  /**
   * The events `query` matches after `options.after`: those in the log, then each one as it is
   * appended, until `options.signal` aborts (the generator then ends) or the consumer stops.
   * Annals pushes new events, so `pollIntervalMs` is not needed. A dropped connection is
   * taken up again after the last event delivered, each event delivered once, in order; a
   * refusal (a bad query, a missing key) is thrown.
   */
  async *subscribe(query: Query, options?: SubscribeOptions): AsyncGenerator<SequencedEvent> {
    const signal = options?.signal
    let last = positionOf(options?.after)
    let backoff = 100
    const params = new URLSearchParams()
    if (!query.isAll) params.set("query", JSON.stringify(wireQuery(query)))
    while (!signal?.aborted) {
      const controller = new AbortController()
      const abort = () => controller.abort()
      signal?.addEventListener("abort", abort, { once: true })
      try {
        params.set("after", String(last))
        const response = await this.#request("GET", `/v1/subscribe?${params}`, undefined, controller.signal)
        for await (const wire of lines(response, controller.signal, this.#base)) {
          if (wire.position <= last) continue
          // Read before it counts as delivered: an event that cannot be read is thrown, never
          // passed over.
          const event = this.#fromWire(wire)
          last = wire.position
          backoff = 100
          yield event
        }
      } catch (e) {
        if (signal?.aborted) return
        // A dropped or refused connection, or a server that is busy for now, is taken up
        // again; anything else (a refusal, an event that cannot be read) is the caller's.
        const retried = e instanceof AnnalsUnreachableError || (e instanceof AnnalsError && e.retryable)
        if (!retried) throw e
      } finally {
        signal?.removeEventListener("abort", abort)
        controller.abort()
      }
      await sleep(backoff / 2 + Math.random() * (backoff / 2), signal)
      backoff = Math.min(backoff * 2, this.#maxBackoffMs)
    }
  }

  /**
   * The first position after `after` that `query` matches, if any, read from a log that holds
   * position `through`: read again, waiting a little longer each time, while the server
   * answers from a log that ends before it (a read replica, or another server of the database,
   * that has not taken it in yet). An answer without `annals-head` is taken as it is. Past
   * `deadline` (a time in ms), throws `AnnalsError` (503 `reads_behind`): nothing was stored.
   */
  async #firstThrough(query: Query, after: number, through: number, deadline: number): Promise<number | undefined> {
    const params = new URLSearchParams({
      query: JSON.stringify(wireQuery(query)),
      options: JSON.stringify({ after, limit: 1 }),
    })
    for (let wait = 5; ; wait = Math.min(wait * 2, 200)) {
      const controller = new AbortController()
      try {
        const response = await this.#request("GET", `/v1/read?${params}`, undefined, controller.signal)
        const header = response.headers.get("annals-head")
        if (header === null || Number(header) >= through) {
          for await (const wire of lines(response, controller.signal, this.#base)) return wire.position
          return undefined
        }
        if (Date.now() > deadline) {
          throw new AnnalsError(
            503,
            "reads_behind",
            `${this.#base} failed the append's condition on position ${through}, and its reads ` +
              `still ended at ${header} after ${CATCH_UP_MS} ms; nothing was stored`,
          )
        }
      } finally {
        controller.abort()
      }
      await sleep(wait)
    }
  }

  async #post(body: unknown): Promise<any> {
    const response = await this.#request("POST", "/v1/append", body)
    try {
      return await response.json()
    } catch (e) {
      throw new AnnalsUnreachableError(this.#base, e)
    }
  }

  #appended(answer: { position: number }): SequencePosition {
    return SequencePosition.fromString(String(answer.position))
  }

  async #request(method: string, path: string, body?: unknown, signal?: AbortSignal): Promise<Response> {
    const headers: Record<string, string> = { ...this.#headers, accept: "application/x-ndjson" }
    if (body !== undefined) headers["content-type"] = "application/json"
    let response: Response
    try {
      response = await fetch(this.#base + path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        signal,
      })
    } catch (e) {
      if (signal?.aborted) throw e
      throw new AnnalsUnreachableError(this.#base, e)
    }
    if (!response.ok) {
      const text = await response.text()
      let answer: { error?: string; kind?: string; violations?: Violation[] } = {}
      try {
        answer = JSON.parse(text)
      } catch {
        answer = { error: text.trim(), kind: `http_${response.status}` }
      }
      throw new AnnalsError(
        response.status,
        answer.kind ?? `http_${response.status}`,
        answer.error ?? text,
        answer.violations ?? [],
      )
    }
    return response
  }

  #toWire(event: DcbEvent): Record<string, unknown> {
    if (!(event.tags instanceof Tags)) throw new Error("Annals: an event's tags must be Tags")
    const wire: Record<string, unknown> = {
      type: event.type,
      tags: event.tags.values,
      data: this.#codec.serialize(event),
    }
    if (event.metadata !== undefined) wire.metadata = event.metadata
    return wire
  }

  #fromWire(wire: WireEvent): SequencedEvent {
    const data =
      wire.dataEncoding === "base64" ? Buffer.from(wire.data, "base64").toString("utf8") : wire.data
    // Metadata that is not JSON (only the embedded library stores such) is given as its bytes.
    let metadata = wire.metadata
    if (wire.metadataEncoding === "base64" && typeof metadata === "string") {
      metadata = Buffer.from(metadata, "base64")
    }
    return {
      event: {
        type: wire.type,
        tags: Tags.from(wire.tags),
        data: wire.erased ? undefined : this.#codec.deserialize(data, wire.type),
        metadata,
      },
      position: SequencePosition.fromString(String(wire.position)),
    }
  }
}

function wireQuery(query: Query): WireQuery {
  if (query.isAll) return { items: [] }
  return {
    items: query.items.map(item => ({
      types: item.types,
      ...(item.tags && item.tags.length > 0 ? { tags: item.tags.values } : {}),
    })),
  }
}

function positionOf(position: SequencePosition | undefined): number {
  return position === undefined ? 0 : Number(position.toString())
}

/** The NDJSON lines of a response's body, parsed; a body cut off is the server unreachable. */
async function* lines(response: Response, signal: AbortSignal, base: string): AsyncGenerator<WireEvent> {
  if (!response.body) return
  const decoder = new TextDecoder()
  let pending = ""
  const chunks = response.body as unknown as AsyncIterable<Uint8Array>
  try {
    for await (const chunk of chunks) {
      pending += decoder.decode(chunk, { stream: true })
      let newline: number
      while ((newline = pending.indexOf("\n")) >= 0) {
        const line = pending.slice(0, newline).trim()
        pending = pending.slice(newline + 1)
        if (line.length > 0) yield JSON.parse(line) as WireEvent
      }
      if (signal.aborted) return
    }
  } catch (e) {
    if (signal.aborted) return
    throw new AnnalsUnreachableError(base, e)
  }
  if (pending.trim().length > 0) yield JSON.parse(pending) as WireEvent
}

/** How long an append waits for a read to show the event its condition failed on. */
const CATCH_UP_MS = 10_000

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise(resolve => {
    if (signal?.aborted) return resolve()
    const done = () => {
      clearTimeout(timer)
      signal?.removeEventListener("abort", done)
      resolve()
    }
    const timer = setTimeout(done, ms)
    signal?.addEventListener("abort", done, { once: true })
  })
}
