//! The harnesses, each a function that returns `Err(what went wrong)`: the normal tests require
//! `Ok`, the canary tests require that a deliberately broken store makes them fail.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use annals::sim::{CrashMode, FaultKind, SimIo};
use annals::{
    AppendCondition, AppendError, AppendOptions, Durability, Limits, NewEvent, Options, Query,
    QueryItem, ReadOptions, Store,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{check_recovered, read_all, tracked_events, Ledger, ModelEvent};

pub const DIR: &str = "/data";

/// Small segments and groups, so that rolls and multi-segment logs happen in every test.
pub fn small_options() -> Options {
    Options {
        segment_bytes: 8 << 10,
        group_bytes_max: 4 << 10,
        limits: Limits {
            append_bytes_max: 2 << 10,
            event_bytes_max: 512,
            ..Limits::default()
        },
        ..Options::default()
    }
}

/// Issues appends without waiting (so they group), recording each in the ledger as pending and,
/// from the writer's callback, as acknowledged.
fn issue(
    store: &Store,
    ledger: &Arc<Mutex<Ledger>>,
    next_id: &AtomicU64,
    rng: &mut StdRng,
    acked: &Arc<AtomicU64>,
) {
    let id = next_id.fetch_add(1, Ordering::Relaxed);
    let count = rng.gen_range(1..=4);
    let tags = vec![
        format!("stream-{}", rng.gen_range(0..6)),
        format!("id-{id}"),
    ];
    let events = tracked_events(id, count, &tags);
    // The condition never fails (nobody else writes "id-N"), but it is checked by the writer.
    let condition = AppendCondition::new(Query::item(QueryItem::tags([format!("id-{id}")])), None);
    ledger.lock().unwrap().appends.insert(
        id,
        (events.iter().map(ModelEvent::from_new).collect(), None),
    );
    let ledger = ledger.clone();
    let acked = acked.clone();
    // In a store weaker than D3, half the appends ask for D3; only those (and every append of a
    // D3 store) are promised to survive a crash.
    let require_synced = store.durability() != Durability::Synced && rng.gen_bool(0.5);
    let promised = store.durability() == Durability::Synced || require_synced;
    let options = AppendOptions {
        require_synced,
        ..AppendOptions::default()
    };
    let _ = store
        .appending(&events)
        .condition(&condition)
        .options(options)
        .then(move |outcome| {
            if let Ok(position) = outcome {
                if promised {
                    ledger.lock().unwrap().appends.get_mut(&id).unwrap().1 = Some(position);
                }
                acked.fetch_add(1, Ordering::Relaxed);
            }
        });
}

/// Rounds of: open, check, append concurrently, crash in a random mode at a random moment.
pub fn crash_rounds(seed: u64, rounds: usize, options: &Options) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut io = SimIo::new(seed);
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let next_id = AtomicU64::new(1);
    for round in 0..rounds {
        let store = Store::open_with_io(Arc::new(io.clone()), Path::new(DIR), options.clone())
            .map_err(|e| format!("seed {seed} round {round}: open failed: {e}"))?;
        check_recovered(&store, &ledger.lock().unwrap())
            .map_err(|e| format!("seed {seed} round {round}: {e}"))?;
        let acked = Arc::new(AtomicU64::new(0));
        let appends = rng.gen_range(1..40);
        let crash_after = rng.gen_range(0..=appends) as u64;
        for _ in 0..appends {
            issue(&store, &ledger, &next_id, &mut rng, &acked);
            if rng.gen_bool(0.2) {
                std::thread::yield_now();
            }
        }
        while acked.load(Ordering::Relaxed) < crash_after {
            std::thread::yield_now();
        }
        let mode = CrashMode::ALL[rng.gen_range(0..CrashMode::ALL.len())];
        io = io.crash(mode);
        drop(store);
    }
    let store = Store::open_with_io(Arc::new(io), Path::new(DIR), options.clone())
        .map_err(|e| format!("seed {seed} final open failed: {e}"))?;
    let result = check_recovered(&store, &ledger.lock().unwrap())
        .map_err(|e| format!("seed {seed} final: {e}"));
    result
}

