//! A handler crate that is linked registers its handler, and the registry finds it.
//!
//! On SQLite only, as a database at hand: the registry and its checks are the same on every
//! backend, so there is no PostgreSQL or MariaDB variant.

// Referring to the crate is what links it; without this line its registration is dropped.
use fixture_handlers as _;

use outbox::{HandlerInfo, Registry};

#[test]
fn linked_handler_crate_is_found() {
    let registry = Registry::linked();
    let topics = registry.topics();
    let served: Vec<(&str, &str)> = topics["fixture.shipped"]
        .iter()
        .map(|h: &HandlerInfo| (h.name, h.type_name))
        .collect();
    assert_eq!(
        served,
        [("shipment-notifier", "fixture_handlers::ShipmentNotifier")]
    );
    assert!(registry.events().any(
        |e| e.topic() == "fixture.shipped" && e.type_name() == "fixture_events::FixtureShipped"
    ));
    registry.check().unwrap();
    outbox::assert_all_events_handled();
}

#[tokio::test]
async fn a_worker_with_the_handler_crate_linked_starts() {
    let pool = sqlx::SqlitePool::connect_lazy("sqlite::memory:").unwrap();
    outbox::Worker::builder(&pool)
        .registry(Registry::linked())
        .build()
        .unwrap();
}
