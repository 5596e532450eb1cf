//! Rebuilding the books from the journal, and the snapshots that bound how much of it a
//! restart replays.
//!
//! A snapshot is the engine's state after the command at a journal position: a saved state of
//! the store ([`annals::state`]) of kind `exchange`, one file per position
//! (`snapshot-<position, 20 digits>.anxs`), in the data directory on files and in the database
//! on PostgreSQL. Its state bytes are:
//!
//! ```text
//! next order id u64, last time u64, commands u64, engine bytes
//! ```
//!
//! A snapshot is taken only at a position the log has made durable, and is used only if it
//! fits the log as [`annals::state::check`] says: the log still holds the same event at its
//! position (same append time), since a log that lost its tail and was refilled has other
//! events there, and no data subject whose events the engine applied was erased since.
//! Anything unfit is skipped with its reason and the next older snapshot, or the whole
//! journal, is replayed instead. A snapshot of the older format (magic `ANXSNAP1`: position,
//! appended-at, next order id, last time, commands, engine length, engine bytes, CRC32C) is
//! still read, and saved anew as a saved state when it fits.

use annals::state::{Damage, Loaded, SavedState, StateId, States, Subjects, Unfit};
use annals::{Query, QueryItem, ReadOptions, Store};

use crate::codec::{self, Entry};
use crate::engine::Engine;
use crate::journal::ExchangeError;
use crate::types::*;

/// The directory, inside the store's data directory, that holds the exchange's snapshots.
pub const SNAPSHOT_DIR: &str = "exchange";
/// The older format's magic.
const OLDER_MAGIC: &[u8; 8] = b"ANXSNAP1";
/// The older format's magic and six words before the engine's bytes.
const OLDER_HEAD: usize = 8 + 6 * 8;
const PREFIX: &str = "snapshot-";
const SUFFIX: &str = ".anxs";
/// Snapshots kept: the newest, and one older in case the newest turns out unfit.
const KEEP: usize = 2;
/// The name the engine's state is saved under.
const STATE_NAME: &str = "exchange";
/// The version of the state's bytes (the module documentation's layout).
const STATE_VERSION: u32 = 1;
/// The three words before the engine's bytes in the state.
const STATE_HEAD: usize = 3 * 8;

/// The events replay applies: the query whose fold a snapshot is.
pub(crate) fn replayed() -> Query {
    Query::item(QueryItem::types(codec::REPLAYED_TYPES))
}

/// What a snapshot is a fold of: the engine, over the replayed events.
fn state_id() -> StateId {
    StateId::new(STATE_NAME, STATE_VERSION, replayed())
}

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
    /// The data subjects (their tags) whose events the engine applied through `position`, on
    /// a store with data subjects: an erasure of one of them after `position` makes the
    /// snapshot unfit.
    pub subjects: Vec<String>,
    /// [`Engine::snapshot`]'s bytes.
    pub engine: Vec<u8>,
}

impl Snapshot {
    fn to_saved(&self) -> SavedState {
        let mut state = Vec::with_capacity(STATE_HEAD + self.engine.len());
        for v in [self.next_order_id, self.last_time, self.commands] {
            state.extend_from_slice(&v.to_le_bytes());
        }
        state.extend_from_slice(&self.engine);
        SavedState::new(
            &state_id(),
            self.position,
            self.appended_at_us,
            self.subjects.clone(),
            state,
        )
    }

