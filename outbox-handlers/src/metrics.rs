//! Every metric the handlers record, defined in one place, beside the outbox's own
//! ([`outbox::metrics`]).
//!
//! They go through the same [`metrics`] facade: the recorder that shows the outbox's metrics
//! (the `prometheus` feature's `outbox::observe::install_prometheus`, or any other) shows these
//! too. Call [`describe`] once after installing it to give them their descriptions.
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | `outbox_relay_connection_losses_total` | counter | `relay` (`rabbitmq`, `nats`) | broker connections a relay had and lost; each one is also logged once, at WARN |
//! | `outbox_relay_publishes_waited_for_reconnect_total` | counter | `relay` (`rabbitmq`, `nats`) | publishes that waited for the broker connection to come back instead of failing at once: those its loss caught in flight and those that came while it was down |
//!
//! A publish that waited is counted once, however long the outage: the counter grows by the
//! publishes that an outage held up, and stops growing while the connection is up.

/// Counter: broker connections a relay lost, by `relay`.
pub const RELAY_CONNECTION_LOSSES: &str = "outbox_relay_connection_losses_total";
/// Counter: publishes that waited for a broker reconnect, by `relay`.
pub const RELAY_PUBLISHES_WAITED: &str = "outbox_relay_publishes_waited_for_reconnect_total";

/// Registers the descriptions of every handler metric with the installed recorder.
pub fn describe() {
    use metrics::describe_counter;
    describe_counter!(
        RELAY_CONNECTION_LOSSES,
        "Broker connections a relay had and lost, by relay"
    );
    describe_counter!(
        RELAY_PUBLISHES_WAITED,
        "Publishes that waited for the broker connection to come back instead of failing, by relay"
    );
}
