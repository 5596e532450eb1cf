//! Opening a copy of the log kept across clean closes (a `Location`'s `mirror` or `copy`, see
//! `crate::kept`): a PostgreSQL store's mirror and a read replica's copy of its backup.
//! Its close is `parts::CopyDir`'s.

use std::sync::Arc;

use super::files::{self, OnFiles};
use crate::error::StoreError;
use crate::io::Io;
use crate::kept::{AppendStamp, Closed, KeptMirror};
use crate::options::Options;
use crate::route::Backend;

/// Opens the file store of a kept mirror: as it was closed, when its source still holds its
/// last append (`closed`, what its clean close recorded; `holds` answers None when the
/// source holds it, else why not), answered with that record; else emptied, to be filled
/// from the source, answered with why.
pub(super) fn open(
    io: Arc<dyn Io>,
    kept: &KeptMirror,
    closed: Result<Closed, String>,
    options: Options,
    backend: Backend,
    table: Option<Arc<dyn crate::keys::KeyTable>>,
    holds: impl FnOnce(AppendStamp) -> Result<Option<String>, StoreError>,
) -> Result<(OnFiles, Result<Closed, String>), StoreError> {
    let dir = kept.log_dir();
    let why_not = match closed {
        Err(why) => why,
        Ok(closed) => {
            let opened = files::open(io.clone(), &dir, options.clone(), backend, table.clone())?;
            let head = opened.shared.head();
            let why_not = if head != closed.head {
                format!(
                    "it ends at position {head}, where its close recorded {}",
                    closed.head
                )
            } else {
                match holds(closed.last)? {
                    None => {
                        kept.consume()?;
                        return Ok((opened, Ok(closed)));
                    }
                    Some(why_not) => why_not,
                }
            };
            drop(opened);
            why_not
        }
    };
    kept.wipe()?;
    let opened = files::open(io, &dir, options, backend, table)?;
    debug_assert_eq!(opened.shared.head(), 0, "a wiped mirror is empty");
    Ok((opened, Err(why_not)))
}
