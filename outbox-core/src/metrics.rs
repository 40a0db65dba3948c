//! Every metric the outbox records, defined in one place.
//!
//! Metrics go through the [`metrics`] facade: install any recorder (the `prometheus` feature's
//! [`observe::install_prometheus`](crate::observe::install_prometheus) does) and they appear.
//! Without a recorder they cost next to nothing.
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | `outbox_messages_processed_total` | counter | `topic`, `outcome` (`done`, `retry`, `dead`) | messages whose attempt ended |
//! | `outbox_handler_duration_seconds` | histogram | `topic`, `handler` | one handler call |
//! | `outbox_claim_duration_seconds` | histogram | | one claim statement |
//! | `outbox_handler_blocking_total` | counter | `topic`, `handler` | handler calls that held their thread without yielding for 500 ms or more |
//! | `outbox_pending_messages` | gauge | `topic`, `state` (`ready`, `scheduled`, `in_flight`, `stalled`) | pending depth; `stalled`: held by a worker that stopped renewing their lease (also counted as ready) |
//! | `outbox_oldest_ready_age_seconds` | gauge | `topic` | how long the oldest ready message has been due |
//! | `outbox_dead_messages` | gauge | `topic` | dead letters |
//! | `outbox_unhandled_pending_messages` | gauge | `topic` | pending messages of topics this worker has no handler for |
//!
//! Gauges are refreshed by the worker every
//! [`WorkerConfig::stats_interval`](crate::WorkerConfig::stats_interval).

/// Counter: messages whose attempt ended, by `topic` and `outcome`.
pub const PROCESSED: &str = "outbox_messages_processed_total";
/// Histogram: seconds of one handler call, by `topic` and `handler`.
pub const HANDLER_DURATION: &str = "outbox_handler_duration_seconds";
/// Histogram: seconds of one claim statement.
pub const CLAIM_DURATION: &str = "outbox_claim_duration_seconds";
/// Counter: handler calls that held their thread without yielding, by `topic` and `handler`.
pub const BLOCKING: &str = "outbox_handler_blocking_total";
/// Gauge: pending messages, by `topic` and `state`.
pub const PENDING: &str = "outbox_pending_messages";
/// Gauge: age in seconds of the oldest ready message, by `topic`.
pub const OLDEST_READY_AGE: &str = "outbox_oldest_ready_age_seconds";
/// Gauge: dead letters, by `topic`.
pub const DEAD: &str = "outbox_dead_messages";
/// Gauge: pending messages of topics without a handler here, by `topic`.
pub const UNHANDLED: &str = "outbox_unhandled_pending_messages";

/// Registers the descriptions of every metric with the installed recorder.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        PROCESSED,
        "Messages whose attempt ended, by topic and outcome"
    );
    describe_histogram!(
        HANDLER_DURATION,
        Unit::Seconds,
        "Duration of one handler call"
    );
    describe_histogram!(
        CLAIM_DURATION,
        Unit::Seconds,
        "Duration of one claim statement"
    );
    describe_counter!(
        BLOCKING,
        "Handler calls that held their thread without yielding for 500 ms or more"
    );
    describe_gauge!(PENDING, "Pending messages by topic and state");
    describe_gauge!(
        OLDEST_READY_AGE,
        Unit::Seconds,
        "How long the oldest ready message has been due"
    );
    describe_gauge!(DEAD, "Dead letters by topic");
    describe_gauge!(
        UNHANDLED,
        "Pending messages of topics this worker has no handler for"
    );
}

/// Publishes queue statistics as gauges; `handled` says which topics this worker serves.
pub(crate) fn record_stats(stats: &crate::Stats, handled: &dyn Fn(&str) -> bool) {
    for t in &stats.topics {
        let topic = t.topic.clone();
        for (state, n) in [
            ("ready", t.ready),
            ("scheduled", t.scheduled),
            ("in_flight", t.in_flight),
            ("stalled", t.stalled),
        ] {
            metrics::gauge!(PENDING, "topic" => topic.clone(), "state" => state).set(n as f64);
        }
        metrics::gauge!(OLDEST_READY_AGE, "topic" => topic.clone())
            .set(t.oldest_ready_age.map(|d| d.as_secs_f64()).unwrap_or(0.0));
        metrics::gauge!(DEAD, "topic" => topic.clone()).set(t.dead as f64);
        let unhandled = if handled(&t.topic) { 0 } else { t.pending() };
        metrics::gauge!(UNHANDLED, "topic" => topic).set(unhandled as f64);
    }
}
