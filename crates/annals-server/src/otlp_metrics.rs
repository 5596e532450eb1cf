//! Metrics over OTLP: every `interval`, the series `/metrics` exposes are read once (the same
//! scrape, see `metrics::Scrape`) and pushed to the collector, so that a backend that takes
//! only OTLP needs no scraper. Off unless an endpoint is configured, as traces are.
//!
//! The series are counted by the server's own atomics and the store's statistics, already
//! aggregated; the SDK's instruments cannot be given values aggregated elsewhere (its metric
//! data cannot be built outside it, and it has no observable histogram), so the push writes
//! them as the protocol's messages (`opentelemetry-proto`'s, cumulative, with the same bucket
//! bounds) and sends them with that crate's generated gRPC client, or over HTTP with protobuf.
//!
//! The push runs on a thread of its own and never holds a request; a failing collector is
//! reported in the log once when it starts failing and once when it takes the series again,
//! and counted (`annals_metric_exports_failed_total`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
pub use opentelemetry_proto::tonic::metrics::v1::Metric;
use opentelemetry_proto::tonic::metrics::v1::{
    metric, number_data_point, AggregationTemporality, Gauge, Histogram, HistogramDataPoint,
    NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum,
};
use prost::Message as _;

use crate::telemetry::{MetricsExport, Protocol};

/// Pushes of the series: taken by the collector, and failed.
#[derive(Debug, Default)]
pub struct PushCounts {
    pub exported: AtomicU64,
    pub failed: AtomicU64,
}

pub static PUSHES: PushCounts = PushCounts {
    exported: AtomicU64::new(0),
    failed: AtomicU64::new(0),
};

/// A series' value, as a data point holds it.
pub trait Number: Copy {
    fn number(self) -> number_data_point::Value;
}

macro_rules! integers {
    ($($t:ty),*) => {$(
        impl Number for $t {
            fn number(self) -> number_data_point::Value {
                number_data_point::Value::AsInt(i64::try_from(self).unwrap_or(i64::MAX))
            }
        }
    )*};
}
integers!(u64, i64, u32, i32, usize);

impl Number for f64 {
    fn number(self) -> number_data_point::Value {
        number_data_point::Value::AsDouble(self)
    }
}

/// The series of one scrape, written as OTLP metrics.
#[derive(Debug)]
pub struct Series {
    pub metrics: Vec<Metric>,
    start: u64,
    now: u64,
}

fn attributes(labels: &[(&str, &str)]) -> Vec<KeyValue> {
    labels
        .iter()
        .map(|(k, v)| KeyValue {
            key: (*k).to_owned(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue((*v).to_owned())),
            }),
            ..Default::default()
        })
        .collect()
}

/// The unit a name's suffix says (UCUM, as OTLP takes it); a Prometheus exporter leaves a
/// name that already ends with its unit as it is.
fn unit(name: &str) -> &'static str {
    if name.ends_with("_seconds") {
        "s"
    } else {
        ""
    }
}

impl Series {
    pub fn new(start: u64, now: u64) -> Series {
        Series {
            metrics: Vec::with_capacity(128),
            start,
            now,
        }
    }

    pub fn point(
        &self,
        labels: &[(&str, &str)],
        value: number_data_point::Value,
    ) -> NumberDataPoint {
        NumberDataPoint {
            attributes: attributes(labels),
            start_time_unix_nano: self.start,
            time_unix_nano: self.now,
            value: Some(value),
            ..Default::default()
        }
    }

    /// A histogram's point: `buckets` are the counts at most each bound and above the one
    /// before (not cumulative), the last bucket (above every bound) what `count` leaves.
    pub fn histogram_point(
        &self,
        labels: &[(&str, &str)],
        sum: f64,
        count: u64,
        buckets: &[(f64, u64)],
    ) -> HistogramDataPoint {
        let within: u64 = buckets.iter().map(|(_, n)| n).sum();
        debug_assert!(
            within <= count,
            "the buckets hold at most every value counted"
        );
        let mut bucket_counts: Vec<u64> = buckets.iter().map(|(_, n)| *n).collect();
        bucket_counts.push(count.saturating_sub(within));
        HistogramDataPoint {
            attributes: attributes(labels),
            start_time_unix_nano: self.start,
            time_unix_nano: self.now,
            count,
            sum: Some(sum),
            bucket_counts,
            explicit_bounds: buckets.iter().map(|(bound, _)| *bound).collect(),
            ..Default::default()
        }
    }

    fn push(&mut self, name: &str, help: &str, data: metric::Data) {
        self.metrics.push(Metric {
            name: name.to_owned(),
            description: help.to_owned(),
            unit: unit(name).to_owned(),
            data: Some(data),
            ..Default::default()
        });
    }

    /// A counter: a monotonic sum from the start.
    pub fn sum(&mut self, name: &str, help: &str, points: Vec<NumberDataPoint>) {
        let data = metric::Data::Sum(Sum {
            data_points: points,
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
            is_monotonic: true,
        });
        self.push(name, help, data);
    }

