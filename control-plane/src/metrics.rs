//! The control plane's Prometheus metrics (docs/metrics.md lists every series): one
//! [`Metrics`] per process, held by the HTTP state. Counters and histograms are moved where
//! the thing happens (a request, a registration, an event written to a stream, a phase
//! change); what the process can read cheaply at scrape time (the database pool, resources by
//! phase) is set by [`Metrics::encode`]'s caller just before encoding. The exposition is
//! `prometheus-client`'s Prometheus text format (version 0.0.4); nothing here writes it by hand.
//!
//! Every label is bounded: route templates from the one route table, a closed list of HTTP
//! methods, status codes, registration outcomes (machine error codes), broker phases.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The `Content-Type` of what [`Metrics::encode`] writes.
pub(crate) const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The `route` label of a request no route matched (so raw paths never become labels).
pub(crate) const UNMATCHED_ROUTE: &str = "unmatched";

/// Request durations: 1 ms up to ~16 s, doubling (15 buckets).
fn request_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.001, 2.0, 15)
}

/// Event delivery latencies: 0.5 ms up to ~8 s, doubling (15 buckets).
fn delivery_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.0005, 2.0, 15)
}

/// Policy compile durations: 0.1 ms up to ~1.6 s, doubling (15 buckets).
fn compile_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.0001, 2.0, 15)
}

fn request_histogram() -> Histogram {
    Histogram::new(request_buckets())
}

/// `route`, `method`, `status` of one answered request.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RequestLabels {
    pub route: String,
    pub method: &'static str,
    pub status: u16,
}

/// `route`, `method` of one request (the duration histogram).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: String,
    pub method: &'static str,
}

/// `result` of a registration: `created`, `existing` (an idempotent retry) or the machine
/// error code it was refused with (`token_consumed`, `token_unknown`...).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

/// A broker resource's phase.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct PhaseLabel {
    pub phase: &'static str,
}

/// One phase transition of a broker resource.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct TransitionLabels {
    pub from: &'static str,
    pub to: &'static str,
}

/// The HTTP method as a label: the methods the API and the downloads use, else `other`
/// (a client can send any token as a method; it must not become a new series).
pub(crate) fn method_label(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// Every series of the control plane.
pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub request_duration: Family<RouteLabels, Histogram, fn() -> Histogram>,
    pub registrations: Family<ResultLabel, Counter>,
    pub streams_open: Gauge,
    pub streams_slow_dropped: Counter,
    pub event_delivery: Histogram,
    pub pool_connections: Gauge,
    pub pool_idle: Gauge,
    pub pool_in_use: Gauge,
    pub pool_max: Gauge,
    pub resources: Family<PhaseLabel, Gauge>,
    pub transitions: Family<TransitionLabels, Counter>,
    pub broker_leader: Gauge,
    pub event_bus_connected: Gauge,
    pub policy_compiles: Counter,
    pub policy_compile_seconds: Histogram,
    pub audit_write_failures: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut m = Self {
            registry: Registry::with_prefix("plexsphere"),
            requests: Family::default(),
            request_duration: Family::new_with_constructor(request_histogram),
            registrations: Family::default(),
            streams_open: Gauge::default(),
            streams_slow_dropped: Counter::default(),
            event_delivery: Histogram::new(delivery_buckets()),
            pool_connections: Gauge::default(),
            pool_idle: Gauge::default(),
            pool_in_use: Gauge::default(),
            pool_max: Gauge::default(),
            resources: Family::default(),
            transitions: Family::default(),
            broker_leader: Gauge::default(),
            event_bus_connected: Gauge::default(),
            policy_compiles: Counter::default(),
            policy_compile_seconds: Histogram::new(compile_buckets()),
            audit_write_failures: Counter::default(),
        };
        m.register_all();
        m
    }
}

