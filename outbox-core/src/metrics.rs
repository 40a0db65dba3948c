//! Every metric the outbox records, defined in one place.
//!
//! Metrics go through the [`metrics`] facade: install any recorder (the `prometheus` feature's
//! `outbox::observe::install_prometheus` does) and they appear.
//! Without a recorder they cost next to nothing.
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | `outbox_messages_processed_total` | counter | `topic`, `outcome` (`done`, `retry`, `dead`) | messages whose attempt ended |
//! | `outbox_handler_duration_seconds` | histogram | `topic`, `handler` | one handler call |
//! | `outbox_claim_duration_seconds` | histogram | | one claim statement |
//! | `outbox_handler_blocking_total` | counter | `topic`, `handler` | handler calls that held their thread without yielding for 500 ms or more |
//! | `outbox_pending_messages` | gauge | `topic`, `state` (`ready`, `blocked`, `awaiting_version`, `scheduled`, `in_flight`, `stalled`) | pending depth; `blocked`: due but held back by an earlier message of their ordering key; `awaiting_version`: due, of a version no live worker of the topic knows (a rollout whose new workers have not started); `stalled`: held by a worker that stopped renewing their lease (also counted as ready) |
//! | `outbox_oldest_ready_age_seconds` | gauge | `topic` | how long the oldest ready message has been due |
//! | `outbox_oldest_blocked_age_seconds` | gauge | `topic` | how long the oldest blocked message has been due |
//! | `outbox_oldest_awaiting_version_age_seconds` | gauge | `topic` | how long the oldest message awaiting a worker that knows its version has been due: alert on it apart from the oldest ready age, with a rollout's patience |
//! | `outbox_blocked_by_dead_messages` | gauge | `topic` | blocked messages whose key holds a dead letter: they wait for `outbox dead retry` or `discard` |
//! | `outbox_dead_messages` | gauge | `topic` | dead letters |
//! | `outbox_unhandled_pending_messages` | gauge | `topic` | pending messages of topics this worker has no handler for |
//! | `outbox_unserved_ready_messages` | gauge | `topic` | ready messages of topics that no live worker serves (a forgotten handler crate, a pool that is down) |
//! | `outbox_breaker_open` | gauge | `handler` | 1 while the handler's circuit breaker is open (its messages parked, waiting for a probe to succeed), else 0; as this worker last read it |
//! | `outbox_paused` | gauge | `scope` (`handler`, `topic`), `name` | 1 while paused (`outbox pause`), else 0; as this worker last read it |
//!
//! Gauges are refreshed by the worker every
//! [`WorkerConfig::stats_interval`](crate::WorkerConfig::stats_interval). A topic that no
//! longer appears in the statistics (its last dead letter discarded, its last message done)
//! has its per-topic gauges set to 0 at the next refresh, so a dashboard never shows a stale
//! dead count.

/// Gauge: 1 while a handler's breaker is open, by `handler`.
pub const BREAKER_OPEN: &str = "outbox_breaker_open";
/// Gauge: 1 while a handler or a topic is paused, by `scope` and `name`.
pub const PAUSED: &str = "outbox_paused";
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
/// Gauge: age in seconds of the oldest blocked message, by `topic`.
pub const OLDEST_BLOCKED_AGE: &str = "outbox_oldest_blocked_age_seconds";
/// Gauge: age in seconds of the oldest message of a version no live worker knows, by `topic`.
pub const OLDEST_AWAITING_VERSION_AGE: &str = "outbox_oldest_awaiting_version_age_seconds";
/// Gauge: blocked messages whose ordering key holds a dead letter, by `topic`.
pub const BLOCKED_BY_DEAD: &str = "outbox_blocked_by_dead_messages";
/// Gauge: dead letters, by `topic`.
pub const DEAD: &str = "outbox_dead_messages";
/// Gauge: ready messages of topics that no live worker serves (any worker's view), by `topic`.
pub const UNSERVED: &str = "outbox_unserved_ready_messages";
/// Gauge: pending messages of topics without a handler here, by `topic`.
pub const UNHANDLED: &str = "outbox_unhandled_pending_messages";

/// Counter: events a replay delivered to its handler, by `topic`, `handler` and `outcome`
/// (`done` or `failed`).
pub const REPLAYED: &str = "outbox_replayed_events_total";
/// Gauge: events a running replay has left, by `topic` and `handler`, set by the worker
/// running it after each batch.
pub const REPLAY_LEFT: &str = "outbox_replay_events_left";

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
        BREAKER_OPEN,
        "1 while the handler's circuit breaker is open (its messages wait for a probe)"
    );
    describe_gauge!(PAUSED, "1 while the handler or topic is paused");
    describe_counter!(
        REPLAYED,
        "Events a replay delivered to its handler, by topic, handler and outcome"
    );
    describe_gauge!(
        REPLAY_LEFT,
        "Events a running replay has left, by topic and handler"
    );
    describe_gauge!(
        OLDEST_READY_AGE,
        Unit::Seconds,
        "How long the oldest ready message has been due"
    );
    describe_gauge!(
        OLDEST_BLOCKED_AGE,
        Unit::Seconds,
        "How long the oldest message held back by an earlier message of its ordering key has been due"
    );
    describe_gauge!(
        OLDEST_AWAITING_VERSION_AGE,
        Unit::Seconds,
        "How long the oldest message of a version no live worker knows has been due"
    );
    describe_gauge!(
        BLOCKED_BY_DEAD,
        "Messages held back by a dead letter of their ordering key"
    );
    describe_gauge!(DEAD, "Dead letters by topic");
    describe_gauge!(
        UNSERVED,
        "Ready messages of topics that no live worker serves"
    );
    describe_gauge!(
        UNHANDLED,
        "Pending messages of topics this worker has no handler for"
    );
}

