//! The data subjects' key file in the backup: shipped before any record sealed under its keys,
//! as the bytes the file gained since the last put (`keys/<epoch>-<offset>`), or whole once an
//! erasure began a new epoch, after which the older epochs' objects are deleted, so that an
//! erased subject's key leaves the backup too.

use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::{Failure, Shipper};
use crate::archive::{keys_name, parse_keys_name, KEYS_DIR};
use crate::error::StoreError;
use crate::objects::Put;

pub(super) use crate::archive::keys_extent as shipped_keys;

impl Shipper {
    /// Puts what the key file gained since the last put, before records that may be sealed
    /// under it.
    pub(super) fn ship_keys(&mut self) -> Result<(), Failure> {
        let Some(keys) = self.shared.keys.clone() else {
            return Ok(());
        };
        let (epoch, len) = keys.position();
        if self.keys_shipped == Some((epoch, len)) {
            return Ok(());
        }
        let from = match self.keys_shipped {
            Some((e, shipped)) if e == epoch && shipped <= len => shipped,
            _ => 0,
        };
        // An erasure between the two reads: the next round ships the new epoch.
        let Some(bytes) = keys.read_since(epoch, from).map_err(Failure::fatal)? else {
            return Err(Failure::Retry(crate::objects::ObjectError {
                fault: crate::objects::ObjectFault::Failed,
                operation: "read",
                name: crate::keys::KEYS_FILE.into(),
                detail: "the key file changed while it was read".into(),
            }));
        };
        let name = keys_name(epoch, from);
        let size = bytes.len() as u64;
        match self
            .objects
            .put_new(&name, vec![Bytes::from(bytes.clone())])
            .map_err(Failure::Retry)?
        {
            Put::Created => {}
            Put::Existed => {
                let (theirs, _) = self
                    .objects
                    .get(&name)
                    .map_err(Failure::Retry)?
                    .ok_or_else(|| {
                        Failure::Fatal(format!("{name} vanished while it was compared"))
                    })?;
                if theirs[..] != bytes[..] {
                    return Err(Failure::fatal(StoreError::Backup(format!(
                        "{}: {name} holds other keys than this store's",
                        self.url()
                    ))));
                }
            }
        }
        if from == 0 {
            // A new epoch is whole in the backup: the older ones' keys (an erased subject's
            // among them) go.
            for l in self.objects.list(KEYS_DIR, None).map_err(Failure::Retry)? {
                if parse_keys_name(&l.name).is_some_and(|(e, _)| e < epoch) {
                    self.objects.delete(&l.name).map_err(Failure::Retry)?;
                }
            }
        }
        self.keys_shipped = Some((epoch, from + size));
        self.state.keys_epoch.store(epoch, Ordering::Release);
        Ok(())
    }
}
