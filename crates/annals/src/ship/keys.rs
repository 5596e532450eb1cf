//! The data subjects' key file in the backup: shipped before any record sealed under its keys,
//! as the bytes the file gained since the last put (`keys/<epoch>-<offset>`), or whole once an
//! erasure began a new epoch, after which the older epochs' objects are deleted, so that an
//! erased subject's key leaves the backup too. A store whose keys live in a database's table
//! ships an image of them in the same form (`keys/image.rs`).

use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::{Failure, Shipper};
use crate::archive::{keys_name, parse_keys_name, KEYS_DIR};
use crate::error::StoreError;
use crate::keys::KeyStore;
use crate::objects::Put;

pub(super) use crate::archive::keys_extent as shipped_keys;

impl Shipper {
    /// Puts what the key file gained since the last put, before records that may be sealed
    /// under it.
    pub(super) fn ship_keys(&mut self) -> Result<(), Failure> {
        let Some(keys) = self.shared.keys.clone() else {
            return Ok(());
        };
        if keys.in_table() {
            return self.ship_table_keys(&keys);
        }
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
        let size = bytes.len() as u64;
        self.put_keys(epoch, from, Bytes::from(bytes))?;
        self.keys_shipped = Some((epoch, from + size));
        self.state.keys_epoch.store(epoch, Ordering::Release);
        Ok(())
    }

    /// Puts `bytes` of the key file in `epoch` from `from` on; once a new epoch is whole in
    /// the backup, the older ones' keys (an erased subject's among them) go.
    fn put_keys(&mut self, epoch: u64, from: u64, bytes: Bytes) -> Result<(), Failure> {
        let name = keys_name(epoch, from);
        match self
            .objects
            .put_new(&name, vec![bytes.clone()])
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
            for l in self.objects.list(KEYS_DIR, None).map_err(Failure::Retry)? {
                if parse_keys_name(&l.name).is_some_and(|(e, _)| e < epoch) {
                    self.objects.delete(&l.name).map_err(Failure::Retry)?;
                }
            }
        }
        Ok(())
    }

    /// The image of a table's keys: whole in a new epoch at first and after each erasure or
    /// rotation (a new generation), the keys taken in since after it otherwise. An image
    /// made and not yet put is put again as it is (its wrapping key is random).
    fn ship_table_keys(&mut self, keys: &KeyStore) -> Result<(), Failure> {
        if self.table_image.is_none() {
            let current = keys.image_generation();
            let image = match self.table_keys.filter(|t| t.generation == current) {
                // The keys taken in since the last image, unless a generation ended meanwhile
                // (then whole). Nothing new: the records of this put are sealed under keys
                // the backup holds; a generation ended since is shipped with the next put.
                Some(t) => match keys.image_since() {
                    None => return Ok(()),
                    Some((generation, bytes)) if generation == t.generation => TableImage {
                        epoch: t.epoch,
                        offset: t.len,
                        generation,
                        bytes: Bytes::from(bytes),
                    },
                    Some(_) => self.whole_image(keys)?,
                },
                None => self.whole_image(keys)?,
            };
            self.table_image = Some(image);
        }
        let image = self.table_image.clone().expect("an image to put");
        self.put_keys(image.epoch, image.offset, image.bytes.clone())?;
        self.table_image = None;
        let len = image.offset + image.bytes.len() as u64;
        self.table_keys = Some(TableKeys {
            epoch: image.epoch,
            len,
            generation: image.generation,
        });
        self.keys_shipped = Some((image.epoch, len));
        self.state
            .keys_generation
            .store(image.generation, Ordering::Release);
        Ok(())
    }
}

impl Shipper {
    /// Every key a table's store holds, in a new epoch.
    fn whole_image(&self, keys: &KeyStore) -> Result<TableImage, Failure> {
        let epoch = self.keys_shipped.map_or(0, |(e, _)| e + 1);
        let (generation, bytes) = keys
            .image_whole(epoch, self.durable(), true)
            .map_err(Failure::fatal)?;
        Ok(TableImage {
            epoch,
            offset: 0,
            generation,
            bytes: Bytes::from(bytes),
        })
    }
}

/// A table's keys as the backup holds them: the epoch and length of the image, and the
/// generation it is of.
#[derive(Clone, Copy)]
pub(super) struct TableKeys {
    epoch: u64,
    len: u64,
    generation: u64,
}

/// Part of an image made and not yet put.
#[derive(Clone)]
pub(super) struct TableImage {
    epoch: u64,
    offset: u64,
    generation: u64,
    bytes: Bytes,
}