/// The topics whose gauges were written by the last [`record_stats`] of this process.
static LAST_TOPICS: GaugeTopics = GaugeTopics::new();

/// Publishes queue statistics as gauges; `handled` says which topics this worker serves.
///
/// The statistics only list topics that have messages, so a topic that vanished since the last
/// call (its dead letters discarded, its last message done) would keep its old gauge values for
/// ever; its gauges are set to 0 instead.
pub(crate) fn record_stats(stats: &crate::model::Stats, handled: &dyn Fn(&str) -> bool) {
    LAST_TOPICS.record(stats, handled);
}

/// The per-topic gauges of one source of statistics, and the topics it wrote last time.
#[derive(Debug)]
pub(crate) struct GaugeTopics(std::sync::Mutex<std::collections::BTreeSet<String>>);

impl GaugeTopics {
    pub(crate) const fn new() -> Self {
        GaugeTopics(std::sync::Mutex::new(std::collections::BTreeSet::new()))
    }

    /// Writes the gauges of every topic in `stats`, and zeroes those of the topics written last
    /// time that `stats` no longer lists.
    pub(crate) fn record(&self, stats: &crate::model::Stats, handled: &dyn Fn(&str) -> bool) {
        let now: std::collections::BTreeSet<String> =
            stats.topics.iter().map(|t| t.topic.clone()).collect();
        let mut last = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for gone in last.difference(&now) {
            set_topic_gauges(gone, [0; 6], None, 0, 0);
            set_blocked_gauges(gone, None, 0);
            set_awaiting_age(gone, None);
            metrics::gauge!(UNSERVED, "topic" => gone.clone()).set(0.0);
        }
        for t in &stats.topics {
            let unhandled = if handled(&t.topic) { 0 } else { t.pending() };
            metrics::gauge!(UNSERVED, "topic" => t.topic.clone()).set(if t.unserved() {
                t.ready as f64
            } else {
                0.0
            });
            set_topic_gauges(
                &t.topic,
                [
                    t.ready,
                    t.blocked,
                    t.awaiting_version,
                    t.scheduled,
                    t.in_flight,
                    t.stalled,
                ],
                t.oldest_ready_age,
                t.dead,
                unhandled,
            );
            set_blocked_gauges(&t.topic, t.oldest_blocked_age, t.blocked_by_dead);
            set_awaiting_age(&t.topic, t.oldest_awaiting_version_age);
        }
        *last = now;
    }
}

fn set_topic_gauges(
    topic: &str,
    [ready, blocked, awaiting_version, scheduled, in_flight, stalled]: [i64; 6],
    oldest_ready_age: Option<std::time::Duration>,
    dead: i64,
    unhandled: i64,
) {
    let topic = topic.to_string();
    for (state, n) in [
        ("ready", ready),
        ("blocked", blocked),
        ("awaiting_version", awaiting_version),
        ("scheduled", scheduled),
        ("in_flight", in_flight),
        ("stalled", stalled),
    ] {
        metrics::gauge!(PENDING, "topic" => topic.clone(), "state" => state).set(n as f64);
    }
    metrics::gauge!(OLDEST_READY_AGE, "topic" => topic.clone())
        .set(oldest_ready_age.map(|d| d.as_secs_f64()).unwrap_or(0.0));
    metrics::gauge!(DEAD, "topic" => topic.clone()).set(dead as f64);
    metrics::gauge!(UNHANDLED, "topic" => topic).set(unhandled as f64);
}

fn set_blocked_gauges(topic: &str, oldest: Option<std::time::Duration>, by_dead: i64) {
    metrics::gauge!(OLDEST_BLOCKED_AGE, "topic" => topic.to_string())
        .set(oldest.map(|d| d.as_secs_f64()).unwrap_or(0.0));
    metrics::gauge!(BLOCKED_BY_DEAD, "topic" => topic.to_string()).set(by_dead as f64);
}

