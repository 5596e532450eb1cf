//! Read models' checkpoints: saved states ([`crate::state`]) named `readmodels/<name>.model` (or
//! a row of the database's companions). A checkpoint of the older format (magic `ANNALSRM`,
//! below) still loads, once: it is then saved anew as a saved state.

use super::*;
use crate::state::{Damage, Loaded, SavedState, StateId, States, Unfit};

/// The older format's magic (read only).
pub(super) const MAGIC: &[u8; 8] = b"ANNALSRM";

/// The older format's version (read only).
pub(super) const VERSION: u32 = 1;

/// The checkpoint files of read models in one directory.
#[derive(Clone)]
pub(crate) struct Checkpoints {
    /// The store's saved states of kind [`CHECKPOINT_DIR`].
    states: States,
}

/// One read model's checkpoint as found on disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SavedCheckpoint {
    pub name: String,
    pub model_version: u32,
    /// The canonical key of the model's name, version and query ([`crate::state::StateKey`],
    /// in hexadecimal): a checkpoint of another query does not fit. `None` for a checkpoint
    /// of the older format, which kept a 32-bit hash of the query instead.
    pub key: Option<String>,
    pub position: u64,
    /// When the event at `position` was appended: a log that lost events and refilled them
    /// has another one there.
    pub position_appended_at_us: u64,
    pub saved_at_us: u64,
    /// How many data subjects' events the state folded.
    pub subjects: usize,
    #[serde(skip)]
    pub state: Vec<u8>,
    pub state_bytes: usize,
}

impl From<SavedState> for SavedCheckpoint {
    fn from(saved: SavedState) -> Self {
        SavedCheckpoint {
            name: saved.name,
            model_version: saved.version,
            key: Some(saved.key.to_hex()),
            position: saved.position,
            position_appended_at_us: saved.appended_at_us,
            saved_at_us: saved.saved_at_us,
            subjects: saved.subjects.len(),
            state_bytes: saved.state.len(),
            state: saved.state,
        }
    }
}

/// A checkpoint of the older format.
struct Older {
    name: String,
    model_version: u32,
    query_hash: u32,
    position: u64,
    position_appended_at_us: u64,
    saved_at_us: u64,
    state: Vec<u8>,
}

fn file(name: &str) -> String {
    format!("{name}{EXTENSION}")
}

impl Checkpoints {
    /// The checkpoints kept where `store` keeps its companions.
    pub(super) fn of_store(store: &Store) -> Self {
        Checkpoints {
            states: States::of_store(store, CHECKPOINT_DIR),
        }
    }

