//! Shared test support: a reference model of DCB and the check functions every harness uses.
//! Checks return `Err(description)` rather than panicking, so the canary tests can assert that
//! a deliberately broken store is caught.

#![allow(dead_code)]

use std::collections::{BTreeSet, HashMap};

use annals::{AppendCondition, Event, NewEvent, Query, QueryItem, ReadOptions, Store};

/// An event as the model keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelEvent {
    pub event_type: String,
    pub tags: Vec<String>,
    pub data: Vec<u8>,
}

impl ModelEvent {
    pub fn from_new(e: &NewEvent) -> Self {
        ModelEvent {
            event_type: e.event_type.clone(),
            tags: e.tags.clone(),
            data: e.data.to_vec(),
        }
    }

    pub fn from_stored(e: &Event) -> Self {
        ModelEvent {
            event_type: e.event_type().to_owned(),
            tags: e.tags().map(str::to_owned).collect(),
            data: e.data().to_vec(),
        }
    }
}

/// The reference model: a Vec of events and brute-force DCB.
#[derive(Debug, Default, Clone)]
pub struct Model {
    pub events: Vec<ModelEvent>,
}

impl Model {
    pub fn matches(query: &Query, e: &ModelEvent) -> bool {
        query.matches(&e.event_type, e.tags.iter().map(String::as_str))
    }

    /// Appends if the condition holds; Err(first conflicting position) otherwise.
    pub fn append(
        &mut self,
        events: &[NewEvent],
        condition: Option<&AppendCondition>,
    ) -> Result<u64, u64> {
        if let Some(c) = condition {
            let after = c.after.unwrap_or(0);
            for (i, e) in self.events.iter().enumerate() {
                let position = i as u64 + 1;
                if position > after && Self::matches(&c.fail_if_events_match, e) {
                    return Err(position);
                }
            }
        }
        self.events.extend(events.iter().map(ModelEvent::from_new));
        Ok(self.events.len() as u64)
    }

    pub fn read(&self, query: &Query, options: ReadOptions) -> Vec<(u64, ModelEvent)> {
        let head = self.events.len() as u64;
        let mut out: Vec<(u64, ModelEvent)> = self
            .events
            .iter()
            .enumerate()
            .map(|(i, e)| (i as u64 + 1, e.clone()))
            .filter(|(p, e)| {
                let in_range = if options.backwards {
                    let max = match (options.from, options.after) {
                        (Some(f), _) => f,
                        (_, Some(a)) => a.saturating_sub(1),
                        _ => head,
                    };
                    *p <= max
                } else {
                    let min = match (options.from, options.after) {
                        (Some(f), _) => f,
                        (_, Some(a)) => a.saturating_add(1),
                        _ => 1,
                    };
                    *p >= min
                };
                in_range && Self::matches(query, e)
            })
            .collect();
        if options.backwards {
            out.reverse();
        }
        if let Some(limit) = options.limit {
            out.truncate(limit as usize);
        }
        out
    }
}

pub fn read_all(store: &Store, query: &Query, options: ReadOptions) -> Result<Vec<Event>, String> {
    store
        .read(query, options)
        .map_err(|e| format!("read failed: {e}"))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("read failed: {e}"))
}

/// Every event of `store` as (position, append time, type, tags, data, id).
#[allow(clippy::type_complexity)]
pub fn event_list(
    store: &Store,
) -> Vec<(u64, u64, String, Vec<String>, Vec<u8>, Option<uuid::Uuid>)> {
    store
        .read(&Query::all(), ReadOptions::forwards())
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.position(),
                e.appended_at_us(),
                e.event_type().to_owned(),
                e.tags().map(str::to_owned).collect(),
                e.data().to_vec(),
                e.id(),
            )
        })
        .collect()
}

