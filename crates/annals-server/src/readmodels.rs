//! Read models the server keeps up to date, declared in the configuration file:
//!
//! ```toml
//! [[read_models]]
//! name = "seats-by-course"
//! types = ["StudentEnrolled"]       # any of these types (none: any type)
//! tags = []                         # all of these tags
//! group_by = "course:"              # count per value of tags with this prefix
//! ```
//!
//! Each one counts the events of its query, in total and per key (the rest of each tag that
//! starts with `group_by`), through an [`annals::readmodel::ReadModelRunner`], so it resumes
//! from its checkpoint after a restart. Clients read counts, status and lag over HTTP, an
//! admin can ask for a rebuild, and /metrics exports position, lag and counters.

use std::collections::BTreeMap;
use std::sync::Arc;

use annals::readmodel::{self, Folded, ReadModelRunner, ReadModelStatus, RunnerOptions};
use annals::{Event, Query, QueryItem, ReadOptions, Store};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// One declared read model.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct ReadModelSpec {
    pub name: String,
    #[serde(default)]
    pub types: Vec<String>,
    #[serde(default)]
    pub tags: Vec<String>,
    /// Count per key: the rest of every tag of a matching event that starts with this prefix.
    #[serde(default)]
    pub group_by: Option<String>,
}

impl ReadModelSpec {
    pub fn validate(&self) -> Result<(), String> {
        readmodel::validate_name(&self.name).map_err(|e| e.to_string())?;
        if self.group_by.as_deref() == Some("") {
            return Err(format!(
                "read model {:?}: group_by must not be empty (leave it out to count in total only)",
                self.name
            ));
        }
        Ok(())
    }

    fn query(&self) -> Query {
        let item = match (self.types.is_empty(), self.tags.is_empty()) {
            (true, true) => return Query::all(),
            (false, _) => QueryItem::types(self.types.iter().cloned()).and_tags(self.tags.clone()),
            (true, false) => QueryItem::tags(self.tags.iter().cloned()),
        };
        Query::item(item)
    }

    /// A change of `group_by` changes what the fold means; the query is hashed by the runner.
    fn version(&self) -> u32 {
        1 + (crc32c::crc32c(self.group_by.as_deref().unwrap_or("").as_bytes()) >> 1)
    }
}

/// A counting model's state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub total: u64,
    pub keys: BTreeMap<String, u64>,
}

type CountFold = Box<dyn FnMut(&mut Counts, &Event) + Send>;
type CountModel = Folded<Counts, CountFold>;

fn count_model(spec: &ReadModelSpec) -> CountModel {
    let prefix = spec.group_by.clone();
    let fold: CountFold = Box::new(move |counts: &mut Counts, event: &Event| {
        counts.total += 1;
        if let Some(prefix) = &prefix {
            for tag in event.tags() {
                if let Some(key) = tag.strip_prefix(prefix.as_str()) {
                    match counts.keys.get_mut(key) {
                        Some(n) => *n += 1,
                        None => {
                            counts.keys.insert(key.to_owned(), 1);
                        }
                    }
                }
            }
        }
    });
    Folded::new(spec.name.clone(), spec.query(), Counts::default(), fold).version(spec.version())
}

struct Hosted {
    spec: ReadModelSpec,
    runner: ReadModelRunner<CountModel>,
}

/// The server's read models; empty once stopped. Each forgets an erased data subject as its
/// runner meets the erasure's receipt, wherever it was appended: it is built again when it
/// folded an event of the subject (the library's runner does it, as for embedded models).
#[derive(Default)]
pub struct HostedModels {
    models: Mutex<Vec<Hosted>>,
}

/// What a client reads of one model.
#[derive(Debug, Serialize, schemars::JsonSchema)]
#[schemars(rename = "ReadModel")]
#[serde(rename_all = "camelCase")]
pub struct ModelView {
    #[serde(flatten)]
    pub status: ReadModelStatus,
    pub group_by: Option<String>,
    pub total: u64,
    pub key_count: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
}

impl HostedModels {
    /// Starts one runner per spec (blocking: each loads its checkpoint).
    pub fn start(store: &Arc<Store>, specs: &[ReadModelSpec]) -> Result<HostedModels, String> {
        let mut models = Vec::with_capacity(specs.len());
        for spec in specs {
            spec.validate()?;
            let runner = ReadModelRunner::start(store, count_model(spec), RunnerOptions::default())
                .map_err(|e| format!("read model {:?}: {e}", spec.name))?;
            models.push(Hosted {
                spec: spec.clone(),
                runner,
            });
        }
        Ok(HostedModels {
            models: Mutex::new(models),
        })
    }

    pub fn statuses(&self) -> Vec<ModelView> {
        self.models
            .lock()
            .iter()
            .map(|hosted| view(hosted, None))
            .collect()
    }

