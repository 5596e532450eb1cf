import { test } from "node:test"
import assert from "node:assert/strict"
import { Query, SequencePosition, Tags } from "@dcb-es/event-store"
import { collect, event, n, store, unique } from "./helpers.js"

/** Appends A(e=1), B(e=2), B(e=3) of fresh types; answers the types and positions. */
async function abb() {
  const s = store()
  const [a, b] = [unique("A"), unique("B")]
  await s.append({ events: event(a, { e: "1" }) })
  const p2 = await s.append({ events: event(b, { e: "2" }) })
  const p3 = await s.append({ events: event(b, { e: "3" }) })
  return { s, a, b, p2, p3 }
}

const tagOf = (e: { event: { tags: Tags } }) => e.event.tags.values[0]

test("reads are in order of position, and newest first backwards", async () => {
  const s = store()
  const type = unique("Ordered")
  for (let i = 1; i <= 10; i++) await s.append({ events: event(type, { i: String(i) }) })
  const q = Query.fromItems([{ types: [type] }])
  const forwards = await collect(s.read(q))
  assert.deepEqual(forwards.map(tagOf), Array.from({ length: 10 }, (_, i) => `i=${i + 1}`))
  for (let i = 1; i < forwards.length; i++) assert.ok(forwards[i].position.isAfter(forwards[i - 1].position))
  const backwards = await collect(s.read(q, { backwards: true }))
  assert.deepEqual(backwards.map(tagOf), Array.from({ length: 10 }, (_, i) => `i=${10 - i}`))
})

test("limit, with and without backwards and after", async () => {
  const { s, b, p2, p3 } = await abb()
  const q = Query.fromItems([{ types: [b] }])
  assert.deepEqual((await collect(s.read(q, { limit: 1 }))).map(tagOf), ["e=2"])
  assert.deepEqual((await collect(s.read(q, { limit: 1, backwards: true }))).map(tagOf), ["e=3"])
  const afterFirst = await collect(s.read(q, { after: p2, limit: 1 }))
  assert.ok(afterFirst[0].position.equals(p3))
  assert.equal((await collect(s.read(q, { limit: 3 }))).length, 2)
})

test("after is exclusive; backwards it reads before it", async () => {
  const s = store()
  const type = unique("Five")
  const positions = []
  for (let i = 1; i <= 5; i++) positions.push(await s.append({ events: event(type, { i: String(i) }) }))
  const q = Query.fromItems([{ types: [type] }])
  const after2 = await collect(s.read(q, { after: positions[1] }))
  assert.equal(after2.length, 3)
  assert.ok(after2[0].position.equals(positions[2]))
  assert.deepEqual(await collect(s.read(q, { after: SequencePosition.fromString("999999999999") })), [])
  const before3 = await collect(s.read(q, { after: positions[2], backwards: true }))
  assert.deepEqual(before3.map(tagOf), ["i=2", "i=1"])
  assert.deepEqual(await collect(s.read(q, { after: positions[0], backwards: true })), [])
})

test("types and tags select; items are OR-ed without duplicates", async () => {
  const s = store()
  const [one, two, three] = [unique("One"), unique("Two"), unique("Three")]
  await s.append({ events: [event(one, { k: "v1" }), event(two, { k: "v2" }), event(three, { k: "v1" })] })
  const byTag = await collect(s.read(Query.fromItems([{ types: [one, two, three], tags: Tags.fromObj({ k: "v1" }) }])))
  assert.deepEqual(byTag.map(e => e.event.type), [one, three])
  assert.deepEqual(await collect(s.read(Query.fromItems([{ types: [one], tags: Tags.fromObj({ k: "none" }) }]))), [])
  const items = await collect(
    s.read(Query.fromItems([{ types: [two] }, { types: [one, two] }, { types: [three], tags: Tags.fromObj({ k: "v1" }) }])),
  )
  assert.deepEqual(items.map(e => e.event.type), [one, two, three])
})

test("reads see appends made between them", async () => {
  const s = store()
  const type = unique("Interleaved")
  const q = Query.fromItems([{ types: [type] }])
  assert.deepEqual(await collect(s.read(q)), [])
  await s.append({ events: event(type, { n: "1" }) })
  assert.equal((await collect(s.read(q))).length, 1)
  await s.append({ events: event(type, { n: "2" }) })
  assert.equal((await collect(s.read(q))).length, 2)
  assert.equal((await collect(s.read(q))).length, 2)
})

test("a read stopped early lets go of its answer", async () => {
  const s = store()
  const type = unique("Many")
  await s.append({ events: Array.from({ length: 500 }, (_, i) => event(type, { i: String(i) }, { pad: "x".repeat(200) })) })
  let seen = 0
  for await (const _ of s.read(Query.fromItems([{ types: [type] }]))) {
    if (++seen === 3) break
  }
  assert.equal(seen, 3)
  const all = await collect(s.read(Query.all(), { backwards: true, limit: 1 }))
  assert.equal(all.length, 1)
  assert.ok(n(all[0].position) >= 500)
})