fn set_awaiting_age(topic: &str, oldest: Option<std::time::Duration>) {
    metrics::gauge!(OLDEST_AWAITING_VERSION_AGE, "topic" => topic.to_string())
        .set(oldest.map(|d| d.as_secs_f64()).unwrap_or(0.0));
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    fn topic(name: &str, ready: i64, dead: i64) -> crate::model::TopicStats {
        crate::model::TopicStats {
            topic: name.into(),
            ready,
            dead,
            oldest_ready_age: (ready > 0).then(|| std::time::Duration::from_secs(7)),
            ..crate::model::TopicStats::default()
        }
    }

    /// One refresh of the gauges, seen by a recorder of its own: the gauges this refresh wrote,
    /// as `name{label=value,...}` -> value. A gauge it did not write is absent.
    fn refresh(
        gauges: &GaugeTopics,
        topics: Vec<crate::model::TopicStats>,
        handled: &dyn Fn(&str) -> bool,
    ) -> BTreeMap<String, f64> {
        let stats = crate::model::Stats {
            topics,
            total: crate::model::TopicStats::default(),
            pauses: Vec::new(),
            breakers: Vec::new(),
        };
        let recorder = DebuggingRecorder::new();
        metrics::with_local_recorder(&recorder, || gauges.record(&stats, handled));
        let snapshot = recorder.snapshotter().snapshot().into_vec();
        snapshot
            .into_iter()
            .filter_map(|(key, _, _, value)| {
                let key = key.key();
                let mut labels: Vec<String> = key
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                labels.sort();
                match value {
                    DebugValue::Gauge(g) => Some((
                        format!("{}{{{}}}", key.name(), labels.join(",")),
                        g.into_inner(),
                    )),
                    _ => None,
                }
            })
            .collect()
    }

    #[test]
    fn gauges_of_a_topic_that_left_the_stats_drop_to_zero() {
        let gauges = GaugeTopics::new();
        let first = refresh(
            &gauges,
            vec![topic("mail", 0, 3), topic("search", 2, 0)],
            &|t| t == "search",
        );
        assert_eq!(first["outbox_dead_messages{topic=mail}"], 3.0);
        assert_eq!(
            first["outbox_pending_messages{state=ready,topic=search}"],
            2.0
        );
        assert_eq!(first["outbox_oldest_ready_age_seconds{topic=search}"], 7.0);

        // `outbox dead discard --topic mail` on an otherwise idle topic: mail leaves the stats.
        let second = refresh(&gauges, vec![topic("search", 0, 0)], &|t| t == "search");
        assert_eq!(
            second.get("outbox_dead_messages{topic=mail}"),
            Some(&0.0),
            "the discarded dead letters must stop counting: {second:?}"
        );
        for name in [
            "outbox_pending_messages{state=ready,topic=mail}",
            "outbox_pending_messages{state=scheduled,topic=mail}",
            "outbox_pending_messages{state=in_flight,topic=mail}",
            "outbox_oldest_ready_age_seconds{topic=mail}",
            "outbox_unhandled_pending_messages{topic=mail}",
        ] {
            assert_eq!(second.get(name), Some(&0.0), "{name}: {second:?}");
        }
        assert_eq!(
            second["outbox_pending_messages{state=ready,topic=search}"],
            0.0
        );

        // A topic is zeroed once, not on every refresh after it left.
        let third = refresh(&gauges, Vec::new(), &|_| true);
        assert_eq!(third.get("outbox_dead_messages{topic=search}"), Some(&0.0));
        assert_eq!(third.get("outbox_dead_messages{topic=mail}"), None);
    }

    #[test]
    fn messages_awaiting_a_version_have_their_own_state_and_age() {
        let gauges = GaugeTopics::new();
        // A rollout: version 2 producers ran ahead of the version 2 workers.
        let booking = crate::model::TopicStats {
            topic: "booking".into(),
            ready: 1,
            awaiting_version: 6,
            oldest_ready_age: Some(std::time::Duration::from_secs(2)),
            oldest_awaiting_version_age: Some(std::time::Duration::from_secs(40)),
            unknown_version: Some(2),
            ..crate::model::TopicStats::default()
        };
        let first = refresh(&gauges, vec![booking], &|_| true);
        assert_eq!(
            first["outbox_pending_messages{state=awaiting_version,topic=booking}"],
            6.0
        );
        assert_eq!(
            first["outbox_pending_messages{state=ready,topic=booking}"], 1.0,
            "the awaiting messages are not ready: {first:?}"
        );
        assert_eq!(
            first["outbox_oldest_awaiting_version_age_seconds{topic=booking}"],
            40.0
        );
        assert_eq!(
            first["outbox_oldest_ready_age_seconds{topic=booking}"], 2.0,
            "the oldest ready age leaves the awaiting messages out: {first:?}"
        );

        // The new workers started and drained the topic: it leaves the stats.
        let second = refresh(&gauges, Vec::new(), &|_| true);
        for name in [
            "outbox_pending_messages{state=awaiting_version,topic=booking}",
            "outbox_oldest_awaiting_version_age_seconds{topic=booking}",
        ] {
            assert_eq!(second.get(name), Some(&0.0), "{name}: {second:?}");
        }
    }
}