    pub fn gauge(&mut self, name: &str, help: &str, points: Vec<NumberDataPoint>) {
        let data = metric::Data::Gauge(Gauge {
            data_points: points,
        });
        self.push(name, help, data);
    }

    pub fn histogram(&mut self, name: &str, help: &str, points: Vec<HistogramDataPoint>) {
        let data = metric::Data::Histogram(Histogram {
            data_points: points,
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
        });
        self.push(name, help, data);
    }
}

fn epoch_nanos(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The running push: stopped (with a last push) when the server stops.
pub struct MetricsPush {
    stop: Arc<(Mutex<bool>, Condvar)>,
    /// Says when the push's thread has ended.
    ended: Option<std::sync::mpsc::Receiver<()>>,
}

/// How long a stop waits for the push's thread: its last push, or one in flight to a
/// collector that does not answer, is given up rather than hold the server's stop.
const STOP_WAIT: Duration = Duration::from_secs(3);

/// What one push sends through.
enum Client {
    Grpc(MetricsServiceClient<tonic::transport::Channel>),
    Http(reqwest::Client),
}

impl MetricsPush {
    /// Starts pushing what `scrape` reads every `export.interval`, under the service's
    /// resource (as the trace export's).
    pub fn start(
        export: MetricsExport,
        scrape: impl Fn() -> crate::metrics::Scrape + Send + 'static,
    ) -> Result<MetricsPush, String> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let stopping = stop.clone();
        // The runtime and the client are made on the push's own thread (a runtime may not be
        // dropped where the server's runs); it says whether they could be.
        let (ready, made) = std::sync::mpsc::sync_channel(1);
        let (done, ended) = std::sync::mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("annals-otlp-metrics".into())
            .spawn(move || {
                let made = Pusher::make(&export);
                let (runtime, client) = match made {
                    Ok(made) => {
                        let _ = ready.send(Ok(()));
                        made
                    }
                    Err(e) => {
                        let _ = ready.send(Err(e));
                        return;
                    }
                };
                let start = crate::process::ProcessStats::read()
                    .map(|p| (p.start_time_seconds * 1e9) as u64)
                    .unwrap_or_else(|| epoch_nanos(SystemTime::now()));
                let resource = {
                    let resource = crate::telemetry::resource(export.service_name.as_deref());
                    let kept = opentelemetry_proto::transform::common::tonic::
                        ResourceAttributesWithSchema::from(&resource);
                    kept.attributes.0
                };
                let pusher = Pusher {
                    export,
                    resource,
                    client,
                    failing: false,
                };
                pusher.run(&runtime, start, &scrape, &stopping);
                let _ = done.send(());
            })
            .map_err(|e| format!("cannot start the metric push's thread: {e}"))?;
        made.recv()
            .map_err(|_| "the metric push's thread ended at its start".to_string())??;
        Ok(MetricsPush {
            stop,
            ended: Some(ended),
        })
    }

    /// Stops pushing, after a last push of the series as they end (when the collector took
    /// the one before); waits for it at most [`STOP_WAIT`].
    pub fn stop(mut self) {
        self.signal();
        if let Some(ended) = self.ended.take() {
            let _ = ended.recv_timeout(STOP_WAIT);
        }
    }

    fn signal(&self) {
        let (stopped, wake) = &*self.stop;
        *stopped.lock().unwrap_or_else(|p| p.into_inner()) = true;
        wake.notify_all();
    }
}

impl Drop for MetricsPush {
    fn drop(&mut self) {
        // A push dropped without `stop` (a server dropped unstopped) ends without waiting.
        self.signal();
    }
}

struct Pusher {
    export: MetricsExport,
    resource: Vec<KeyValue>,
    client: Client,
    failing: bool,
}