    /// Checkpoints in a data directory, read and written with the real file system.
    fn in_directory(data_dir: &Path) -> Self {
        let companions = Arc::new(InDirectory {
            io: Arc::new(crate::io::RealIo),
            dir: data_dir.to_path_buf(),
        });
        Checkpoints {
            states: States::new(companions, CHECKPOINT_DIR),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.states.locate(&file(name))
    }

    /// The checkpoint of the model `id`, checked against `store`'s log; one of the older
    /// format is checked as that format was (its model version, its query's hash), then as a
    /// saved state, and saved anew.
    pub(super) fn load(&self, store: &Store, id: &StateId) -> Result<Loaded, ReadModelError> {
        let file = file(id.name());
        let bytes = match self.states.load(store, &file, id)? {
            Loaded::Older(bytes) => bytes,
            loaded => return Ok(loaded),
        };
        let older = match decode_older(&bytes) {
            Ok(older) => older,
            Err(damage) => return Ok(Loaded::Unfit(Unfit::Damaged(damage))),
        };
        let unfit = if older.name != id.name() {
            Some(Unfit::OtherName {
                saved: older.name,
                wanted: id.name().to_owned(),
            })
        } else if older.model_version != id.version() {
            Some(Unfit::OtherVersion {
                saved: older.model_version,
                wanted: id.version(),
            })
        } else if older.query_hash != query_hash(id.query()) {
            Some(Unfit::OtherQuery)
        } else {
            None
        };
        if let Some(unfit) = unfit {
            return Ok(Loaded::Unfit(unfit));
        }
        let saved = SavedState {
            saved_at_us: older.saved_at_us,
            ..SavedState::new(
                id,
                older.position,
                older.position_appended_at_us,
                Vec::new(),
                older.state,
            )
        };
        Ok(self.states.adopt(store, &file, id, saved)?)
    }

    /// A model's checkpoint as a tool reads it, without a store: either format, decoded and
    /// not checked against a log.
    fn read(&self, name: &str) -> Result<Option<SavedCheckpoint>, ReadModelError> {
        let Some(bytes) = self.states.read(&file(name))? else {
            return Ok(None);
        };
        let damaged = |damage: Damage| ReadModelError::Damaged {
            name: name.to_owned(),
            path: self.path(name),
            reason: damage.to_string(),
        };
        if SavedState::is_envelope(&bytes) {
            let saved = SavedState::decode(&bytes).map_err(damaged)?;
            return Ok(Some(saved.into()));
        }
        let older = decode_older(&bytes).map_err(damaged)?;
        Ok(Some(SavedCheckpoint {
            name: older.name,
            model_version: older.model_version,
            key: None,
            position: older.position,
            position_appended_at_us: older.position_appended_at_us,
            saved_at_us: older.saved_at_us,
            subjects: 0,
            state_bytes: older.state.len(),
            state: older.state,
        }))
    }

    pub(super) fn save(&self, saved: &SavedState) -> Result<(), StoreError> {
        self.states.save(&file(&saved.name), saved)
    }

    pub(super) fn remove(&self, name: &str) -> Result<(), StoreError> {
        self.states.remove(&file(name))
    }

    fn list(&self) -> Result<Vec<String>, StoreError> {
        let names = self.states.list()?;
        let mut models: Vec<String> = names
            .iter()
            .filter_map(|n| n.strip_suffix(EXTENSION))
            .filter(|n| validate_name(n).is_ok())
            .map(str::to_owned)
            .collect();
        models.sort();
        Ok(models)
    }
}

/// A checkpoint of the older format. Layout (little-endian): magic "ANNALSRM", format version
/// u32, model version u32, query hash u32 (CRC32C of the query as JSON), name length u32,
/// name, position u64, appended-at of that position u64, saved-at u64, state length u64,
/// state, CRC32C of everything before it.
fn decode_older(bytes: &[u8]) -> Result<Older, Damage> {
    if bytes.len() < MAGIC.len() + 4 || !bytes.starts_with(MAGIC) {
        return Err(Damage::NotAState);
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if crc32c::crc32c(body).to_le_bytes() != crc {
        return Err(Damage::Crc);
    }
    let mut cursor = &body[MAGIC.len()..];
    let mut take = |n: usize| -> Result<&[u8], Damage> {
        if cursor.len() < n {
            return Err(Damage::Truncated);
        }
        let (head, rest) = cursor.split_at(n);
        cursor = rest;
        Ok(head)
    };
    let u32_at = |b: &[u8]| u32::from_le_bytes(b.try_into().expect("4 bytes"));
    let u64_at = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
    let format = u32_at(take(4)?);
    if format != VERSION {
        return Err(Damage::UnknownVersion(format));
    }
    let model_version = u32_at(take(4)?);
    let query_hash = u32_at(take(4)?);
    let name_len = u32_at(take(4)?) as usize;
    let name = String::from_utf8(take(name_len)?.to_vec()).map_err(|_| Damage::NotUtf8)?;
    let position = u64_at(take(8)?);
    let position_appended_at_us = u64_at(take(8)?);
    let saved_at_us = u64_at(take(8)?);
    let state_len = usize::try_from(u64_at(take(8)?)).map_err(|_| Damage::Truncated)?;
    let state = take(state_len)?.to_vec();
    if !cursor.is_empty() {
        return Err(Damage::TrailingBytes);
    }
    Ok(Older {
        name,
        model_version,
        query_hash,
        position,
        position_appended_at_us,
        saved_at_us,
        state,
    })
}

/// The older format's hash of a query.
fn query_hash(query: &Query) -> u32 {
    crc32c::crc32c(&serde_json::to_vec(query).expect("queries serialize"))
}

/// The checkpoints in a data directory (see [`CHECKPOINT_DIR`]), for tools. Reads files only;
/// works while another process has the store open.
pub fn list_checkpoints(data_dir: &Path) -> Result<Vec<SavedCheckpoint>, ReadModelError> {
    let checkpoints = Checkpoints::in_directory(data_dir);
    let mut out = Vec::new();
    for name in checkpoints.list()? {
        if let Some(mut saved) = checkpoints.read(&name)? {
            saved.state.clear();
            out.push(saved);
        }
    }
    Ok(out)
}

/// Removes a read model's checkpoint from a data directory, so that its next start rebuilds
/// it from the first event. Returns whether there was one.
pub fn remove_checkpoint(data_dir: &Path, name: &str) -> Result<bool, ReadModelError> {
    validate_name(name)?;
    let checkpoints = Checkpoints::in_directory(data_dir);
    let existed = checkpoints
        .states
        .read(&file(name))
        .map(|bytes| bytes.is_some())
        .unwrap_or(true);
    checkpoints.remove(name)?;
    Ok(existed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::readmodel::{Folded, ReadModelRunner, RunnerOptions};
    use crate::state::StateId;
    use crate::subject::{MasterKey, SubjectOptions};
    use crate::Options;

    /// Writes a checkpoint in the older format, for tests that show it is still read.
    fn encode_older(
        name: &str,
        model_version: u32,
        query: &Query,
        position: u64,
        position_appended_at_us: u64,
        state: &[u8],
    ) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + name.len() + state.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&model_version.to_le_bytes());
        out.extend_from_slice(&query_hash(query).to_le_bytes());
        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&position.to_le_bytes());
        out.extend_from_slice(&position_appended_at_us.to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes());
        out.extend_from_slice(&(state.len() as u64).to_le_bytes());
        out.extend_from_slice(state);
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Goal: a read model's checkpoint of the older format (`ANNALSRM`) is still taken: the
    /// model resumes from it, and the file is replaced by a saved state of the same position
    /// that names the data subjects whose events the state folded. Method: a store with data
    /// subjects holding a move of customer:1 and one of an order; an older checkpoint at the
    /// head whose state no fold from scratch gives (so that resuming from it shows); tools
    /// list it without a key; the runner resumes from it; the file is then an envelope naming
    /// customer:1, listed with its key.
    #[test]
    fn an_older_checkpoint_is_taken_and_saved_anew() {
        let dir = tempfile::tempdir().unwrap();
        let options = Options {
            subjects: Some(SubjectOptions::new(
                ["customer:"],
                MasterKey::generate().unwrap(),
            )),
            ..Options::default()
        };
        let store = Arc::new(Store::open(dir.path(), options).unwrap());
        let moves = Query::item(QueryItem::types(["Moved"]));
        let moved = |tag: &str| NewEvent::new("Moved", "somewhere").tag(tag);
        store.append(&[moved("customer:1")], None).unwrap();
        store.append(&[moved("order:7")], None).unwrap();
        let head = store.head();
        let at = crate::state::appended_at(&store, head).unwrap().unwrap();
        let older = encode_older("moves", 1, &moves, head, at, b"41");
        let file = "moves.model";
        store
            .companions()
            .write(CHECKPOINT_DIR, file, &older)
            .unwrap();
        let listed = list_checkpoints(dir.path()).unwrap();
        assert_eq!((listed[0].position, listed[0].key.clone()), (head, None));

        let count = |n: &mut u64, _: &Event| *n += 1;
        let model = Folded::new("moves", moves.clone(), 0u64, count);
        let runner = ReadModelRunner::start(&store, model, RunnerOptions::default()).unwrap();
        let status = runner.status();
        assert_eq!(status.resumed_from, head);
        assert_eq!(status.rebuilt_because, None);
        assert_eq!(
            runner.read(|m| *m.state()),
            41,
            "the older checkpoint's state"
        );
        runner.stop();

        let bytes = store
            .companions()
            .read(CHECKPOINT_DIR, file)
            .unwrap()
            .unwrap();
        let saved = SavedState::decode(&bytes).unwrap();
        let id = StateId::new("moves", 1, moves);
        assert_eq!(saved.key, id.key());
        assert_eq!((saved.position, saved.appended_at_us), (head, at));
        assert_eq!(saved.subjects, ["customer:1"]);
        assert_eq!(saved.state, b"41");
        let listed = list_checkpoints(dir.path()).unwrap();
        assert_eq!(listed[0].key, Some(id.key().to_hex()));
        assert_eq!(listed[0].subjects, 1);
    }

    /// Goal: an older checkpoint of another model version or another query is refused as a
    /// saved state would be, and a damaged one says how.
    #[test]
    fn an_older_checkpoint_that_does_not_fit_is_refused() {
        let store = Store::open_in_memory(Options::default()).unwrap();
        store.append(&[NewEvent::new("Moved", "")], None).unwrap();
        let at = crate::state::appended_at(&store, 1).unwrap().unwrap();
        let moves = Query::item(QueryItem::types(["Moved"]));
        let checkpoints = Checkpoints::of_store(&store);
        let load = |bytes: &[u8], id: &StateId| {
            store
                .companions()
                .write(CHECKPOINT_DIR, "moves.model", bytes)
                .unwrap();
            match checkpoints.load(&store, id).unwrap() {
                Loaded::Unfit(unfit) => unfit,
                other => panic!("{other:?}"),
            }
        };
        let older = encode_older("moves", 1, &moves, 1, at, b"1");
        assert_eq!(
            load(&older, &StateId::new("moves", 2, moves.clone())),
            Unfit::OtherVersion {
                saved: 1,
                wanted: 2
            }
        );
        let other = Query::item(QueryItem::types(["Left"]));
        assert_eq!(
            load(&older, &StateId::new("moves", 1, other)),
            Unfit::OtherQuery
        );
        let mut damaged = older.clone();
        damaged[20] ^= 1;
        assert_eq!(
            load(&damaged, &StateId::new("moves", 1, moves)),
            Unfit::Damaged(Damage::Crc)
        );
    }
}
