//! Every `tracing` span a test binary makes, recorded in memory as a subscriber that exports
//! them would see them: names, parents, fields as recorded (at creation and later), and the
//! links (`follows_from`) between them. Installed once per binary as the global subscriber,
//! since the store makes spans on threads of its own (its syncer, its shipper); each test
//! finds its own by the unique span it makes around what it does.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Mutex, OnceLock};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::Context;
use tracing_subscriber::prelude::*;
use tracing_subscriber::registry::LookupSpan;

/// One recorded span.
#[derive(Debug, Clone, Default)]
pub struct Recorded {
    pub id: u64,
    pub name: String,
    pub parent: Option<u64>,
    pub fields: BTreeMap<String, String>,
    /// The spans it follows from (its links).
    pub follows: Vec<u64>,
}

impl Recorded {
    /// A field's value as recorded (text: strings unquoted, numbers as written).
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }

    /// A numeric field's value.
    pub fn number(&self, name: &str) -> Option<i64> {
        self.field(name)?.parse().ok()
    }
}

#[derive(Default)]
struct Fields<'a>(Option<&'a mut BTreeMap<String, String>>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if let Some(map) = self.0.as_mut() {
            map.insert(field.name().to_owned(), value.to_owned());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        if let Some(map) = self.0.as_mut() {
            map.insert(field.name().to_owned(), format!("{value:?}"));
        }
    }
}

/// The spans recorded so far, by id. Spans ids are reused once closed, so each new span
/// takes a serial number of its own (`Recorded::id`).
#[derive(Default)]
struct Log {
    spans: Vec<Recorded>,
    /// The serial of the span now open under each subscriber id.
    open: BTreeMap<u64, usize>,
}

static LOG: OnceLock<Mutex<Log>> = OnceLock::new();

fn log() -> std::sync::MutexGuard<'static, Log> {
    LOG.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

struct Recorder;

impl<S: Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let parent = match attrs.parent() {
            Some(parent) => Some(parent.clone()),
            None if attrs.is_contextual() => ctx.current_span().id().cloned(),
            None => None,
        };
        let mut log = log();
        let parent = parent.and_then(|p| log.open.get(&p.into_u64()).copied());
        let serial = log.spans.len();
        let mut span = Recorded {
            id: serial as u64,
            name: attrs.metadata().name().to_owned(),
            parent: parent.map(|p| p as u64),
            ..Recorded::default()
        };
        attrs.record(&mut Fields(Some(&mut span.fields)));
        log.spans.push(span);
        log.open.insert(id.into_u64(), serial);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        let mut log = log();
        if let Some(&serial) = log.open.get(&id.into_u64()) {
            values.record(&mut Fields(Some(&mut log.spans[serial].fields)));
        }
    }

    fn on_follows_from(&self, id: &Id, follows: &Id, _ctx: Context<'_, S>) {
        let mut log = log();
        let (Some(&span), Some(&other)) = (
            log.open.get(&id.into_u64()),
            log.open.get(&follows.into_u64()),
        ) else {
            return;
        };
        log.spans[span].follows.push(other as u64);
    }
}

/// Installs the recorder as this binary's global subscriber (once; later calls do nothing).
pub fn record() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let subscriber = tracing_subscriber::registry().with(Recorder);
        tracing::subscriber::set_global_default(subscriber)
            .expect("no other global subscriber in a test binary that records spans");
    });
}

/// Every span recorded so far.
pub fn recorded() -> Vec<Recorded> {
    log().spans.clone()
}

/// The spans recorded under (at any depth) the span named `root`, which must be unique.
pub fn under(root: &str) -> Vec<Recorded> {
    let spans = recorded();
    let roots: Vec<u64> = spans
        .iter()
        .filter(|s| s.name == root)
        .map(|s| s.id)
        .collect();
    assert_eq!(roots.len(), 1, "one span named {root}");
    let mut inside = vec![roots[0]];
    for s in &spans {
        if s.parent.is_some_and(|p| inside.contains(&p)) {
            inside.push(s.id);
        }
    }
    spans
        .into_iter()
        .filter(|s| s.id != roots[0] && inside.contains(&s.id))
        .collect()
}

/// The span with serial `id`.
pub fn span(id: u64) -> Recorded {
    log().spans[id as usize].clone()
}