impl Pusher {
    /// The push's runtime and its client of the collector.
    fn make(export: &MetricsExport) -> Result<(tokio::runtime::Runtime, Client), String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the metric push's runtime: {e}"))?;
        let client = {
            let _entered = runtime.enter();
            match export.protocol {
                Protocol::Grpc => {
                    let mut endpoint =
                        tonic::transport::Endpoint::from_shared(export.endpoint.clone())
                            .map_err(|e| format!("the metrics endpoint: {e}"))?
                            .timeout(export.timeout)
                            .connect_timeout(export.timeout);
                    if export.endpoint.starts_with("https://") {
                        endpoint = endpoint
                            .tls_config(
                                tonic::transport::ClientTlsConfig::new().with_native_roots(),
                            )
                            .map_err(|e| format!("the metrics endpoint's TLS: {e}"))?;
                    }
                    Client::Grpc(MetricsServiceClient::new(endpoint.connect_lazy()))
                }
                Protocol::HttpProtobuf => Client::Http(
                    reqwest::Client::builder()
                        .timeout(export.timeout)
                        .build()
                        .map_err(|e| format!("cannot make the metrics push's HTTP client: {e}"))?,
                ),
            }
        };
        Ok((runtime, client))
    }

    fn run(
        mut self,
        runtime: &tokio::runtime::Runtime,
        start: u64,
        scrape: &dyn Fn() -> crate::metrics::Scrape,
        stop: &(Mutex<bool>, Condvar),
    ) {
        let (stopped, wake) = stop;
        loop {
            let last = {
                let guard = stopped.lock().unwrap_or_else(|p| p.into_inner());
                let (guard, _) = wake
                    .wait_timeout_while(guard, self.export.interval, |stopped| !*stopped)
                    .unwrap_or_else(|p| p.into_inner());
                *guard
            };
            // The last push is made only to a collector that took the one before.
            if last && self.failing {
                return;
            }
            let now = epoch_nanos(SystemTime::now());
            let request = self.request(scrape().otlp(start, now));
            let sent = runtime.block_on(self.send(request));
            self.report(sent);
            if last {
                return;
            }
        }
    }

    fn request(&self, metrics: Vec<Metric>) -> ExportMetricsServiceRequest {
        ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(opentelemetry_proto::tonic::resource::v1::Resource {
                    attributes: self.resource.clone(),
                    ..Default::default()
                }),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(InstrumentationScope {
                        name: "annals".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                        ..Default::default()
                    }),
                    metrics,
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        }
    }

    async fn send(&mut self, request: ExportMetricsServiceRequest) -> Result<(), String> {
        match &mut self.client {
            Client::Grpc(client) => {
                let mut request = tonic::Request::new(request);
                request.set_timeout(self.export.timeout);
                for (key, value) in &self.export.headers {
                    let key = tonic::metadata::MetadataKey::from_bytes(key.as_bytes());
                    let value = tonic::metadata::MetadataValue::try_from(value.as_str());
                    if let (Ok(key), Ok(value)) = (key, value) {
                        request.metadata_mut().insert(key, value);
                    }
                }
                let answer = client
                    .export(request)
                    .await
                    .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?;
                rejected(
                    answer
                        .into_inner()
                        .partial_success
                        .map(|p| (p.rejected_data_points, p.error_message)),
                )
            }
            Client::Http(client) => {
                let mut post = client
                    .post(&self.export.endpoint)
                    .header(http::header::CONTENT_TYPE, "application/x-protobuf")
                    .body(request.encode_to_vec());
                for (key, value) in &self.export.headers {
                    post = post.header(key.as_str(), value.as_str());
                }
                let answer = post.send().await.map_err(|e| e.to_string())?;
                let status = answer.status();
                if !status.is_success() {
                    return Err(format!("HTTP {status}"));
                }
                let body = answer.bytes().await.map_err(|e| e.to_string())?;
                let decoded = opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceResponse::decode(body);
                rejected(
                    decoded
                        .ok()
                        .and_then(|r| r.partial_success)
                        .map(|p| (p.rejected_data_points, p.error_message)),
                )
            }
        }
    }

    /// Counts a push, and logs a change between taken and failing once.
    fn report(&mut self, sent: Result<(), String>) {
        match sent {
            Ok(()) => {
                PUSHES.exported.fetch_add(1, Ordering::Relaxed);
                if std::mem::take(&mut self.failing) {
                    tracing::info!(
                        endpoint = %crate::telemetry::redacted(&self.export.endpoint),
                        "the OTLP collector takes metrics again"
                    );
                }
            }
            Err(error) => {
                PUSHES.failed.fetch_add(1, Ordering::Relaxed);
                if !std::mem::replace(&mut self.failing, true) {
                    tracing::warn!(
                        endpoint = %crate::telemetry::redacted(&self.export.endpoint),
                        %error,
                        "the OTLP collector does not take metrics; the pushes go on and \
                         annals_metric_exports_failed_total counts them"
                    );
                }
            }
        }
    }
}

/// A collector's partial success that rejected points is a failure of those points.
fn rejected(partial: Option<(i64, String)>) -> Result<(), String> {
    match partial {
        Some((n, message)) if n > 0 => Err(format!("{n} points rejected: {message}")),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a histogram's point holds what is above every bound in its last bucket, so that
    /// its buckets add up to its count.
    #[test]
    fn a_histograms_last_bucket_holds_the_rest() {
        let series = Series::new(1, 2);
        let point = series.histogram_point(&[("op", "append")], 9.5, 10, &[(1.0, 3), (4.0, 5)]);
        assert_eq!(point.bucket_counts, vec![3, 5, 2]);
        assert_eq!(point.explicit_bounds, vec![1.0, 4.0]);
        assert_eq!(point.count, 10);
        assert_eq!((point.start_time_unix_nano, point.time_unix_nano), (1, 2));
        assert_eq!(point.attributes[0].key, "op");
    }
}