/// Injects one fault at random: EIO or ENOSPC, once or from then on, on one of the next 20
/// writes or file syncs. Returns whether it is on a sync, and on which.
fn inject_fault(rng: &mut StdRng, io: &SimIo) -> (bool, u64) {
    let kind = if rng.gen_bool(0.5) {
        FaultKind::Eio
    } else {
        FaultKind::NoSpace
    };
    let persistent = rng.gen_bool(0.5);
    let on_sync = rng.gen_bool(0.5);
    let n = rng.gen_range(0..20);
    if on_sync {
        io.fail_sync(n, kind, persistent);
    } else {
        io.fail_write(n, kind, persistent);
    }
    (on_sync, n)
}

/// Whether an injected fault has shown: the store is poisoned, or it refused appends for lack
/// of room (a fault in the making of a segment, which held no record), or the fault failed an
/// operation whose failure the store absorbed (the making of a segment ahead of need, made
/// again when needed).
fn fault_fired(store: &Store, io: &SimIo) -> bool {
    let stats = store.stats();
    stats.poisoned.is_some() || stats.disk_full_refusals > 0 || io.fault_fired()
}

/// Injects a write or sync failure at a random moment: the store must poison (acknowledge
/// nothing more), or, when the failure was a lack of room for a segment not yet in the log,
/// refuse the appends that needed it without poisoning; after a crash every acknowledged
/// append must be there.
pub fn fault_round(seed: u64, options: &Options) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let io = SimIo::new(seed);
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let next_id = AtomicU64::new(1);
    let store = Store::open_with_io(Arc::new(io.clone()), Path::new(DIR), options.clone())
        .map_err(|e| format!("seed {seed}: open failed: {e}"))?;
    let (on_sync, n) = inject_fault(&mut rng, &io);
    let acked = Arc::new(AtomicU64::new(0));
    // Keep appending in bursts until the fault fires.
    let mut bursts = 0;
    while !fault_fired(&store, &io) {
        bursts += 1;
        if bursts > 200 {
            return Err(format!(
                "seed {seed}: the fault (sync {on_sync}, n {n}) did not poison the store"
            ));
        }
        for _ in 0..rng.gen_range(1..8) {
            issue(&store, &ledger, &next_id, &mut rng, &acked);
        }
        // Wait for the burst: a synchronous append returns after those queued before it.
        let id = next_id.fetch_add(1, Ordering::Relaxed);
        let events = tracked_events(id, 1, &[]);
        ledger.lock().unwrap().appends.insert(
            id,
            (events.iter().map(ModelEvent::from_new).collect(), None),
        );
        let outcome = store.append(&events, None);
        if let Ok(p) = outcome {
            if store.durability() == Durability::Synced {
                ledger.lock().unwrap().appends.get_mut(&id).unwrap().1 = Some(p);
            }
        }
    }
    if store.stats().poisoned.is_some() {
        match store.append(&tracked_events(0, 1, &[]), None) {
            Err(AppendError::Store(_)) => {}
            other => return Err(format!("seed {seed}: poisoned store answered {other:?}")),
        }
    }
    let io = io.crash(CrashMode::DropUnsynced);
    drop(store);
    io.clear_faults();
    let store = Store::open_with_io(Arc::new(io), Path::new(DIR), options.clone())
        .map_err(|e| format!("seed {seed}: reopen failed: {e}"))?;
    let result =
        check_recovered(&store, &ledger.lock().unwrap()).map_err(|e| format!("seed {seed}: {e}"));
    result
}

/// Many threads race to claim usernames with conditional appends; each name may be won once.
/// Also an optimistic counter: each event records the position it read, and the final log must
/// show that no append was accepted on a stale read.
pub fn claim_race(store: &Store, threads: usize, attempts: usize) -> Result<(), String> {
    claim_race_over(&[store], threads, attempts)
}

