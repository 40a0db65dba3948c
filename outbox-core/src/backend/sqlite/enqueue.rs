//! What runs on the application's own connection (the [`Connection`](crate::Connection)
//! trait): the insert of `enqueue`, and the dedup wrapper's processed record.
//!
//! The insert wakes the workers of this process when a message is due now (`wake.rs`). The
//! trace columns are named only when a row has a trace context: without one the statement is
//! the same as without the `opentelemetry` feature.

use sqlx::SqliteConnection;
use uuid::Uuid;

use super::{ms, wake};
use crate::backend::NewMessage;
use crate::clock::now_ms;

/// One message. `?1` id, `?2` topic, `?3` payload, `?4` idempotency key, `?5` available at,
/// `?6` created at, `?7` ordering key, `?8` whether it releases its key, `?9` its event
/// version.
const INSERT_ONE: &str =
    "INSERT INTO outbox_messages (id, topic, payload, idempotency_key, available_at, created_at, \
                                  ordering_key, releases_key, version) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)";

/// [`INSERT_ONE`] with a trace context: `?10` traceparent, `?11` tracestate.
const INSERT_ONE_TRACED: &str =
    "INSERT INTO outbox_messages (id, topic, payload, idempotency_key, available_at, created_at, \
                                  ordering_key, releases_key, version, traceparent, tracestate) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)";

/// Many messages: `?1` one JSON array of rows `[id, topic, payload, idempotency key,
/// available at, ordering key, releases key, traceparent, tracestate, version]`, `?2` created
/// at.
const INSERT_MANY: &str =
    "INSERT INTO outbox_messages (id, topic, payload, idempotency_key, available_at, created_at, \
                                  ordering_key, releases_key, traceparent, tracestate, version) \
     SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, ?2, value ->> 5, \
            coalesce(value ->> 6, 0), value ->> 7, value ->> 8, value ->> 9 FROM json_each(?1)";

/// `?1` handler, `?2` message id, `?3` now.
const RECORD_PROCESSED: &str =
    "INSERT INTO outbox_processed (handler, message_id, processed_at) VALUES (?1, ?2, ?3) \
     ON CONFLICT (handler, message_id) DO NOTHING";

/// One insert for one or many rows.
pub(super) async fn insert(
    conn: &mut SqliteConnection,
    rows: &[NewMessage],
) -> Result<(), sqlx::Error> {
    let now = now_ms();
    if let [row] = rows {
        let query = sqlx::query(match row.trace {
            None => INSERT_ONE,
            Some(_) => INSERT_ONE_TRACED,
        })
        .bind(row.id.to_string())
        .bind(row.topic)
        .bind(&row.payload)
        .bind(&row.idempotency_key)
        .bind(now.saturating_add(ms(row.delay)))
        .bind(now)
        .bind(&row.ordering_key)
        .bind(row.releases_key)
        .bind(row.version);
        let query = match &row.trace {
            Some(trace) => query.bind(trace.traceparent()).bind(trace.tracestate()),
            None => query,
        };
        query.execute(conn).await?;
        if row.delay.is_zero() {
            wake::enqueued();
        }
        return Ok(());
    }
    // One statement for the whole slice: the rows travel as one JSON array.
    let batch: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            serde_json::json!([
                r.id.to_string(),
                r.topic,
                r.payload,
                r.idempotency_key,
                now.saturating_add(ms(r.delay)),
                r.ordering_key,
                r.releases_key,
                r.trace.as_ref().map(|t| t.traceparent()),
                r.trace.as_ref().and_then(|t| t.tracestate()),
                r.version,
            ])
        })
        .collect();
    let batch = serde_json::Value::Array(batch).to_string();
    sqlx::query(INSERT_MANY)
        .bind(batch)
        .bind(now)
        .execute(conn)
        .await?;
    if rows.iter().any(|r| r.delay.is_zero()) {
        wake::enqueued();
    }
    Ok(())
}

/// Records `(handler, message_id)` as processed on `conn` (the dedup wrapper's transaction);
/// false when it already was. Its INSERT takes the database's write lock, so a concurrent
/// transaction recording the same pair waits (up to the busy timeout) until this one ends.
pub(super) async fn record_processed(
    conn: &mut SqliteConnection,
    handler: &str,
    message_id: Uuid,
) -> Result<bool, sqlx::Error> {
    let inserted = sqlx::query(RECORD_PROCESSED)
        .bind(handler)
        .bind(message_id.to_string())
        .bind(now_ms())
        .execute(conn)
        .await?
        .rows_affected();
    Ok(inserted == 1)
}