/// The queries worth asking of a store: every type, every tag, pairs, unions and everything.
pub fn probe_queries(events: &[ModelEvent]) -> Vec<Query> {
    let types: BTreeSet<&String> = events.iter().map(|e| &e.event_type).collect();
    let tags: BTreeSet<&String> = events.iter().flat_map(|e| e.tags.iter()).collect();
    let mut queries = vec![Query::all(), Query::item(QueryItem::tags(["no-such-tag"]))];
    for t in &types {
        queries.push(Query::item(QueryItem::types([t.as_str()])));
    }
    for t in tags.iter().take(40) {
        queries.push(Query::item(QueryItem::tags([t.as_str()])));
        for ty in types.iter().take(3) {
            queries.push(Query::item(
                QueryItem::types([ty.as_str(), "Unknown"]).and_tags([t.as_str()]),
            ));
        }
    }
    let tag_list: Vec<&&String> = tags.iter().collect();
    for pair in tag_list.windows(2).take(20) {
        queries.push(Query::item(QueryItem::tags([
            pair[0].as_str(),
            pair[1].as_str(),
        ])));
        queries.push(
            Query::item(QueryItem::tags([pair[0].as_str()]))
                .or(QueryItem::tags([pair[1].as_str()])),
        );
    }
    queries
}

fn describe(events: &[(u64, ModelEvent)]) -> Vec<u64> {
    events.iter().map(|(p, _)| *p).collect()
}

/// Compares every probe read of `store` with the model, forwards and backwards, with limits and
/// starting points.
pub fn check_against_model(store: &Store, model: &Model) -> Result<(), String> {
    let head = model.events.len() as u64;
    if store.head() != head {
        return Err(format!("head is {}, the model says {head}", store.head()));
    }
    let mut option_sets = vec![ReadOptions::forwards(), ReadOptions::backwards()];
    for p in [1, head / 2, head, head + 3] {
        option_sets.push(ReadOptions::forwards().from(p));
        option_sets.push(ReadOptions::backwards().from(p));
        option_sets.push(ReadOptions::forwards().after(p).limit(3));
        option_sets.push(ReadOptions::backwards().from(p).limit(2));
    }
    for query in probe_queries(&model.events) {
        for options in &option_sets {
            let expected = model.read(&query, *options);
            let got: Vec<(u64, ModelEvent)> = read_all(store, &query, *options)?
                .iter()
                .map(|e| (e.position(), ModelEvent::from_stored(e)))
                .collect();
            if got != expected {
                return Err(format!(
                    "read {query:?} {options:?}: got positions {:?}, expected {:?}",
                    describe(&got),
                    describe(&expected)
                ));
            }
        }
    }
    Ok(())
}

/// Checks that indexed reads answer exactly as a filtered full scan does.
pub fn check_index_matches_scan(store: &Store) -> Result<(), String> {
    let all = read_all(store, &Query::all(), ReadOptions::forwards())?;
    let events: Vec<(u64, ModelEvent)> = all
        .iter()
        .map(|e| (e.position(), ModelEvent::from_stored(e)))
        .collect();
    for (i, (p, _)) in events.iter().enumerate() {
        if *p != i as u64 + 1 {
            return Err(format!("positions are not gapless: found {p} at index {i}"));
        }
    }
    if events.len() as u64 != store.head() {
        return Err(format!(
            "full scan found {} events, head is {}",
            events.len(),
            store.head()
        ));
    }
    let model = Model {
        events: events.into_iter().map(|(_, e)| e).collect(),
    };
    for query in probe_queries(&model.events) {
        for options in [ReadOptions::forwards(), ReadOptions::backwards()] {
            let expected: Vec<u64> = describe(&model.read(&query, options));
            let got: Vec<u64> = read_all(store, &query, options)?
                .iter()
                .map(Event::position)
                .collect();
            if got != expected {
                return Err(format!(
                    "index answer for {query:?} {options:?}: {got:?}, scan says {expected:?}"
                ));
            }
        }
    }
    Ok(())
}