/// [`claim_race`] with the threads spread over several stores of one log (servers of one
/// database), checked through the first once it has taken in what the others appended.
/// Every append either succeeds or fails its condition: any other answer is an error. So is a
/// failed condition that names an event its store does not show yet: a caller that reads to
/// learn which event it lost to must find it. Each store counts the failed conditions it
/// answered, once each.
pub fn claim_race_over(stores: &[&Store], threads: usize, attempts: usize) -> Result<(), String> {
    let wins = Arc::new(Mutex::new(Vec::new()));
    let refused = Arc::new(Mutex::new(Vec::new()));
    let ahead = Mutex::new(Vec::new());
    let counted_before: Vec<u64> = stores.iter().map(|s| s.stats().conditions_failed).collect();
    let failed: Vec<AtomicU64> = stores.iter().map(|_| AtomicU64::new(0)).collect();
    let answered = |refused: &Mutex<Vec<String>>,
                    (store, failed): (&Store, &AtomicU64),
                    outcome: &Result<u64, AppendError>| {
        let Err(e) = outcome else { return };
        let Some(position) = e.conflict_position() else {
            refused.lock().unwrap().push(e.to_string());
            return;
        };
        failed.fetch_add(1, Ordering::Relaxed);
        let head = store.head();
        if position > head {
            ahead
                .lock()
                .unwrap()
                .push(format!("{e}, answered while its store's head was {head}"));
        }
    };
    std::thread::scope(|scope| {
        for t in 0..threads {
            let wins = wins.clone();
            let refused = refused.clone();
            let store = stores[t % stores.len()];
            let failed = &failed[t % stores.len()];
            scope.spawn(move || {
                let mut rng = StdRng::seed_from_u64(t as u64);
                for _ in 0..attempts {
                    let name = format!("user:{}", rng.gen_range(0..24));
                    let claim =
                        AppendCondition::new(Query::item(QueryItem::tags([name.clone()])), None);
                    let event = NewEvent::new("UsernameClaimed", format!("{t}").into_bytes())
                        .tag(name.clone());
                    let outcome = store.append(&[event], Some(&claim));
                    answered(&refused, (store, failed), &outcome);
                    if let Ok(p) = outcome {
                        wins.lock().unwrap().push((name, p));
                    }
                    // Optimistic counter: read the last increment, append after it.
                    let counter = Query::item(QueryItem::tags(["counter"]));
                    let last = read_all(store, &counter, ReadOptions::backwards().limit(1))
                        .ok()
                        .and_then(|v| v.first().map(|e| e.position()))
                        .unwrap_or(0);
                    let event =
                        NewEvent::new("Incremented", format!("{last}").into_bytes()).tag("counter");
                    let outcome =
                        store.append(&[event], Some(&AppendCondition::new(counter, Some(last))));
                    answered(&refused, (store, failed), &outcome);
                }
            });
        }
    });
    let refused = std::mem::take(&mut *refused.lock().unwrap());
    if let Some(first) = refused.first() {
        return Err(format!(
            "{} appends were refused rather than stored or failed by their condition; the \
             first: {first}",
            refused.len()
        ));
    }
    let store = stores[0];
    store.refresh().map_err(|e| format!("refresh: {e}"))?;
    let claims = read_all(
        store,
        &Query::item(QueryItem::types(["UsernameClaimed"])),
        ReadOptions::forwards(),
    )?;
    let mut names = std::collections::HashSet::new();
    for e in &claims {
        let name = e.tags().next().unwrap_or_default().to_owned();
        if !names.insert(name.clone()) {
            return Err(format!(
                "{name} was claimed twice (again at position {})",
                e.position()
            ));
        }
    }
    if claims.len() != wins.lock().unwrap().len() {
        return Err(format!(
            "{} claims stored, {} acknowledged",
            claims.len(),
            wins.lock().unwrap().len()
        ));
    }
    let increments = read_all(
        store,
        &Query::item(QueryItem::tags(["counter"])),
        ReadOptions::forwards(),
    )?;
    let mut previous = 0;
    for e in &increments {
        let read: u64 = std::str::from_utf8(e.data())
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(u64::MAX);
        if read != previous {
            return Err(format!(
                "increment at {} was decided on position {read}, but the last increment before it is {previous}",
                e.position()
            ));
        }
        previous = e.position();
    }
    // After the race's outcome (which the canaries are caught by): how it was answered.
    let ahead = std::mem::take(&mut *ahead.lock().unwrap());
    if let Some(first) = ahead.first() {
        return Err(format!(
            "{} failed conditions named an event their store did not show yet; the first: \
             {first}",
            ahead.len()
        ));
    }
    for (i, store) in stores.iter().enumerate() {
        let counted = store.stats().conditions_failed - counted_before[i];
        let answered = failed[i].load(Ordering::Relaxed);
        if counted != answered {
            return Err(format!(
                "store {i} counted {counted} failed conditions and answered {answered}"
            ));
        }
    }
    Ok(())
}

