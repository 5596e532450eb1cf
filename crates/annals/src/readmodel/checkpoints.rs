//! Read models' checkpoints: the file format (`readmodels/<name>.model`, or a row of the
//! database's companions), writing, reading and listing them.

use super::*;

pub(super) const MAGIC: &[u8; 8] = b"ANNALSRM";

pub(super) const VERSION: u32 = 1;

/// The checkpoint files of read models in one directory.
#[derive(Clone)]
pub(crate) struct Checkpoints {
    /// The store's companion files, kind [`CHECKPOINT_DIR`].
    pub(super) companions: Arc<dyn Companions>,
}

/// One read model's checkpoint as found on disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SavedCheckpoint {
    pub name: String,
    pub model_version: u32,
    /// A hash of the model's query: a checkpoint of another query does not fit.
    pub query_hash: u32,
    pub position: u64,
    /// When the event at `position` was appended: a log that lost events and refilled them
    /// has another one there.
    pub position_appended_at_us: u64,
    pub saved_at_us: u64,
    #[serde(skip)]
    pub state: Vec<u8>,
    pub state_bytes: usize,
}

impl Checkpoints {
    /// Checkpoints in a data directory, read and written with the real file system.
    fn in_directory(data_dir: &Path) -> Self {
        Checkpoints {
            companions: Arc::new(InDirectory {
                io: Arc::new(crate::io::RealIo),
                dir: data_dir.to_path_buf(),
            }),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.companions
            .locate(CHECKPOINT_DIR, &format!("{name}{EXTENSION}"))
    }

    pub(super) fn load(&self, name: &str) -> Result<Option<SavedCheckpoint>, ReadModelError> {
        let path = self.path(name);
        let Some(bytes) = self
            .companions
            .read(CHECKPOINT_DIR, &format!("{name}{EXTENSION}"))
            .map_err(|e| StoreError::io("read read-model checkpoint", &path, 0, e))?
        else {
            return Ok(None);
        };
        decode(&bytes)
            .map(Some)
            .map_err(|reason| ReadModelError::Damaged {
                name: name.to_owned(),
                path,
                reason,
            })
    }

    pub(super) fn save(&self, saved: &SavedCheckpoint) -> Result<(), StoreError> {
        let name = format!("{}{EXTENSION}", saved.name);
        self.companions
            .write(CHECKPOINT_DIR, &name, &encode(saved))
            .map_err(|e| {
                StoreError::io("write read-model checkpoint", self.path(&saved.name), 0, e)
            })
    }

    pub(super) fn remove(&self, name: &str) -> Result<(), StoreError> {
        self.companions
            .remove(CHECKPOINT_DIR, &format!("{name}{EXTENSION}"))
            .map_err(|e| StoreError::io("remove read-model checkpoint", self.path(name), 0, e))
    }

    fn list(&self) -> Result<Vec<String>, StoreError> {
        let names = self.companions.list(CHECKPOINT_DIR).map_err(|e| {
            let dir = self.companions.locate(CHECKPOINT_DIR, "");
            StoreError::io("list read-model directory", &dir, 0, e)
        })?;
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

/// Layout (little-endian): magic "ANNALSRM", format version u32, model version u32, query hash
/// u32, name length u32, name, position u64, appended-at of that position u64, saved-at u64,
/// state length u64, state, CRC32C of everything before it.
pub(super) fn encode(saved: &SavedCheckpoint) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + saved.name.len() + saved.state.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&saved.model_version.to_le_bytes());
    out.extend_from_slice(&saved.query_hash.to_le_bytes());
    out.extend_from_slice(&(saved.name.len() as u32).to_le_bytes());
    out.extend_from_slice(saved.name.as_bytes());
    out.extend_from_slice(&saved.position.to_le_bytes());
    out.extend_from_slice(&saved.position_appended_at_us.to_le_bytes());
    out.extend_from_slice(&saved.saved_at_us.to_le_bytes());
    out.extend_from_slice(&(saved.state.len() as u64).to_le_bytes());
    out.extend_from_slice(&saved.state);
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

pub(super) fn decode(bytes: &[u8]) -> Result<SavedCheckpoint, String> {
    if bytes.len() < 4 {
        return Err("too short".into());
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if crc32c::crc32c(body).to_le_bytes() != crc {
        return Err("CRC mismatch".into());
    }
    let mut cursor = body;
    let mut take = |n: usize| -> Result<&[u8], String> {
        if cursor.len() < n {
            return Err("truncated".into());
        }
        let (head, rest) = cursor.split_at(n);
        cursor = rest;
        Ok(head)
    };
    if take(8)? != MAGIC {
        return Err("not a read-model checkpoint".into());
    }
    let u32_at = |b: &[u8]| u32::from_le_bytes(b.try_into().unwrap());
    let u64_at = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap());
    let format = u32_at(take(4)?);
    if format != VERSION {
        return Err(format!("unknown format version {format}"));
    }
    let model_version = u32_at(take(4)?);
    let query_hash = u32_at(take(4)?);
    let name_len = u32_at(take(4)?) as usize;
    let name = String::from_utf8(take(name_len)?.to_vec()).map_err(|_| "name is not UTF-8")?;
    let position = u64_at(take(8)?);
    let position_appended_at_us = u64_at(take(8)?);
    let saved_at_us = u64_at(take(8)?);
    let state_len = u64_at(take(8)?) as usize;
    let state = take(state_len)?.to_vec();
    if !cursor.is_empty() {
        return Err("trailing bytes".into());
    }
    Ok(SavedCheckpoint {
        name,
        model_version,
        query_hash,
        position,
        position_appended_at_us,
        saved_at_us,
        state_bytes: state.len(),
        state,
    })
}

pub(super) fn query_hash(query: &Query) -> u32 {
    crc32c::crc32c(&serde_json::to_vec(query).expect("queries serialize"))
}

/// The checkpoints in a data directory (see [`CHECKPOINT_DIR`]), for tools. Reads files only;
/// works while another process has the store open.
pub fn list_checkpoints(data_dir: &Path) -> Result<Vec<SavedCheckpoint>, ReadModelError> {
    let checkpoints = Checkpoints::in_directory(data_dir);
    let mut out = Vec::new();
    for name in checkpoints.list()? {
        if let Some(mut saved) = checkpoints.load(&name)? {
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
    let existed = checkpoints.load(name).map(|s| s.is_some()).unwrap_or(true);
    checkpoints.remove(name)?;
    Ok(existed)
}