    /// Every model's counts, for a scrape of `/metrics`.
    pub fn counts(&self) -> Vec<crate::metrics::ModelCounts> {
        self.statuses()
            .into_iter()
            .map(|m| crate::metrics::ModelCounts {
                name: m.status.name,
                position: m.status.position,
                checkpoint_position: m.status.checkpoint_position,
                lag: m.status.lag,
                events_applied: m.status.events_applied,
                checkpoints: m.status.checkpoints,
                rebuilds: m.status.rebuilds,
                failures: m.status.failures,
                failing: m.status.error.is_some(),
            })
            .collect()
    }

    /// One model's view, with the count of `key` when given; `None` for an unknown name.
    pub fn get(&self, name: &str, key: Option<&str>) -> Option<ModelView> {
        let models = self.models.lock();
        let hosted = models.iter().find(|h| h.spec.name == name)?;
        Some(view(hosted, key))
    }

    /// The position a model has reached; `None` for an unknown name.
    pub fn position(&self, name: &str) -> Option<u64> {
        let models = self.models.lock();
        let hosted = models.iter().find(|h| h.spec.name == name)?;
        Some(hosted.runner.status().position)
    }

    /// Asks a model to rebuild from the first event; false for an unknown name.
    pub fn rebuild(&self, name: &str) -> bool {
        let models = self.models.lock();
        match models.iter().find(|h| h.spec.name == name) {
            Some(hosted) => {
                hosted.runner.rebuild();
                true
            }
            None => false,
        }
    }

    /// The models that folded an event carrying `tag` (an erased data subject's): those their
    /// runners build again when they meet the erasure's receipt, so that no state derived
    /// from the subject's data survives.
    pub fn seeing(&self, store: &Store, tag: &str) -> Vec<String> {
        let models = self.models.lock();
        let mut seeing = Vec::new();
        for hosted in models.iter() {
            let mut tags = hosted.spec.tags.clone();
            tags.push(tag.to_string());
            let item = QueryItem::types(hosted.spec.types.clone()).and_tags(tags);
            let saw = store
                .read(&Query::item(item), ReadOptions::forwards().limit(1))
                .is_ok_and(|mut events| events.next().is_some());
            if saw {
                seeing.push(hosted.spec.name.clone());
            }
        }
        seeing
    }

    /// Writes a last checkpoint of every model and stops them (blocking).
    pub fn stop(&self) -> Vec<(String, Option<String>)> {
        let models = std::mem::take(&mut *self.models.lock());
        models
            .into_iter()
            .map(|hosted| {
                let status = hosted.runner.stop();
                (hosted.spec.name, status.error)
            })
            .collect()
    }
}

fn view(hosted: &Hosted, key: Option<&str>) -> ModelView {
    let status = hosted.runner.status();
    let (total, key_count, count) = hosted.runner.read(|model| {
        let counts = model.state();
        (
            counts.total,
            counts.keys.len(),
            key.map(|k| counts.keys.get(k).copied().unwrap_or(0)),
        )
    });
    ModelView {
        status,
        group_by: hosted.spec.group_by.clone(),
        total,
        key_count,
        key: key.map(str::to_owned),
        count,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use annals::{NewEvent, Options};
    use std::time::Duration;

    fn spec(group_by: Option<&str>) -> ReadModelSpec {
        ReadModelSpec {
            name: "seats".into(),
            types: vec!["StudentEnrolled".into()],
            tags: vec![],
            group_by: group_by.map(str::to_owned),
        }
    }

    /// Goal: a counting model counts its query's events in total and per key, skips others,
    /// and a changed group_by rebuilds rather than mixing two meanings.
    #[test]
    fn counts_per_key() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path(), Options::default()).unwrap());
        for i in 0..30 {
            store
                .append(
                    &[NewEvent::new("StudentEnrolled", "")
                        .tag(format!("course:c{}", i % 3))
                        .tag(format!("student:s{i}"))],
                    None,
                )
                .unwrap();
            store.append(&[NewEvent::new("Other", "")], None).unwrap();
        }
        let wait = |models: &HostedModels| {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while models.position("seats") != Some(store.head()) {
                assert!(std::time::Instant::now() < deadline);
                std::thread::sleep(Duration::from_millis(2));
            }
        };
        let models = HostedModels::start(&store, &[spec(Some("course:"))]).unwrap();
        wait(&models);
        let view = models.get("seats", Some("c1")).unwrap();
        assert_eq!((view.total, view.key_count, view.count), (30, 3, Some(10)));
        assert_eq!(models.get("seats", Some("c9")).unwrap().count, Some(0));
        assert!(models.get("nope", None).is_none());
        models.stop();

        let models = HostedModels::start(&store, &[spec(Some("student:"))]).unwrap();
        wait(&models);
        let view = models.get("seats", None).unwrap();
        assert_eq!((view.total, view.key_count), (30, 30));
        assert!(view
            .status
            .rebuilt_because
            .as_deref()
            .unwrap()
            .contains("model version"));
        models.stop();

        assert!(spec(Some("")).validate().is_err());
        let mut bad = spec(None);
        bad.name = "../x".into();
        assert!(bad.validate().is_err());
    }
}