/// Damages a valid segment (every truncation, then single-bit flips) and opens the store each
/// time: it must never panic, and must either refuse with an error or show only events that
/// were written, each at its own position.
pub fn damage_rounds(seed: u64, flips: usize) -> Result<(), String> {
    let options = small_options();
    let io = SimIo::new(seed);
    let mut written = Vec::new();
    {
        let store = Store::open_with_io(Arc::new(io.clone()), Path::new(DIR), options.clone())
            .map_err(|e| e.to_string())?;
        for i in 0..20u64 {
            let events = tracked_events(i + 1, 1 + (i as usize % 3), &[format!("t{}", i % 4)]);
            store.append(&events, None).map_err(|e| e.to_string())?;
            written.extend(events.iter().map(ModelEvent::from_new));
        }
        store.close().map_err(|e| e.to_string())?;
    }
    let path = Path::new(DIR).join(annals::files::segment(1));
    let original = io.read_file(&path).ok_or("no segment")?;
    let used = original.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
    let check = |content: &[u8], what: &str| -> Result<(), String> {
        let disk = SimIo::new(seed);
        for name in io.file_names(Path::new(DIR)) {
            if name.ends_with(".seg") {
                let p = Path::new(DIR).join(&name);
                disk.write_file(&p, &io.read_file(&p).unwrap_or_default());
            }
        }
        disk.write_file(&path, content);
        let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let store = match Store::open_with_io(
                Arc::new(disk.clone()),
                Path::new(DIR),
                options.clone(),
            ) {
                Ok(s) => s,
                Err(_) => return Ok(()),
            };
            let events = match read_all(&store, &Query::all(), ReadOptions::forwards()) {
                Ok(e) => e,
                Err(_) => return Ok(()),
            };
            for e in &events {
                let want = written.get(e.position() as usize - 1);
                if want != Some(&ModelEvent::from_stored(e)) {
                    return Err(format!(
                        "{what}: position {} holds an event never written there",
                        e.position()
                    ));
                }
            }
            Ok(())
        }));
        opened.map_err(|_| format!("{what}: opening panicked"))?
    };
    for cut in (0..=used).rev() {
        let mut content = original.clone();
        content.truncate(cut);
        check(&content, &format!("truncated to {cut}"))?;
    }
    let mut rng = StdRng::seed_from_u64(seed);
    for _ in 0..flips {
        let mut content = original.clone();
        let at = rng.gen_range(0..used);
        content[at] ^= 1 << rng.gen_range(0..8);
        check(&content, &format!("bit flip at {at}"))?;
    }
    Ok(())
}

/// Waits until the first `issued` appends of [`answers_round`] are answered.
fn all_answered<T>(
    answers: &Mutex<std::collections::HashMap<u64, T>>,
    issued: u64,
) -> Result<(), String> {
    annals_testkit::poll(
        "every append of the burst to be answered (appends left unanswered)",
        std::time::Duration::from_secs(30),
        || {
            let answered = answers.lock().unwrap().len() as u64;
            if answered >= issued {
                Ok(())
            } else {
                Err(format!("{answered} of {issued} answered"))
            }
        },
    )
}

/// What the store answered one append of [`answers_round`].
#[derive(Debug)]
enum Answered {
    Position(u64),
    /// Nothing was appended: a failed condition or the store already poisoned.
    Refused(String),
    /// Stored or not.
    Unknown(String),
}

