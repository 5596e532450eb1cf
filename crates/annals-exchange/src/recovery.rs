//! Rebuilding the books from the journal, and the snapshots that bound how much of it a
//! restart replays.
//!
//! A snapshot is the engine's state after the command at a journal position, kept in the
//! store's data directory under `exchange/` (through the store's I/O layer, so the simulated
//! disk covers it too):
//!
//! ```text
//! magic "ANXSNAP1", position u64, appended-at of the event at that position u64,
//! next order id u64, last time u64, commands u64, engine bytes length u64, engine bytes,
//! CRC32C of all before
//! ```
//!
//! A snapshot is taken only at a position the log has made durable, and is used only if the
//! log still holds the same event there (same append time): a log that lost its tail and was
//! refilled has other events at those positions. Anything unfit is skipped with its reason and
//! the next older snapshot, or the whole journal, is replayed instead.

use std::sync::Arc;

use annals::companions::Companions;
use annals::{Query, QueryItem, ReadOptions, Store};

use crate::codec::{self, Entry};
use crate::engine::Engine;
use crate::journal::ExchangeError;
use crate::types::*;

/// The directory, inside the store's data directory, that holds the exchange's snapshots.
pub const SNAPSHOT_DIR: &str = "exchange";
const MAGIC: &[u8; 8] = b"ANXSNAP1";
/// Magic and six words before the engine's bytes.
const HEAD: usize = 8 + 6 * 8;
const PREFIX: &str = "snapshot-";
const SUFFIX: &str = ".anxs";
/// Snapshots kept: the newest, and one older in case the newest turns out unfit.
const KEEP: usize = 2;

/// The engine's state at a journal position.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The last journal position the state includes.
    pub position: u64,
    /// When the event at `position` was appended.
    pub appended_at_us: u64,
    pub next_order_id: OrderId,
    pub last_time: u64,
    /// Commands the journal holds through `position`.
    pub commands: u64,
    /// [`Engine::snapshot`]'s bytes.
    pub engine: Vec<u8>,
}

impl Snapshot {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.engine.len() + 64);
        out.extend_from_slice(MAGIC);
        for v in [
            self.position,
            self.appended_at_us,
            self.next_order_id,
            self.last_time,
            self.commands,
            self.engine.len() as u64,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.engine);
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Result<Snapshot, String> {
        if bytes.len() < HEAD + 4 || &bytes[..8] != MAGIC {
            return Err("not a snapshot (bad magic or too short)".into());
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
            return Err("CRC mismatch".into());
        }
        let word = |i: usize| u64::from_le_bytes(body[8 + i * 8..16 + i * 8].try_into().unwrap());
        let len = word(5) as usize;
        if body.len() != HEAD + len {
            return Err("length mismatch".into());
        }
        Ok(Snapshot {
            position: word(0),
            appended_at_us: word(1),
            next_order_id: word(2),
            last_time: word(3),
            commands: word(4),
            engine: body[HEAD..].to_vec(),
        })
    }
}

/// A snapshot that fits the log, with the engine it restores.
pub type FitSnapshot = (Snapshot, Engine);

/// The snapshot files of one store: companion files of kind [`SNAPSHOT_DIR`], in the data
/// directory on files and in the database on PostgreSQL.
#[derive(Clone)]
pub struct Snapshots {
    companions: Arc<dyn Companions>,
}

impl Snapshots {
    pub fn for_store(store: &Store) -> Snapshots {
        Snapshots {
            companions: store.companions(),
        }
    }

    fn name(position: u64) -> String {
        format!("{PREFIX}{position:020}{SUFFIX}")
    }

    /// Positions of the snapshot files, newest first.
    pub fn positions(&self) -> Result<Vec<u64>, ExchangeError> {
        let names = self
            .companions
            .list(SNAPSHOT_DIR)
            .map_err(|e| ExchangeError::Journal(format!("listing snapshots: {e}")))?;
        let mut positions: Vec<u64> = names
            .iter()
            .filter_map(|n| n.strip_prefix(PREFIX)?.strip_suffix(SUFFIX)?.parse().ok())
            .collect();
        positions.sort_unstable_by(|a, b| b.cmp(a));
        Ok(positions)
    }

    /// Writes a snapshot durably, then removes all but the newest [`KEEP`].
    pub fn save(&self, snapshot: &Snapshot) -> Result<(), ExchangeError> {
        let name = Self::name(snapshot.position);
        self.companions
            .write(SNAPSHOT_DIR, &name, &snapshot.encode())
            .map_err(|e| ExchangeError::Journal(format!("writing snapshot {name}: {e}")))?;
        for old in self.positions()?.into_iter().skip(KEEP) {
            self.companions
                .remove(SNAPSHOT_DIR, &Self::name(old))
                .map_err(|e| ExchangeError::Journal(format!("removing an old snapshot: {e}")))?;
        }
        Ok(())
    }

