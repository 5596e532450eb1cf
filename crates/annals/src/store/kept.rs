//! Opening and closing a copy of the log kept across clean closes (`Options::mirror`, see
//! `crate::kept`): a PostgreSQL store's mirror and a read replica's copy of its backup.

use super::*;
use crate::kept::{AppendStamp, Closed, KeptMirror};

impl Store {
    /// Opens the file store of a kept mirror: as it was closed, when its source still holds its
    /// last append (`closed`, what its clean close recorded; `holds` answers None when the
    /// source holds it, else why not), answered with that record; else emptied, to be filled
    /// from the source, answered with why.
    pub(super) fn open_kept_mirror(
        io: Arc<dyn Io>,
        kept: &KeptMirror,
        closed: Result<Closed, String>,
        options: Options,
        backend: Backend,
        table: Option<Arc<dyn crate::keys::KeyTable>>,
        holds: impl FnOnce(AppendStamp) -> Result<Option<String>, StoreError>,
    ) -> Result<(Store, Result<Closed, String>), StoreError> {
        let dir = kept.log_dir();
        let why_not = match closed {
            Err(why) => why,
            Ok(closed) => {
                let store =
                    Self::open_log(io.clone(), &dir, options.clone(), backend, table.clone())?;
                let why_not = if store.head() != closed.head {
                    format!(
                        "it ends at position {}, where its close recorded {}",
                        store.head(),
                        closed.head
                    )
                } else {
                    match holds(closed.last)? {
                        None => {
                            kept.consume()?;
                            return Ok((store, Ok(closed)));
                        }
                        Some(why_not) => why_not,
                    }
                };
                drop(store);
                why_not
            }
        };
        kept.wipe()?;
        let store = Self::open_log(io, &dir, options, backend, table)?;
        debug_assert_eq!(store.head(), 0, "a wiped mirror is empty");
        Ok((store, Err(why_not)))
    }

    /// Syncs a kept mirror, then records its clean close (see `crate::kept`); the index
    /// checkpoint is written and synced already. `error`: the error of the mirror's source.
    pub(super) fn close_kept_mirror(
        &self,
        kept: &KeptMirror,
        last: AppendStamp,
        error: fn(String) -> StoreError,
    ) -> Result<(), StoreError> {
        let head = self.head();
        debug_assert_eq!(last.last, head, "a kept mirror ends with its last append");
        if last.last != head {
            // Not recorded as closed: the next open fills it again.
            return Err(error(format!(
                "the mirror ends at position {head}, its last append at {}",
                last.last
            )));
        }
        for segment in self.shared.segments.read().iter() {
            segment
                .file
                .sync_data()
                .map_err(|e| StoreError::io("sync mirror segment", &segment.path, 0, e))?;
        }
        kept.close(Closed { head, last })
    }
}