/// Injects a write or sync failure at a random moment while appends go on, keeps every
/// append's answer by its id, then reopens the store (after a crash in `crash` mode, or as the
/// process left it when None: unsynced writes still in the page cache) and checks each answer
/// against what it holds: an append answered with its position is there at that position (D3),
/// one refused (a failed condition, `Poisoned`) is not, one answered `OutcomeUnknown` may be;
/// no other answer comes, and every append there was answered with its position or unknown.
/// Answers how many appends were answered `OutcomeUnknown`.
pub fn answers_round(
    seed: u64,
    options: &Options,
    crash: Option<CrashMode>,
) -> Result<usize, String> {
    use annals::StoreError;
    use std::collections::HashMap;
    let mut rng = StdRng::seed_from_u64(seed);
    let io = SimIo::new(seed);
    let store = Store::open_with_io(Arc::new(io.clone()), Path::new(DIR), options.clone())
        .map_err(|e| format!("seed {seed}: open failed: {e}"))?;
    let (on_sync, n) = inject_fault(&mut rng, &io);
    let answers: Arc<Mutex<HashMap<u64, Answered>>> = Arc::default();
    let mut id = 0u64;
    let mut issue_one = |rng: &mut StdRng| {
        id += 1;
        let id = id;
        let events = tracked_events(id, rng.gen_range(1..=3), &[format!("id-{id}")]);
        // Every fifth append carries a condition that fails (its own tag is named after
        // position 0 by an event of the append before it); the others one that holds.
        let failing = id > 1 && id.is_multiple_of(5);
        let named = if failing { id - 1 } else { id };
        let condition =
            AppendCondition::new(Query::item(QueryItem::tags([format!("id-{named}")])), None);
        let answers = answers.clone();
        let record = move |outcome: Result<u64, AppendError>| {
            let answer = match outcome {
                Ok(p) => Answered::Position(p),
                Err(AppendError::ConditionFailed { position }) => {
                    Answered::Refused(format!("condition failed at {position}"))
                }
                Err(AppendError::Store(StoreError::Poisoned { reason })) => {
                    Answered::Refused(format!("poisoned: {reason}"))
                }
                Err(AppendError::DiskFull { reason }) => {
                    Answered::Refused(format!("disk full: {reason}"))
                }
                Err(AppendError::OutcomeUnknown { reason }) => Answered::Unknown(reason),
                Err(other) => Answered::Refused(format!("unexpected: {other}")),
            };
            answers.lock().unwrap().insert(id, answer);
        };
        let refused_at_once = Arc::new(Mutex::new(Some(record)));
        let in_callback = refused_at_once.clone();
        let sent = store
            .appending(&events)
            .condition(&condition)
            .then(move |outcome| {
                if let Some(record) = in_callback.lock().unwrap().take() {
                    record(outcome);
                }
            });
        // Refused before it was queued: answered here, not by the callback.
        if let Err(e) = sent {
            if let Some(record) = refused_at_once.lock().unwrap().take() {
                record(Err(e));
            }
        }
        id
    };
    let mut issued = 0;
    let mut bursts = 0;
    while !fault_fired(&store, &io) {
        bursts += 1;
        if bursts > 400 {
            return Err(format!(
                "seed {seed}: the fault (sync {on_sync}, n {n}) did not poison the store"
            ));
        }
        for _ in 0..rng.gen_range(1..8) {
            issued = issue_one(&mut rng);
        }
        // Each burst goes as a group or a few: wait for its answers.
        all_answered(&answers, issued).map_err(|e| format!("seed {seed}: {e}"))?;
    }
    // Appends after the poisoning: refused, never written.
    for _ in 0..3 {
        issued = issue_one(&mut rng);
    }
    all_answered(&answers, issued).map_err(|e| format!("seed {seed}: {e}"))?;
    let io = match crash {
        Some(mode) => io.crash(mode),
        None => io,
    };
    drop(store);
    io.clear_faults();
    let store = Store::open_with_io(Arc::new(io), Path::new(DIR), options.clone())
        .map_err(|e| format!("seed {seed}: reopen failed: {e}"))?;
    let mut there: HashMap<u64, u64> = HashMap::new();
    for event in read_all(&store, &Query::all(), ReadOptions::forwards())? {
        let data = std::str::from_utf8(event.data())
            .unwrap_or_default()
            .to_owned();
        let mut parts = data.split('/');
        let id: u64 = parts
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or("bad data")?;
        let (i, count): (u64, u64) = (
            parts
                .next()
                .and_then(|s| s.parse().ok())
                .ok_or("bad data")?,
            parts
                .next()
                .and_then(|s| s.parse().ok())
                .ok_or("bad data")?,
        );
        if i + 1 == count && there.insert(id, event.position()).is_some() {
            return Err(format!("seed {seed}: append {id} is there twice"));
        }
    }
    let answers = answers.lock().unwrap();
    let mut unknown = 0;
    for (id, answer) in answers.iter() {
        let found = there.get(id).copied();
        match answer {
            Answered::Position(p) if found != Some(*p) => {
                return Err(format!(
                    "seed {seed}: append {id} was acknowledged at {p} but found at {found:?}"
                ))
            }
            Answered::Refused(why) if why.starts_with("unexpected") => {
                return Err(format!("seed {seed}: append {id} was answered {why}"))
            }
            Answered::Refused(why) if found.is_some() => {
                return Err(format!(
                    "seed {seed}: append {id} was refused ({why}) but is there at {found:?}"
                ))
            }
            Answered::Unknown(_) => unknown += 1,
            _ => {}
        }
    }
    Ok(unknown)
}