    fn from_saved(saved: SavedState) -> Result<Snapshot, Damage> {
        if saved.state.len() < STATE_HEAD {
            return Err(Damage::Truncated);
        }
        let word = |i: usize| {
            u64::from_le_bytes(saved.state[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
        };
        Ok(Snapshot {
            position: saved.position,
            appended_at_us: saved.appended_at_us,
            next_order_id: word(0),
            last_time: word(1),
            commands: word(2),
            engine: saved.state[STATE_HEAD..].to_vec(),
            subjects: saved.subjects,
        })
    }

    /// A snapshot of the older format (see the module documentation); it names no subjects.
    fn decode_older(bytes: &[u8]) -> Result<Snapshot, Damage> {
        if bytes.len() < OLDER_HEAD + 4 || &bytes[..8] != OLDER_MAGIC {
            return Err(Damage::NotAState);
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
            return Err(Damage::Crc);
        }
        let word = |i: usize| u64::from_le_bytes(body[8 + i * 8..16 + i * 8].try_into().unwrap());
        let len = word(5);
        let engine = (body.len() - OLDER_HEAD) as u64;
        if engine < len {
            return Err(Damage::Truncated);
        }
        if engine > len {
            return Err(Damage::TrailingBytes);
        }
        Ok(Snapshot {
            position: word(0),
            appended_at_us: word(1),
            next_order_id: word(2),
            last_time: word(3),
            commands: word(4),
            subjects: Vec::new(),
            engine: body[OLDER_HEAD..].to_vec(),
        })
    }
}

/// Writes a snapshot in the older format, for tests that show it is still read.
#[cfg(test)]
pub(crate) fn encode_older(snapshot: &Snapshot) -> Vec<u8> {
    let mut out = Vec::with_capacity(snapshot.engine.len() + 64);
    out.extend_from_slice(OLDER_MAGIC);
    for v in [
        snapshot.position,
        snapshot.appended_at_us,
        snapshot.next_order_id,
        snapshot.last_time,
        snapshot.commands,
        snapshot.engine.len() as u64,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&snapshot.engine);
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// A snapshot that fits the log, with the engine it restores.
pub type FitSnapshot = (Snapshot, Engine);

/// The snapshot files of one store: saved states of kind [`SNAPSHOT_DIR`] in its companions,
/// in the data directory on files and in the database on PostgreSQL.
#[derive(Clone)]
pub struct Snapshots {
    states: States,
}

impl Snapshots {
    pub fn for_store(store: &Store) -> Snapshots {
        Snapshots {
            states: States::of_store(store, SNAPSHOT_DIR),
        }
    }

    fn name(position: u64) -> String {
        format!("{PREFIX}{position:020}{SUFFIX}")
    }

    /// Positions of the snapshot files, newest first.
    pub fn positions(&self) -> Result<Vec<u64>, ExchangeError> {
        let names = self
            .states
            .list()
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
        self.states
            .save(&name, &snapshot.to_saved())
            .map_err(|e| ExchangeError::Journal(format!("writing snapshot {name}: {e}")))?;
        for old in self.positions()?.into_iter().skip(KEEP) {
            self.states
                .remove(&Self::name(old))
                .map_err(|e| ExchangeError::Journal(format!("removing an old snapshot: {e}")))?;
        }
        Ok(())
    }

    /// The newest snapshot that fits the log, and why each newer one did not.
    pub fn latest_fit(
        &self,
        store: &Store,
    ) -> Result<(Option<FitSnapshot>, Vec<String>), ExchangeError> {
        let id = state_id();
        let mut skipped = Vec::new();
        for position in self.positions()? {
            let name = Self::name(position);
            let read =
                |e: annals::ReadError| ExchangeError::Journal(format!("reading {name}: {e}"));
            let loaded = match self.states.load(store, &name, &id).map_err(read)? {
                Loaded::Older(bytes) => match Snapshot::decode_older(&bytes) {
                    Ok(older) if older.position != position => {
                        skipped.push(format!("{name}: its position differs from its name"));
                        continue;
                    }
                    Ok(older) => self
                        .states
                        .adopt(store, &name, &id, older.to_saved())
                        .map_err(read)?,
                    Err(damage) => Loaded::Unfit(Unfit::Damaged(damage)),
                },
                loaded => loaded,
            };
            let fit = match loaded {
                Loaded::Missing => continue,
                Loaded::Unfit(unfit) => Err(unfit.to_string()),
                Loaded::Older(_) => Err(Unfit::Damaged(Damage::NotAState).to_string()),
                Loaded::Fit(saved) if saved.position != position => {
                    Err("holds another position than its name".to_owned())
                }
                Loaded::Fit(saved) => Snapshot::from_saved(saved)
                    .map_err(|damage| Unfit::Damaged(damage).to_string())
                    .and_then(|snapshot| {
                        let engine = Engine::from_snapshot(&snapshot.engine)
                            .map_err(|e| format!("holds an engine that does not load: {}", e.0))?;
                        Ok((snapshot, engine))
                    }),
            };
            match fit {
                Ok(found) => return Ok((Some(found), skipped)),
                Err(reason) => skipped.push(format!("{name} {reason}")),
            }
        }
        Ok((None, skipped))
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
    /// The data subjects whose events the books hold (the snapshot's and those replayed), on
    /// a store with data subjects.
    pub subjects: Subjects,
}

/// Rebuilds the books from `store`: from the newest fit snapshot (when `snapshots` is given)
/// and the journal after it.
pub fn recover(store: &Store, snapshots: Option<&Snapshots>) -> Result<Recovered, ExchangeError> {
    let (start, skipped) = match snapshots {
        Some(s) => s.latest_fit(store)?,
        None => (None, Vec::new()),
    };
    let mut subjects = Subjects::of(store);
    if let Some((snapshot, _)) = &start {
        subjects.extend(snapshot.subjects.iter().cloned());
    }
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
    let events = store
        .read(&replayed(), ReadOptions::forwards().after(from))
        .map_err(|e| ExchangeError::Replay(e.to_string()))?;
    let mut out = Vec::new();
    let mut replayed = 0;
    for event in events {
        let event = event.map_err(|e| ExchangeError::Replay(e.to_string()))?;
        if event.position() > head {
            break;
        }
        subjects.see(&event);
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
        subjects,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use annals::{Durability, Options};

    use super::*;
    use crate::journal::{Mode, Sequencer, SequencerOptions};

    /// Goal: a snapshot of the older format (`ANXSNAP1`) is still taken by recovery, and is
    /// then saved anew as a saved state of the same position and engine. Method: a journal of a
    /// generated scenario; its snapshot written in the older format under its usual name;
    /// recovery starts from it, replaying nothing; the file is then an envelope holding the
    /// same snapshot.
    #[test]
    fn an_older_snapshot_is_taken_and_saved_anew() {
        let dir = tempfile::tempdir().unwrap();
        let options = Options {
            durability: Durability::Synced,
            ..Options::default()
        };
        let store = Arc::new(Store::open(dir.path(), options).unwrap());
        let scenario = crate::scenario::generate("normal", 300, 2).unwrap();
        let mut sequencer = Sequencer::new(
            Engine::new(&[]),
            Some(store.clone()),
            Mode::Pipelined,
            SequencerOptions::default(),
        )
        .unwrap();
        for &spec in &scenario.symbols {
            sequencer.add_symbol(spec).unwrap();
        }
        let mut out = Vec::new();
        for (i, command) in scenario.warmup.iter().chain(&scenario.messages).enumerate() {
            sequencer.execute(i as u64, command, &mut out).unwrap();
            out.clear();
            if sequencer.batch_full() {
                sequencer.flush(|_| {});
            }
        }
        let snapshot = sequencer.snapshot().unwrap();
        let name = Snapshots::name(snapshot.position);
        let older = encode_older(&snapshot);
        store
            .companions()
            .write(SNAPSHOT_DIR, &name, &older)
            .unwrap();

        let snapshots = Snapshots::for_store(&store);
        let recovered = recover(&store, Some(&snapshots)).unwrap();
        assert_eq!(recovered.snapshot_position, Some(snapshot.position));
        assert!(recovered.skipped_snapshots.is_empty());
        assert_eq!(recovered.replayed, 0);
        assert_eq!(recovered.commands, snapshot.commands);
        assert_eq!(
            recovered.engine.state_hash(),
            sequencer.engine().state_hash()
        );

        let bytes = store
            .companions()
            .read(SNAPSHOT_DIR, &name)
            .unwrap()
            .unwrap();
        assert_ne!(bytes, older, "saved anew");
        let saved = SavedState::decode(&bytes).unwrap();
        assert_eq!(saved.key, state_id().key());
        assert_eq!(saved.position, snapshot.position);
        assert_eq!(saved.appended_at_us, snapshot.appended_at_us);
        let again = Snapshot::from_saved(saved).unwrap();
        assert_eq!(again.engine, snapshot.engine);
        assert_eq!(
            (again.next_order_id, again.last_time, again.commands),
            (
                snapshot.next_order_id,
                snapshot.last_time,
                snapshot.commands
            )
        );
        // Taken again, now as a saved state.
        let (found, skipped) = snapshots.latest_fit(&store).unwrap();
        assert!(skipped.is_empty(), "{skipped:?}");
        assert_eq!(found.unwrap().0.position, snapshot.position);
    }
}
