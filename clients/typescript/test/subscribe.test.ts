import { test } from "node:test"
import assert from "node:assert/strict"
import net from "node:net"
import { Query, SequencedEvent } from "@dcb-es/event-store"
import { AnnalsEventStore } from "../src/index.js"
import { event, serverUrl, store, unique } from "./helpers.js"

/** Takes `count` events of a subscription, calling `onEach` after each; then stops it. */
async function take(events: AsyncGenerator<SequencedEvent>, count: number, onEach: (i: number) => Promise<void> = async () => {}) {
  const out: SequencedEvent[] = []
  for await (const e of events) {
    out.push(e)
    await onEach(out.length)
    if (out.length === count) break
  }
  return out
}

test("a subscription delivers the log's events, then new ones as they are appended", async () => {
  const s = store()
  const type = unique("Live")
  const q = Query.fromItems([{ types: [type] }])
  const first = await s.append({ events: event(type, { n: "A" }) })
  await s.append({ events: event(type, { n: "B" }) })
  const seen = await take(s.subscribe(q), 4, async i => {
    if (i === 2) await s.append({ events: [event(type, { n: "C" }), event(type, { n: "D" })] })
  })
  assert.deepEqual(seen.map(e => e.event.tags.values[0]), ["n=A", "n=B", "n=C", "n=D"])
  for (let i = 1; i < seen.length; i++) assert.ok(seen[i].position.isAfter(seen[i - 1].position))
  // After is exclusive.
  const after = await take(s.subscribe(q, { after: first }), 1)
  assert.equal(after[0].event.tags.values[0], "n=B")
})

test("a subscription on nothing yet waits for the first event", async () => {
  const s = store()
  const type = unique("Waited")
  setTimeout(() => void s.append({ events: event(type, { n: "1" }) }), 200)
  const seen = await take(s.subscribe(Query.fromItems([{ types: [type] }])), 1)
  assert.equal(seen[0].event.type, type)
})

test("an aborted signal ends the subscription normally", async () => {
  const s = store()
  const type = unique("Aborted")
  await s.append({ events: event(type, { n: "1" }) })
  const controller = new AbortController()
  const seen: SequencedEvent[] = []
  for await (const e of s.subscribe(Query.fromItems([{ types: [type] }]), { signal: controller.signal })) {
    seen.push(e)
    setTimeout(() => controller.abort(), 50)
  }
  assert.equal(seen.length, 1)
})

test("two subscriptions each get every event; a filtered one only its own", async () => {
  const s = store()
  const [type, other] = [unique("Shared"), unique("Unshared")]
  const q = Query.fromItems([{ types: [type] }])
  const both = Promise.all([take(s.subscribe(q), 2), take(s.subscribe(q), 2)])
  await new Promise(r => setTimeout(r, 100))
  await s.append({ events: [event(other, { n: "x" }), event(type, { n: "1" }), event(other, { n: "y" }), event(type, { n: "2" })] })
  for (const seen of await both) assert.deepEqual(seen.map(e => e.event.tags.values[0]), ["n=1", "n=2"])
})

test("a subscription stopped by its consumer releases its stream", async () => {
  const s = store()
  const type = unique("Released")
  await s.append({ events: event(type, { n: "1" }) })
  const subscribers = async () => {
    const stats = await fetch(`${serverUrl()}/v1/admin/stats`)
    return ((await stats.json()) as { subscribers: number }).subscribers
  }
  const before = await subscribers()
  await take(s.subscribe(Query.fromItems([{ types: [type] }])), 1)
  for (let i = 0; i < 50 && (await subscribers()) > before; i++) await new Promise(r => setTimeout(r, 50))
  assert.equal(await subscribers(), before)
})

test("a subscription takes up a dropped connection again, each event once and in order", async () => {
  const target = new URL(serverUrl())
  const sockets = new Set<net.Socket>()
  const proxy = net.createServer(client => {
    const upstream = net.connect(Number(target.port), target.hostname)
    for (const socket of [client, upstream]) {
      sockets.add(socket)
      socket.on("error", () => {})
      socket.on("close", () => sockets.delete(socket))
    }
    client.pipe(upstream)
    upstream.pipe(client)
  })
  await new Promise<void>(resolve => proxy.listen(0, "127.0.0.1", resolve))
  const port = (proxy.address() as net.AddressInfo).port
  try {
    const direct = store()
    const through = new AnnalsEventStore({ url: `http://127.0.0.1:${port}` })
    const type = unique("Dropped")
    await direct.append({ events: event(type, { n: "0" }) })
    const seen = await take(through.subscribe(Query.fromItems([{ types: [type] }])), 4, async i => {
      if (i === 1) await direct.append({ events: event(type, { n: "1" }) })
      if (i === 2) {
        for (const socket of sockets) socket.destroy()
        await direct.append({ events: [event(type, { n: "2" }), event(type, { n: "3" })] })
      }
    })
    assert.deepEqual(seen.map(e => e.event.tags.values[0]), ["n=0", "n=1", "n=2", "n=3"])
  } finally {
    for (const socket of sockets) socket.destroy()
    proxy.close()
  }
})

test("an event the codec cannot read is thrown, never passed over", async () => {
  const s = store()
  const type = unique("Unreadable")
  // Written by another client: data that is not JSON.
  const body = { events: [{ type, tags: ["n=1"], data: "not json" }, { type, tags: ["n=2"], data: "{}" }] }
  const written = await fetch(`${serverUrl()}/v1/append`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  })
  assert.equal(written.status, 200)
  const q = Query.fromItems([{ types: [type] }])
  await assert.rejects(take(s.subscribe(q), 2), SyntaxError)
  await assert.rejects(take(s.read(q) as AsyncGenerator<SequencedEvent>, 2), SyntaxError)
})
