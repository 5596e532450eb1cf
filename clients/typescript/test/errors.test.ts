import { test } from "node:test"
import assert from "node:assert/strict"
import net from "node:net"
import { Query, Tags } from "@dcb-es/event-store"
import { AnnalsError, AnnalsEventStore, AnnalsUnreachableError } from "../src/index.js"
import { collect, event, store, unique } from "./helpers.js"

test("bad input gets the adapter's typed errors and stores nothing", async () => {
  const s = store()
  const type = unique("Bad")
  // A tag the library takes but the server refuses (longer than its limit).
  const long = { type, tags: Tags.from([`k=${"x".repeat(300)}`]), data: {}, metadata: {} }
  await assert.rejects(s.append({ events: long }), (e: unknown) => {
    assert.ok(e instanceof AnnalsError)
    assert.equal(e.status, 400)
    assert.equal(e.kind, "invalid_tag")
    assert.equal(e.retryable, false)
    return true
  })
  // An event over the server's size limit.
  const big = event(type, { k: "1" }, { blob: "x".repeat(2 << 20) })
  await assert.rejects(s.append({ events: big }), (e: unknown) => {
    assert.ok(e instanceof AnnalsError)
    assert.ok(["event_too_large", "body_too_large"].includes(e.kind), e.kind)
    return true
  })
  assert.deepEqual(await collect(s.read(Query.fromItems([{ types: [type] }]))), [])
  // A tag the library itself refuses never reaches the server.
  assert.throws(() => Tags.from(["has space"]), /Invalid tag/)
})

test("a server that is down is unreachable", async () => {
  const free = net.createServer()
  await new Promise<void>(resolve => free.listen(0, "127.0.0.1", resolve))
  const port = (free.address() as net.AddressInfo).port
  await new Promise<void>(resolve => free.close(() => resolve()))
  const down = new AnnalsEventStore({ url: `http://127.0.0.1:${port}` })
  await assert.rejects(down.append({ events: event("X", { k: "1" }) }), AnnalsUnreachableError)
  await assert.rejects(collect(down.read(Query.all())), AnnalsUnreachableError)
  assert.throws(() => new AnnalsEventStore({ url: "ftp://example" }), /http/)
})