    /// The newest snapshot that fits the log, and why each newer one did not.
    pub fn latest_fit(
        &self,
        store: &Store,
    ) -> Result<(Option<FitSnapshot>, Vec<String>), ExchangeError> {
        let mut skipped = Vec::new();
        for position in self.positions()? {
            let name = Self::name(position);
            let bytes = match self.companions.read(SNAPSHOT_DIR, &name) {
                Ok(Some(bytes)) => bytes,
                Ok(None) => continue,
                Err(e) => return Err(ExchangeError::Journal(format!("reading {name}: {e}"))),
            };
            let fit = Snapshot::decode(&bytes).and_then(|snapshot| {
                if snapshot.position != position {
                    return Err("its position differs from its name".into());
                }
                match appended_at(store, position).map_err(|e| e.to_string())? {
                    Some(at) if at == snapshot.appended_at_us => {}
                    Some(_) => return Err("the log holds another event at its position".into()),
                    None => return Err(format!("the log ends before position {position}")),
                }
                let engine = Engine::from_snapshot(&snapshot.engine).map_err(|e| e.0)?;
                Ok((snapshot, engine))
            });
            match fit {
                Ok(found) => return Ok((Some(found), skipped)),
                Err(reason) => skipped.push(format!("{name}: {reason}")),
            }
        }
        Ok((None, skipped))
    }
}

/// When the event at `position` was appended, or None when the log is shorter.
pub fn appended_at(store: &Store, position: u64) -> Result<Option<u64>, annals::ReadError> {
    if position == 0 || position > store.head() {
        return Ok(None);
    }
    let mut events = store.read(
        &Query::all(),
        ReadOptions::forwards().from(position).limit(1),
    )?;
    match events.next() {
        Some(Ok(event)) if event.position() == position => Ok(Some(event.appended_at_us())),
        Some(Err(e)) => Err(e),
        _ => Ok(None),
    }
}

/// What a recovery found.
#[derive(Debug)]
pub struct Recovered {
    pub engine: Engine,
    /// The journal head the books include.
    pub position: u64,
    /// The snapshot replay started from, if any, and why newer ones were skipped.
    pub snapshot_position: Option<u64>,
    pub skipped_snapshots: Vec<String>,
    /// Commands replayed after the snapshot.
    pub replayed: u64,
    /// Commands the journal holds (those in the snapshot and those replayed).
    pub commands: u64,
    /// One more than the largest order id seen.
    pub next_order_id: OrderId,
    /// The latest command time seen.
    pub last_time: u64,
}

/// Rebuilds the books from `store`: from the newest fit snapshot (when `snapshots` is given)
/// and the journal after it.
pub fn recover(store: &Store, snapshots: Option<&Snapshots>) -> Result<Recovered, ExchangeError> {
    let (start, skipped) = match snapshots {
        Some(s) => s.latest_fit(store)?,
        None => (None, Vec::new()),
    };
    let (mut engine, mut next_order_id, mut last_time, from, snapshot_position, base) = match start
    {
        Some((snapshot, engine)) => (
            engine,
            snapshot.next_order_id,
            snapshot.last_time,
            snapshot.position,
            Some(snapshot.position),
            snapshot.commands,
        ),
        None => (Engine::new(&[]), 1, 0, 0, None, 0),
    };
    let head = store.head();
    let query = Query::item(QueryItem::types(codec::REPLAYED_TYPES));
    let events = store
        .read(&query, ReadOptions::forwards().after(from))
        .map_err(|e| ExchangeError::Replay(e.to_string()))?;
    let mut out = Vec::new();
    let mut replayed = 0;
    for event in events {
        let event = event.map_err(|e| ExchangeError::Replay(e.to_string()))?;
        if event.position() > head {
            break;
        }
        let entry = codec::decode(event.event_type(), event.data())
            .map_err(|e| ExchangeError::Replay(format!("position {}: {e}", event.position())))?;
        match entry {
            Some(Entry::Command { time, command }) => {
                if let Command::Place(p) = command {
                    next_order_id = next_order_id.max(p.id.saturating_add(1));
                }
                last_time = last_time.max(time);
                engine.apply(time, &command, &mut out);
                out.clear();
                replayed += 1;
            }
            Some(Entry::Symbol { symbol, spec }) => {
                let known = engine.specs();
                match known.get(symbol as usize) {
                    Some(&existing) if existing == spec => {}
                    Some(_) => {
                        return Err(ExchangeError::Replay(format!(
                            "symbol {symbol} is defined twice with different rules"
                        )))
                    }
                    None if symbol as usize == known.len() => {
                        engine.add_symbol(spec);
                    }
                    None => {
                        return Err(ExchangeError::Replay(format!(
                            "symbol {symbol} is added before symbol {}",
                            known.len()
                        )))
                    }
                }
            }
            None => {}
        }
    }
    Ok(Recovered {
        engine,
        position: head,
        snapshot_position,
        skipped_snapshots: skipped,
        replayed,
        commands: base + replayed,
        next_order_id,
        last_time,
    })
}