/// Every append a harness made: its events (data carries "append-id/index/count") and, once
/// acknowledged, the position it was given.
#[derive(Debug, Default, Clone)]
pub struct Ledger {
    pub appends: HashMap<u64, (Vec<ModelEvent>, Option<u64>)>,
}

/// Builds the events of append `id`: each one's data names the append, its index and the count.
pub fn tracked_events(id: u64, count: usize, tags: &[String]) -> Vec<NewEvent> {
    (0..count)
        .map(|i| {
            NewEvent::new(
                if i % 2 == 0 { "Even" } else { "Odd" },
                format!("{id}/{i}/{count}").into_bytes(),
            )
            .tags(tags.iter().cloned())
        })
        .collect()
}

fn parse_tracked(data: &[u8]) -> Option<(u64, usize, usize)> {
    let s = std::str::from_utf8(data).ok()?;
    let mut parts = s.split('/');
    let id = parts.next()?.parse().ok()?;
    let i = parts.next()?.parse().ok()?;
    let n = parts.next()?.parse().ok()?;
    Some((id, i, n))
}

/// The properties after any crash: every acknowledged append present at its position, no append
/// twice, no event that was never appended, every append whole, positions gapless, and the
/// indexes agreeing with a full scan.
pub fn check_recovered(store: &Store, ledger: &Ledger) -> Result<(), String> {
    let all = read_all(store, &Query::all(), ReadOptions::forwards())?;
    let mut seen: HashMap<u64, u64> = HashMap::new();
    let mut i = 0;
    while i < all.len() {
        let e = &all[i];
        if e.position() != i as u64 + 1 {
            return Err(format!("gap: position {} at index {i}", e.position()));
        }
        let (id, index, count) = parse_tracked(e.data()).ok_or_else(|| {
            format!(
                "event {} holds data never written: {:?}",
                e.position(),
                e.data()
            )
        })?;
        let (expected, _) = ledger
            .appends
            .get(&id)
            .ok_or_else(|| format!("event {} belongs to unknown append {id}", e.position()))?;
        if index != 0 || count != expected.len() {
            return Err(format!(
                "append {id} is not whole at position {}",
                e.position()
            ));
        }
        if seen.insert(id, e.position() + count as u64 - 1).is_some() {
            return Err(format!("append {id} appears twice"));
        }
        for (k, want) in expected.iter().enumerate() {
            let got = all
                .get(i + k)
                .ok_or_else(|| format!("append {id} is cut short by the end of the log"))?;
            if ModelEvent::from_stored(got) != *want {
                return Err(format!(
                    "append {id} event {k} differs at position {}",
                    got.position()
                ));
            }
        }
        i += count;
    }
    for (id, (_, acknowledged)) in &ledger.appends {
        if let Some(position) = acknowledged {
            match seen.get(id) {
                Some(p) if p == position => {}
                Some(p) => {
                    return Err(format!(
                        "append {id} acknowledged at {position} but found at {p}"
                    ))
                }
                None => {
                    return Err(format!(
                        "acknowledged append {id} (position {position}) is lost"
                    ))
                }
            }
        }
    }
    check_index_matches_scan(store)
}

pub mod api;
pub mod backup;
pub mod harness;

/// Receipts (`ReceiptIssued`, tagged `enrolment:<position>`, as the read-model tests'
/// reactors write them) counted per enrolment position.
pub fn receipts_per_enrolment(store: &Store) -> std::collections::BTreeMap<u64, usize> {
    let mut receipts = std::collections::BTreeMap::new();
    for event in store
        .read(
            &Query::item(QueryItem::types(["ReceiptIssued"])),
            ReadOptions::forwards(),
        )
        .unwrap()
    {
        let event = event.unwrap();
        let of: u64 = event.tags().next().unwrap()["enrolment:".len()..]
            .parse()
            .unwrap();
        *receipts.entry(of).or_default() += 1;
    }
    receipts
}