impl Metrics {
    fn register_all(&mut self) {
        let r = &mut self.registry;
        r.register(
            "audit_write_failures",
            "Changes made whose audit row could not be written afterwards (docs/audit.md)",
            self.audit_write_failures.clone(),
        );
        r.register(
            "http_requests",
            "HTTP requests answered, by route template, method and status code",
            self.requests.clone(),
        );
        r.register(
            "http_request_duration_seconds",
            "Time from a request's arrival to its response head, by route template and method",
            self.request_duration.clone(),
        );
        r.register(
            "registrations",
            "Node registrations, by result (created, existing, or the refusal's error code)",
            self.registrations.clone(),
        );
        r.register(
            "event_streams_open",
            "Node event streams open in this process",
            self.streams_open.clone(),
        );
        r.register(
            "event_streams_slow_dropped",
            "Event streams dropped because their client did not keep up",
            self.streams_slow_dropped.clone(),
        );
        r.register(
            "event_delivery_seconds",
            "Time from the bus notice of a committed change to the event's frame being written to a stream",
            self.event_delivery.clone(),
        );
        r.register(
            "db_pool_connections",
            "Database connections the pool holds (idle and in use)",
            self.pool_connections.clone(),
        );
        r.register(
            "db_pool_idle_connections",
            "Database connections idle in the pool",
            self.pool_idle.clone(),
        );
        r.register(
            "db_pool_in_use_connections",
            "Database connections in use",
            self.pool_in_use.clone(),
        );
        r.register(
            "db_pool_max_connections",
            "The most connections the pool opens",
            self.pool_max.clone(),
        );
        r.register(
            "broker_resources",
            "Broker resources, by phase",
            self.resources.clone(),
        );
        r.register(
            "broker_phase_transitions",
            "Broker resource phase transitions made by this process, by from and to phase",
            self.transitions.clone(),
        );
        r.register(
            "broker_leader",
            "1 while this replica holds the broker lease and runs the reconcile loop and maintenance, else 0 (exactly one replica of a healthy control plane shows 1)",
            self.broker_leader.clone(),
        );
        r.register(
            "event_bus_connected",
            "1 while the event bus carries notices between replicas (NATS connected and consuming; always 1 without NATS), else 0: streams then hear of other replicas' events by polling the database",
            self.event_bus_connected.clone(),
        );
        r.register(
            "policy_compiles",
            "Compiles of a Domain's access policy over its inventory (one per policy version and inventory change: a new node, a tag, a Project; not an endpoint change)",
            self.policy_compiles.clone(),
        );
        r.register(
            "policy_compile_seconds",
            "Time one compile of a Domain's access policy took",
            self.policy_compile_seconds.clone(),
        );
    }

    /// One answered request.
    pub(crate) fn observe_request(
        &self,
        route: &str,
        method: &'static str,
        status: u16,
        secs: f64,
    ) {
        self.requests
            .get_or_create(&RequestLabels {
                route: route.to_owned(),
                method,
                status,
            })
            .inc();
        self.request_duration
            .get_or_create(&RouteLabels {
                route: route.to_owned(),
                method,
            })
            .observe(secs);
    }

    /// One registration's outcome.
    pub(crate) fn registration(&self, result: &'static str) {
        self.registrations
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// One phase change of a broker resource.
    pub(crate) fn transition(&self, from: &'static str, to: &'static str) {
        self.transitions
            .get_or_create(&TransitionLabels { from, to })
            .inc();
    }

    /// The database pool as it is now.
    pub(crate) fn set_pool(&self, size: u32, idle: usize, max: u32) {
        let idle = i64::try_from(idle).unwrap_or(i64::MAX);
        let size = i64::from(size);
        self.pool_connections.set(size);
        self.pool_idle.set(idle);
        self.pool_in_use.set((size - idle).max(0));
        self.pool_max.set(i64::from(max));
    }

    /// Resources by phase as counted now; every phase gets a series (0 when none).
    /// What this replica is now: leading the broker or not, its bus up or not.
    pub(crate) fn set_roles(&self, leading: bool, bus_connected: bool) {
        self.broker_leader.set(i64::from(leading));
        self.event_bus_connected.set(i64::from(bus_connected));
    }

    pub(crate) fn set_resources(&self, counts: &[(&'static str, i64)]) {
        for (phase, n) in counts {
            self.resources.get_or_create(&PhaseLabel { phase }).set(*n);
        }
    }

    /// The exposition of every series (Prometheus text format 0.0.4).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_moves_its_counter_and_histogram_under_the_route_template() {
        let m = Metrics::default();
        m.observe_request("/v1/nodes/{node_id}", "GET", 200, 0.003);
        m.observe_request("/v1/nodes/{node_id}", "GET", 200, 0.003);
        m.observe_request("/v1/nodes/{node_id}", "GET", 404, 0.001);
        let text = m.encode().unwrap_or_default();
        assert!(text.contains(
            "plexsphere_http_requests_total{route=\"/v1/nodes/{node_id}\",method=\"GET\",status=\"200\"} 2\n"
        ), "{text}");
        assert!(text.contains(
            "plexsphere_http_request_duration_seconds_count{route=\"/v1/nodes/{node_id}\",method=\"GET\"} 3\n"
        ), "{text}");
    }

    #[test]
    fn the_pool_gauges_derive_in_use_from_size_and_idle() {
        let m = Metrics::default();
        m.set_pool(5, 2, 8);
        assert_eq!(m.pool_in_use.get(), 3);
        m.set_pool(1, 4, 8);
        assert_eq!(
            m.pool_in_use.get(),
            0,
            "idle above size (a race) is not negative"
        );
    }

    #[test]
    fn unknown_methods_share_one_label() {
        let odd = axum::http::Method::from_bytes(b"BREW").unwrap_or_default();
        assert_eq!(method_label(&odd), "other");
        assert_eq!(method_label(&axum::http::Method::PATCH), "PATCH");
    }
}
