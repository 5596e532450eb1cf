//! Object storage, made blocking for the store's threads: one prefix of one bucket (S3, GCS,
//! Azure) or of a local directory, through the `object_store` crate, with a small runtime of
//! its own. Credentials and endpoints come from each provider's usual environment variables
//! (for S3: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION,
//! AWS_ALLOW_HTTP), as `object_store` reads them; they are never logged.
//!
//! Every object the backup writes is written once, with a conditional put that fails when
//! the name is taken (`put_new`); only the lease is replaced, and then only over the version
//! its holder read (`put_over`).

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use object_store::path::Path;
use object_store::{
    ClientOptions, GetOptions, ObjectStore, ObjectStoreExt, ObjectStoreScheme, PutMode, PutOptions,
    PutPayload, RetryConfig, UpdateVersion,
};

/// What went wrong with a request, as far as the caller acts on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectFault {
    /// No object of that name (or no such bucket).
    NotFound,
    /// A conditional put found the name taken, or the version changed.
    Conflict,
    /// The store refused the credentials or the permission.
    Refused,
    /// Anything else: unreachable, timed out, an error answer. Worth retrying.
    Failed,
}

/// A failed request to object storage, naming the operation and the object.
#[derive(Debug, Clone)]
pub struct ObjectError {
    pub fault: ObjectFault,
    pub operation: &'static str,
    pub name: String,
    pub detail: String,
}

impl fmt::Display for ObjectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.operation, self.name, self.detail)
    }
}

impl std::error::Error for ObjectError {}

/// How a `put_new` ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    Created,
    /// The name was taken already: nothing was written.
    Existed,
}

/// An object's name (below the prefix) and size, from a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub name: String,
    pub size: u64,
}

/// One prefix of one bucket or directory.
pub struct Objects {
    url: String,
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    runtime: tokio::runtime::Runtime,
    /// Whether the store can replace an object only over a given version (S3, GCS, Azure);
    /// a local directory cannot, and the lease is then replaced outright.
    versioned_updates: bool,
}

impl fmt::Debug for Objects {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Objects").field("url", &self.url).finish()
    }
}

