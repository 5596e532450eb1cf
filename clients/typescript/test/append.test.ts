import { test } from "node:test"
import assert from "node:assert/strict"
import { AppendCondition, AppendConditionError, Query, SequencePosition, Tags } from "@dcb-es/event-store"
import { AnnalsEventStore } from "../src/index.js"
import { balancer, collect, event, n, store, unique } from "./helpers.js"

test("appends answer the position of their last event, one after another", async () => {
  const s = store()
  const type = unique("Counted")
  const first = await s.append({ events: event(type, { k: "1" }) })
  const second = await s.append({ events: event(type, { k: "2" }) })
  assert.equal(n(second), n(first) + 1)
  const batch = await s.append({ events: [event(type, { k: "3" }), event(type, { k: "4" })] })
  assert.equal(n(batch), n(second) + 2)
  const hundred = await s.append({ events: Array.from({ length: 100 }, (_, i) => event(type, { i: String(i) })) })
  assert.equal(n(hundred), n(batch) + 100)
})

test("an append of no events is refused", async () => {
  const s = store()
  await assert.rejects(s.append({ events: [] }), /Cannot append zero events/)
  await assert.rejects(s.append([]), /Cannot append zero events/)
})

test("type, tags, data and metadata come back as they were given", async () => {
  const s = store()
  const type = unique("RoundTrip")
  const data = {
    nested: { list: [1, 2, { deep: null }], unicode: "žluťoučký kůň 🐎", escapes: "tab\tnewline\ncrlf\r\nback\\slash \"quoted\"" },
    nothing: null,
  }
  const metadata = { correlationId: "c-1", causation: { id: 7 } }
  const tags = Array.from({ length: 30 }, (_, i) => `t${i}=v${i}`)
  const position = await s.append({ events: { type, tags: Tags.from(tags), data, metadata } })
  const [read] = await collect(s.read(Query.fromItems([{ types: [type] }])))
  assert.equal(read.event.type, type)
  assert.ok(read.event.tags.equals(Tags.from(tags)))
  assert.deepEqual(read.event.data, data)
  assert.deepEqual(read.event.metadata, metadata)
  assert.ok(read.position.equals(position))
  const empty = await s.append({ events: event(type, { e: "1" }, {}, {}) })
  const [emptyRead] = await collect(s.read(Query.fromItems([{ types: [type], tags: Tags.from(["e=1"]) }])))
  assert.ok(emptyRead.position.equals(empty))
  assert.deepEqual(emptyRead.event.data, {})
  assert.deepEqual(emptyRead.event.metadata, {})
})

test("a condition counts only events after its position", async () => {
  const s = store()
  const type = unique("Guarded")
  const tags = Tags.fromObj({ entity: "e1" })
  const existing = await s.append({ events: event(type, { entity: "e1" }) })
  const query = Query.fromItems([{ types: [type], tags }])
  const appended = await s.append({ events: event(type, { entity: "e1" }), condition: { failIfEventsMatch: query, after: existing } })
  assert.equal(n(appended), n(existing) + 1)
  const condition: AppendCondition = { failIfEventsMatch: query, after: existing }
  await assert.rejects(s.append({ events: event(type, { entity: "e1" }), condition }), (e: unknown) => {
    assert.ok(e instanceof AppendConditionError)
    assert.ok(e instanceof Error)
    assert.equal(e.name, "AppendConditionError")
    assert.equal(e.appendCondition, condition)
    assert.equal(e.commandIndex, undefined)
    return true
  })
  // Without a position, every event counts.
  await assert.rejects(s.append({ events: event(type, { entity: "e1" }), condition: { failIfEventsMatch: query } }), AppendConditionError)
  await assert.rejects(
    s.append({ events: event(type, { entity: "e1" }), condition: { failIfEventsMatch: query, after: SequencePosition.initial() } }),
    AppendConditionError,
  )
})

test("another tag or type does not conflict; tags match by containment; items are OR-ed", async () => {
  const s = store()
  const type = unique("Scoped")
  await s.append({ events: event(type, { entity: "E1", region: "EU" }) })
  const condition = (items: { types: string[]; tags: Record<string, string> }[]) => ({
    failIfEventsMatch: Query.fromItems(items.map(i => ({ types: i.types, tags: Tags.fromObj(i.tags) }))),
  })
  const free = [
    condition([{ types: [type], tags: { entity: "E2" } }]),
    condition([{ types: [unique("Other")], tags: { entity: "E1" } }]),
    condition([{ types: [type], tags: { entity: "E1", region: "US" } }]),
  ]
  for (const c of free) await s.append({ events: event(unique("Free"), { x: "1" }), condition: c })
  const caught = [
    condition([{ types: [type], tags: { entity: "E1" } }]),
    condition([{ types: [type], tags: { entity: "E1", region: "EU" } }]),
    condition([{ types: [type], tags: { entity: "E9" } }, { types: [type], tags: { region: "EU" } }]),
  ]
  for (const c of caught) await assert.rejects(s.append({ events: event(unique("Caught"), { x: "1" }), condition: c }), AppendConditionError)
})

