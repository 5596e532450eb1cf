//! What the request handlers share: the store, the configuration, the metrics, the hosted read
//! models and exchange, and the server's admission step. It lives in a module of its own, below
//! the front ends (HTTP, gRPC, the exchange's routes) that import it and the root that builds
//! it, so that the root defines nothing its modules import and no import circle runs through it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use annals::admission::Refusal;
use annals::{AppendCondition, AppendError, AppendOptions, InputError, NewEvent, Store};
use tokio::sync::watch;

use crate::{budget, wire, Config, HostedModels, Metrics};

/// How many times an append is judged when the schemas keep changing under it.
const ADMISSIONS_MAX: u32 = 3;

/// What the request handlers share.
pub(crate) struct AppState {
    pub store: Arc<Store>,
    pub config: Config,
    /// The API keys the configuration gives.
    pub keys: crate::auth::ApiKeys,
    pub metrics: Arc<Metrics>,
    pub read_models: Arc<HostedModels>,
    /// The store's schema registry (its admission check); None when the store was opened
    /// without one.
    pub registry: Option<Arc<annals::registry::Registry>>,
    /// The exchange, when the server hosts one.
    pub exchange: Option<Arc<annals_exchange::hosted::Hosted>>,
    /// Turns true when the server starts shutting down; ends subscriptions.
    pub shutdown: watch::Receiver<bool>,
    /// The server's budget of bytes held by streamed answers.
    pub stream_bytes: budget::Budget,
}

impl AppState {
    /// The server's admission step: every check a client's append must pass here, for HTTP
    /// and gRPC alike, before it reaches the store (which runs its own, and the library's
    /// admission check, after): events of the exchange journal's types while the server hosts
    /// an exchange (only the exchange writes them, so that its replay never meets a foreign
    /// one), metadata nested deeper than clients parse safely, a tracking position without a
    /// source. The front ends decode and answer; they do not judge.
    pub fn admit(&self, events: &[NewEvent], options: &AppendOptions) -> Result<(), Refusal> {
        for (index, event) in events.iter().enumerate() {
            if self.exchange.is_some()
                && annals_exchange::codec::RESERVED_TYPES.contains(&event.event_type.as_str())
            {
                return Err(Refusal::event(
                    index,
                    "reserved_type",
                    format!(
                        "event type {:?} is reserved for the exchange this server hosts; place \
                         orders through /v1/exchange",
                        event.event_type
                    ),
                ));
            }
            let depth = wire::json_depth(&event.metadata);
            // Metadata that is not JSON (base64 on the wire) is served as a string: it does
            // not nest, whatever its bytes look like.
            if depth > wire::METADATA_DEPTH_MAX
                && serde_json::from_slice::<serde::de::IgnoredAny>(&event.metadata).is_ok()
            {
                return Err(Refusal::event(
                    index,
                    "metadata_too_deep",
                    format!(
                        "metadata nests {depth} levels deep (the limit is {})",
                        wire::METADATA_DEPTH_MAX
                    ),
                ));
            }
        }
        if options
            .tracking
            .as_ref()
            .is_some_and(|t| t.source.is_empty())
        {
            return Err(Refusal::append(
                "invalid_tracking",
                "tracking info needs a source name",
            ));
        }
        Ok(())
    }

    /// Appends without blocking the calling task's thread ([`Store::append_async`]). A full
    /// queue is retried briefly (the writer drains it in batches), then reported as
    /// [`AppendError::QueueFull`].
    /// `options.tracking`, when given, is recorded atomically with the events.
    pub async fn append(
        &self,
        events: &[NewEvent],
        condition: Option<&AppendCondition>,
        options: AppendOptions,
    ) -> Result<u64, AppendError> {
        let started = Instant::now();
        let class = options.class(self.store.durability());
        let outcome = self.append_timed(events, condition, options).await;
        self.metrics.record_append(class, started.elapsed());
        outcome
    }

    async fn append_timed(
        &self,
        events: &[NewEvent],
        condition: Option<&AppendCondition>,
        options: AppendOptions,
    ) -> Result<u64, AppendError> {
        self.admit(events, &options)
            .map_err(InputError::NotAdmitted)?;
        // No events: nothing to append and no condition to evaluate; the answer is position 0, as
        // UmaDB's store answers it (the embedded API refuses it as a likely mistake). A
        // tracking position needs an event to travel with.
        if events.is_empty() && options.tracking.is_none() {
            // The condition is still checked for well-formedness, as with events.
            if let Some(condition) = condition {
                condition
                    .fail_if_events_match
                    .validate(&self.config.limits.store())?;
            }
            return Ok(0);
        }
        // A full queue is retried for up to a second; the clock is read only then. An append
        // judged by schemas replaced before it was stored is judged again, a few times.
        let mut deadline = None;
        let mut judged = 0;
        loop {
            match self
                .store
                .append_async(events, condition, options.clone())
                .await
            {
                Err(AppendError::QueueFull { .. })
                    if Instant::now()
                        < *deadline
                            .get_or_insert_with(|| Instant::now() + Duration::from_secs(1)) =>
                {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err(AppendError::AdmissionChanged { .. }) if judged < ADMISSIONS_MAX => {
                    judged += 1;
                }
                outcome => return outcome,
            }
        }
    }
}