/// How long one request may take before it counts as failed, and how often the client itself
/// retries one (the shipper retries further, with its own backoff).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl Objects {
    /// Opens `url`: `s3://bucket/prefix`, `gs://bucket/prefix`, `az://container/prefix` or
    /// `file:///directory`. Makes no request: a wrong bucket or credentials show at the first.
    pub fn open(url: &str) -> Result<Objects, String> {
        Self::open_with(url, &[])
    }

    /// [`Objects::open`] with provider settings named as their environment variables
    /// (`AWS_ENDPOINT_URL`, ...), which override the environment. A local directory is made
    /// when missing: this is how a backup's writer opens its location.
    pub fn open_with(url: &str, settings: &[(String, String)]) -> Result<Objects, String> {
        Self::open_mode(url, settings, true)
    }

    /// [`Objects::open_with`] for a reader of what is there (verifying, restoring, following
    /// a backup): a local directory that does not exist is refused, never made.
    pub fn open_existing(url: &str, settings: &[(String, String)]) -> Result<Objects, String> {
        Self::open_mode(url, settings, false)
    }

    fn open_mode(
        url: &str,
        settings: &[(String, String)],
        create: bool,
    ) -> Result<Objects, String> {
        let parsed = url::Url::parse(url).map_err(|e| {
            format!(
                "{url:?} is not a backup URL ({e}); give s3://bucket/prefix, gs://bucket/prefix, \
                 az://container/prefix or file:///directory"
            )
        })?;
        let (scheme, path) = ObjectStoreScheme::parse(&parsed).map_err(|e| {
            format!(
                "{url:?} is not a backup URL ({e}); give s3://bucket/prefix, gs://bucket/prefix, \
                 az://container/prefix or file:///directory"
            )
        })?;
        let retry = RetryConfig {
            max_retries: 2,
            retry_timeout: Duration::from_secs(10),
            ..RetryConfig::default()
        };
        let client = ClientOptions::new()
            .with_timeout(REQUEST_TIMEOUT)
            .with_connect_timeout(CONNECT_TIMEOUT);
        let bad = |e: object_store::Error| format!("backup URL {url:?}: {e}");
        let (store, prefix, versioned_updates): (Arc<dyn ObjectStore>, Path, bool) = match scheme {
            ObjectStoreScheme::AmazonS3 => (
                Arc::new(
                    apply(
                        object_store::aws::AmazonS3Builder::new()
                            .with_client_options(client)
                            .with_retry(retry),
                        "AWS_",
                        settings,
                        object_store::aws::AmazonS3Builder::with_config,
                    )?
                    .with_url(url)
                    .with_conditional_put(object_store::aws::S3ConditionalPut::ETagMatch)
                    .build()
                    .map_err(bad)?,
                ),
                path,
                true,
            ),
            ObjectStoreScheme::GoogleCloudStorage => (
                Arc::new(
                    apply(
                        object_store::gcp::GoogleCloudStorageBuilder::new()
                            .with_client_options(client)
                            .with_retry(retry),
                        "GOOGLE_",
                        settings,
                        object_store::gcp::GoogleCloudStorageBuilder::with_config,
                    )?
                    .with_url(url)
                    .build()
                    .map_err(bad)?,
                ),
                path,
                true,
            ),
            ObjectStoreScheme::MicrosoftAzure => (
                Arc::new(
                    apply(
                        object_store::azure::MicrosoftAzureBuilder::new()
                            .with_client_options(client)
                            .with_retry(retry),
                        "AZURE_",
                        settings,
                        object_store::azure::MicrosoftAzureBuilder::with_config,
                    )?
                    .with_url(url)
                    .build()
                    .map_err(bad)?,
                ),
                path,
                true,
            ),
            ObjectStoreScheme::Local => {
                let dir = parsed
                    .to_file_path()
                    .map_err(|()| format!("backup URL {url:?}: not an absolute local directory"))?;
                if create {
                    std::fs::create_dir_all(&dir)
                        .map_err(|e| format!("backup directory {}: {e}", dir.display()))?;
                } else if !dir.is_dir() {
                    return Err(format!(
                        "no backup at {url}: the directory {} does not exist",
                        dir.display()
                    ));
                }
                (
                    Arc::new(
                        object_store::local::LocalFileSystem::new_with_prefix(&dir)
                            .map_err(bad)?
                            .with_automatic_cleanup(true),
                    ),
                    Path::default(),
                    false,
                )
            }
            _ => {
                return Err(format!(
                    "backup URL {url:?}: unsupported scheme; give s3://, gs://, az:// or file://"
                ))
            }
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("backup: start a runtime: {e}"))?;
        Ok(Objects {
            url: url.to_string(),
            store,
            prefix,
            runtime,
            versioned_updates,
        })
    }

    /// The URL as given (it holds no credentials: those come from the environment).
    pub fn url(&self) -> &str {
        &self.url
    }

    fn path(&self, name: &str) -> Path {
        if self.prefix.as_ref().is_empty() {
            Path::from(name)
        } else {
            Path::from(format!("{}/{name}", self.prefix))
        }
    }

    fn error(operation: &'static str, name: &str, e: object_store::Error) -> ObjectError {
        use object_store::Error as E;
        let fault = match &e {
            E::NotFound { .. } => ObjectFault::NotFound,
            E::AlreadyExists { .. } | E::Precondition { .. } => ObjectFault::Conflict,
            E::PermissionDenied { .. } | E::Unauthenticated { .. } => ObjectFault::Refused,
            _ => {
                // S3 answers a wrong key or a missing bucket as an error status, not a kind.
                let text = e.to_string();
                if text.contains("InvalidAccessKeyId")
                    || text.contains("SignatureDoesNotMatch")
                    || text.contains("AccessDenied")
                    || text.contains("status: 403")
                {
                    ObjectFault::Refused
                } else if text.contains("NoSuchBucket") {
                    ObjectFault::NotFound
                } else {
                    ObjectFault::Failed
                }
            }
        };
        ObjectError {
            fault,
            operation,
            name: name.to_string(),
            detail: e.to_string(),
        }
    }

    /// Writes `name` unless it exists: a conditional put (if-none-match), so nothing in the
    /// backup is ever replaced.
    pub fn put_new(&self, name: &str, payload: Vec<Bytes>) -> Result<Put, ObjectError> {
        let path = self.path(name);
        let options = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        let payload = PutPayload::from_iter(payload);
        match self
            .runtime
            .block_on(self.store.put_opts(&path, payload, options))
        {
            Ok(_) => Ok(Put::Created),
            Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::Precondition { .. }) => Ok(Put::Existed),
            Err(e) => Err(Self::error("put", name, e)),
        }
    }

    /// Writes `name` over the version `over` (its e-tag, as `get` gave it), or creates it when
    /// `over` is None; answers the new version. Fails with [`ObjectFault::Conflict`] when
    /// someone else wrote it meanwhile. A local directory has no versions: it writes outright.
    pub fn put_over(
        &self,
        name: &str,
        bytes: Bytes,
        over: Option<String>,
    ) -> Result<Option<String>, ObjectError> {
        let path = self.path(name);
        let mode = match (over, self.versioned_updates) {
            (_, false) => PutMode::Overwrite,
            (None, true) => PutMode::Create,
            (Some(e_tag), true) => PutMode::Update(UpdateVersion {
                e_tag: Some(e_tag),
                version: None,
            }),
        };
        let options = PutOptions {
            mode,
            ..PutOptions::default()
        };
        self.runtime
            .block_on(self.store.put_opts(&path, bytes.into(), options))
            .map(|r| r.e_tag)
            .map_err(|e| Self::error("put", name, e))
    }

    /// The object `name` and its version, or None when there is none.
    pub fn get(&self, name: &str) -> Result<Option<(Bytes, Option<String>)>, ObjectError> {
        let path = self.path(name);
        self.runtime.block_on(async {
            match self.store.get_opts(&path, GetOptions::default()).await {
                Ok(got) => {
                    let e_tag = got.meta.e_tag.clone();
                    let bytes = got.bytes().await.map_err(|e| Self::error("get", name, e))?;
                    Ok(Some((bytes, e_tag)))
                }
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(Self::error("get", name, e)),
            }
        })
    }

    /// Bytes `range` of the object `name`.
    pub fn get_range(&self, name: &str, range: Range<u64>) -> Result<Bytes, ObjectError> {
        let path = self.path(name);
        self.runtime
            .block_on(self.store.get_range(&path, range))
            .map_err(|e| Self::error("get", name, e))
    }

    /// The objects below `dir` (a name without the prefix, such as "log"), in name order,
    /// from the first after `after` when given.
    pub fn list(&self, dir: &str, after: Option<&str>) -> Result<Vec<Listed>, ObjectError> {
        let dir_path = self.path(dir);
        let skip = self.prefix.parts().count();
        self.runtime.block_on(async {
            let mut stream = match after {
                Some(after) => self
                    .store
                    .list_with_offset(Some(&dir_path), &self.path(after)),
                None => self.store.list(Some(&dir_path)),
            };
            let mut listed = Vec::new();
            while let Some(meta) = stream.next().await {
                let meta = meta.map_err(|e| Self::error("list", dir, e))?;
                let name = meta
                    .location
                    .parts()
                    .skip(skip)
                    .map(|p| p.as_ref().to_string())
                    .collect::<Vec<_>>()
                    .join("/");
                listed.push(Listed {
                    name,
                    size: meta.size,
                });
            }
            listed.sort_by(|a, b| a.name.cmp(&b.name));
            Ok(listed)
        })
    }

    /// What the prefix holds at its top: the names of its objects and of the folders below
    /// it (without the prefix; a folder's name ends in '/'), at most `most` of each.
    pub fn list_top(&self, most: usize) -> Result<(Vec<String>, Vec<String>), ObjectError> {
        let skip = self.prefix.parts().count();
        let name_of = |p: &Path| {
            p.parts()
                .skip(skip)
                .map(|p| p.as_ref().to_string())
                .collect::<Vec<_>>()
                .join("/")
        };
        let prefix = (skip > 0).then_some(&self.prefix);
        let listed = self
            .runtime
            .block_on(self.store.list_with_delimiter(prefix))
            .map_err(|e| Self::error("list", "", e))?;
        let mut objects: Vec<String> = listed
            .objects
            .iter()
            .map(|m| name_of(&m.location))
            .collect();
        let mut folders: Vec<String> = listed
            .common_prefixes
            .iter()
            .map(|p| format!("{}/", name_of(p)))
            .collect();
        objects.sort();
        folders.sort();
        objects.truncate(most);
        folders.truncate(most);
        Ok((objects, folders))
    }

    /// Removes `name`; one that is not there is no error.
    pub fn delete(&self, name: &str) -> Result<(), ObjectError> {
        let path = self.path(name);
        match self.runtime.block_on(self.store.delete(&path)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(Self::error("delete", name, e)),
        }
    }
}

