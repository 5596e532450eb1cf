import { test } from "node:test"
import assert from "node:assert/strict"
import { AppendConditionError, EventHandlerWithState, Query, Tags, buildDecisionModel } from "@dcb-es/event-store"
import { AnnalsEventStore } from "../src/index.js"
import { collect, event, store, unique } from "./helpers.js"

// The course subscription rule with the library's decision model: a course takes at most its
// capacity, a student at most a number of courses, decided together under one condition.

const courseCapacity = (type: string, course: string, capacity: number): EventHandlerWithState<any, { taken: number; capacity: number }> => ({
  tagFilter: Tags.fromObj({ course }),
  init: { taken: 0, capacity },
  when: { [type]: (_e: unknown, state: { taken: number; capacity: number }) => ({ ...state, taken: state.taken + 1 }) },
})

const studentLimit = (type: string, student: string): EventHandlerWithState<any, number> => ({
  tagFilter: Tags.fromObj({ student }),
  init: 0,
  when: { [type]: (_e: unknown, n: number) => n + 1 },
})

async function subscribe(s: AnnalsEventStore, type: string, course: string, student: string, capacity = 3, limit = 5): Promise<"subscribed" | "full" | "busy"> {
  for (let attempt = 0; attempt < 20; attempt++) {
    const { state, appendCondition } = await buildDecisionModel(s, {
      course: courseCapacity(type, course, capacity),
      student: studentLimit(type, student),
    })
    if (state.course.taken >= state.course.capacity) return "full"
    if (state.student >= limit) return "busy"
    try {
      await s.append({ events: event(type, { course, student }), condition: appendCondition })
      return "subscribed"
    } catch (e) {
      if (!(e instanceof AppendConditionError)) throw e
    }
  }
  throw new Error("the decision kept conflicting")
}

test("the decision model reads after the last event it folded", async () => {
  const s = store()
  const type = unique("Subscribed")
  const course = unique("c")
  const empty = await buildDecisionModel(s, { course: courseCapacity(type, course, 3) })
  assert.equal(empty.appendCondition.after?.toString(), "0")
  const p = await s.append({ events: event(type, { course, student: "s1" }) })
  const one = await buildDecisionModel(s, { course: courseCapacity(type, course, 3) })
  assert.ok(one.appendCondition.after?.equals(p))
  assert.equal(one.state.course.taken, 1)
})

test("the last seat goes to exactly one of the students racing for it", async () => {
  const s = store()
  const type = unique("Subscribed")
  const course = unique("c")
  assert.equal(await subscribe(s, type, course, "early1"), "subscribed")
  assert.equal(await subscribe(s, type, course, "early2"), "subscribed")
  const outcomes = await Promise.all(Array.from({ length: 8 }, (_, i) => subscribe(s, type, course, `racer${i}`)))
  assert.equal(outcomes.filter(o => o === "subscribed").length, 1)
  assert.equal(outcomes.filter(o => o === "full").length, 7)
  const inCourse = await collect(s.read(Query.fromItems([{ types: [type], tags: Tags.fromObj({ course }) }])))
  assert.equal(inCourse.length, 3)
})

test("a student's limit holds across courses", async () => {
  const s = store()
  const type = unique("Subscribed")
  const student = unique("s")
  assert.equal(await subscribe(s, type, unique("c"), student, 10, 2), "subscribed")
  assert.equal(await subscribe(s, type, unique("c"), student, 10, 2), "subscribed")
  assert.equal(await subscribe(s, type, unique("c"), student, 10, 2), "busy")
})