test("a condition must be scoped: the library's own validation", async () => {
  const s = store()
  await assert.rejects(s.append({ events: event("X", { a: "1" }), condition: { failIfEventsMatch: Query.all() } }), /Query.all\(\) is not supported/)
  await assert.rejects(
    s.append({ events: event("X", { a: "1" }), condition: { failIfEventsMatch: Query.fromItems([{ types: ["X"] }]) } }),
    /at least one type and one tag/,
  )
})

test("several commands append all or nothing, each condition judged against the log before the call", async () => {
  const s = store()
  const type = unique("Multi")
  const q = (tag: string) => Query.fromItems([{ types: [type], tags: Tags.from([tag]) }])
  const before = await s.append({ events: event(type, ["k=0"]) })
  // Each guards its own tag: neither sees the other's event of the same call.
  const both = await s.append([
    { events: event(type, ["k=1"]), condition: { failIfEventsMatch: q("k=1"), after: before } },
    { events: event(type, ["k=2"]), condition: { failIfEventsMatch: q("k=2"), after: before } },
  ])
  assert.equal(n(both), n(before) + 2)
  // The second command's condition fails: nothing of either is appended.
  const failing: AppendCondition = { failIfEventsMatch: q("k=0"), after: SequencePosition.initial() }
  await assert.rejects(
    s.append([{ events: event(type, ["k=3"]) }, { events: event(type, ["k=4"]), condition: failing }]),
    (e: unknown) => e instanceof AppendConditionError && e.commandIndex === 1 && e.appendCondition === failing,
  )
  const all = await collect(s.read(Query.fromItems([{ types: [type] }])))
  assert.deepEqual(all.map(e => e.event.tags.values[0]), ["k=0", "k=1", "k=2"])
  // Conditions reading after different positions: an event only the earlier one would see
  // does not fail the later one.
  const late = await s.append({ events: event(type, ["k=5"]) })
  const mixed = await s.append([
    { events: event(type, ["k=6"]), condition: { failIfEventsMatch: q("k=9"), after: SequencePosition.initial() } },
    { events: event(type, ["k=7"]), condition: { failIfEventsMatch: q("k=5"), after: late } },
  ])
  assert.equal(n(mixed), n(late) + 2)
})

test("a large import of many commands", async () => {
  const s = store()
  const type = unique("Meter")
  const commands = Array.from({ length: 100 }, (_, m) => ({
    events: Array.from({ length: 11 }, (_, f) => event(type, { meter: `m${m}`, field: `f${f}` })),
    condition: { failIfEventsMatch: Query.fromItems([{ types: [type], tags: Tags.fromObj({ meter: `m${m}` }) }]) },
  }))
  const last = await s.append(commands)
  const all = await collect(s.read(Query.fromItems([{ types: [type] }])))
  assert.equal(all.length, 1100)
  assert.ok(all[1099].position.equals(last))
})

test("concurrent appends: all unconditional ones go in, one of ten racing for a scope wins", async () => {
  const s = store()
  const type = unique("Raced")
  const plain = await Promise.allSettled(Array.from({ length: 50 }, (_, i) => s.append({ events: event(type, { i: String(i) }) })))
  assert.equal(plain.filter(r => r.status === "fulfilled").length, 50)
  const scope = Query.fromItems([{ types: [type], tags: Tags.fromObj({ scope: "one" }) }])
  const raced = await Promise.allSettled(
    Array.from({ length: 10 }, () =>
      s.append({ events: event(type, { scope: "one" }), condition: { failIfEventsMatch: scope, after: SequencePosition.initial() } }),
    ),
  )
  assert.equal(raced.filter(r => r.status === "fulfilled").length, 1)
  for (const r of raced) if (r.status === "rejected") assert.ok(r.reason instanceof AppendConditionError)
  assert.equal((await collect(s.read(scope))).length, 1)
})

test("behind a balancer that reads from a server taking appends in later, one of ten racing for a scope wins", async t => {
  const front = await balancer()
  if (!front) return t.skip("the test command started one server")
  try {
    // Appends go to one server and reads to another (a read replica, or a second server of the
    // database), which takes the first's appends in later: the adapter must not take a read
    // that ends before the conflict it was answered with as showing none.
    const s = new AnnalsEventStore({ url: front.url })
    const type = unique("Balanced")
    for (let round = 0; round < 5; round++) {
      const scope = Query.fromItems([{ types: [type], tags: Tags.fromObj({ scope: `s${round}` }) }])
      const raced = await Promise.allSettled(
        Array.from({ length: 10 }, () =>
          s.append({
            events: event(type, { scope: `s${round}` }),
            condition: { failIfEventsMatch: scope, after: SequencePosition.initial() },
          }),
        ),
      )
      for (const r of raced) if (r.status === "rejected") assert.ok(r.reason instanceof AppendConditionError, String(r.reason))
      assert.equal(raced.filter(r => r.status === "fulfilled").length, 1, `round ${round}`)
    }
  } finally {
    await front.close()
  }
})