/// Applies the provider's environment variables (those named `prefix...`), then `settings`
/// (named as environment variables, overriding them), to a provider's builder. (The
/// builders' own `from_env` would be undone by giving them client options afterwards.)
fn apply<B, K: std::str::FromStr>(
    mut builder: B,
    prefix: &str,
    settings: &[(String, String)],
    set: fn(B, K, String) -> B,
) -> Result<B, String> {
    for (name, value) in std::env::vars() {
        if name.starts_with(prefix) {
            if let Ok(key) = name.to_ascii_lowercase().parse::<K>() {
                builder = set(builder, key, value);
            }
        }
    }
    for (name, value) in settings {
        let key = name
            .to_ascii_lowercase()
            .parse::<K>()
            .map_err(|_| format!("unknown object storage setting {name}"))?;
        builder = set(builder, key, value.clone());
    }
    Ok(builder)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: on a local directory, a conditional put writes a name once and never replaces it;
    /// listing is in name order below the prefix, from an offset; a missing object is None;
    /// deleting twice is no error; a malformed URL or an unknown scheme is refused by name.
    #[test]
    fn a_directory_takes_each_name_once() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}/backup", dir.path().display());
        let objects = Objects::open(&url).unwrap();
        assert_eq!(
            objects
                .put_new("log/2", vec![Bytes::from_static(b"two")])
                .unwrap(),
            Put::Created
        );
        assert_eq!(
            objects
                .put_new(
                    "log/1",
                    vec![Bytes::from_static(b"o"), Bytes::from_static(b"ne")]
                )
                .unwrap(),
            Put::Created
        );
        assert_eq!(
            objects
                .put_new("log/1", vec![Bytes::from_static(b"other")])
                .unwrap(),
            Put::Existed
        );
        assert_eq!(objects.get("log/1").unwrap().unwrap().0, &b"one"[..]);
        assert!(objects.get("log/3").unwrap().is_none());
        let names: Vec<_> = objects
            .list("log", None)
            .unwrap()
            .into_iter()
            .map(|l| l.name)
            .collect();
        assert_eq!(names, ["log/1", "log/2"]);
        let after: Vec<_> = objects
            .list("log", Some("log/1"))
            .unwrap()
            .into_iter()
            .map(|l| l.name)
            .collect();
        assert_eq!(after, ["log/2"]);
        assert_eq!(objects.get_range("log/2", 1..3).unwrap(), &b"wo"[..]);
        objects.delete("log/2").unwrap();
        objects.delete("log/2").unwrap();
        assert!(objects.get("log/2").unwrap().is_none());
        for bad in ["not a url", "ftp://host/x", "s3://"] {
            let e = Objects::open(bad).unwrap_err();
            assert!(e.contains("backup URL"), "{bad}: {e}");
        }
    }
}
