//! What runs on the application's own connection (the [`Connection`](crate::Connection)
//! trait): the insert of `enqueue`, and the dedup wrapper's processed record.
//!
//! The insert also wakes a waiting worker, but only one that serves the message's topic, is
//! alive and sleeps on LISTEN, and only when the message is due now: busy systems never take
//! NOTIFY's commit lock. The notification names the worker it is for, so the others sleep on.
//! The trace columns are named only when a row has a trace context: without one the statement
//! is the same as without the `opentelemetry` feature.
//!
//! A keyed message takes its place in its key's order here, from the sequence
//! `outbox_messages_seq`, at insert time: under the application's row lock on the aggregate,
//! that is the order in which its writes commit. The rows of one `enqueue_many` draw their
//! numbers in slice order (the order `UNNEST` yields them). Unkeyed messages draw none.

use sqlx::PgConnection;
use uuid::Uuid;

use super::secs;
use crate::backend::NewMessage;

/// One message. `$1` id, `$2` topic, `$3` payload, `$4` idempotency key, `$5` delay in
/// seconds, `$6` ordering key, `$7` whether it releases its key, `$8` its event version.
const INSERT_ONE: &str = "WITH ins AS ( \
        INSERT INTO outbox_messages (id, topic, payload, idempotency_key, available_at, \
                                     ordering_key, releases_key, version, seq) \
        VALUES ($1, $2, $3::json, $4, now() + make_interval(secs => $5), $6, $7, $8, \
                CASE WHEN $6::text IS NULL THEN 0 ELSE nextval('outbox_messages_seq') END) \
     ) \
     SELECT pg_notify('outbox_wakeup', w.id::text) FROM outbox_workers w \
     WHERE $5 = 0 AND w.waiting AND $2 = ANY(w.topics) \
       AND w.heartbeat_at > now() - interval '5 seconds' LIMIT 1";

/// [`INSERT_ONE`] with a trace context: `$9` traceparent, `$10` tracestate.
const INSERT_ONE_TRACED: &str = "WITH ins AS ( \
        INSERT INTO outbox_messages (id, topic, payload, idempotency_key, available_at, \
                                     ordering_key, releases_key, version, seq, traceparent, tracestate) \
        VALUES ($1, $2, $3::json, $4, now() + make_interval(secs => $5), $6, $7, $8, \
                CASE WHEN $6::text IS NULL THEN 0 ELSE nextval('outbox_messages_seq') END, $9, $10) \
     ) \
     SELECT pg_notify('outbox_wakeup', w.id::text) FROM outbox_workers w \
     WHERE $5 = 0 AND w.waiting AND $2 = ANY(w.topics) \
       AND w.heartbeat_at > now() - interval '5 seconds' LIMIT 1";

/// Many messages, one array per column: `$1` ids, `$2` topics, `$3` payloads, `$4`
/// idempotency keys, `$5` delays in seconds, `$7` ordering keys, `$8` whether each releases
/// its key, `$9` event versions; `$6` the topics of the messages due now, whose workers are
/// woken.
const INSERT_MANY: &str = "WITH ins AS ( \
        INSERT INTO outbox_messages (id, topic, payload, idempotency_key, available_at, \
                                     ordering_key, releases_key, version, seq) \
        SELECT u.id, u.topic, u.payload::json, u.idempotency_key, now() + make_interval(secs => u.delay), \
               u.ordering_key, u.releases_key, u.version, \
               CASE WHEN u.ordering_key IS NULL THEN 0 ELSE nextval('outbox_messages_seq') END \
        FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::float8[], $7::text[], $8::bool[], \
                    $9::int4[]) \
             AS u(id, topic, payload, idempotency_key, delay, ordering_key, releases_key, version) \
     ) \
     SELECT pg_notify('outbox_wakeup', w.id::text) FROM outbox_workers w \
     WHERE w.waiting AND w.topics && $6::text[] \
       AND w.heartbeat_at > now() - interval '5 seconds' LIMIT 1";

/// [`INSERT_MANY`] where a row has a trace context: `$10` traceparents, `$11` tracestates.
const INSERT_MANY_TRACED: &str = "WITH ins AS ( \
        INSERT INTO outbox_messages (id, topic, payload, idempotency_key, available_at, \
                                     ordering_key, releases_key, version, seq, traceparent, tracestate) \
        SELECT u.id, u.topic, u.payload::json, u.idempotency_key, now() + make_interval(secs => u.delay), \
               u.ordering_key, u.releases_key, u.version, \
               CASE WHEN u.ordering_key IS NULL THEN 0 ELSE nextval('outbox_messages_seq') END, \
               u.traceparent, u.tracestate \
        FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::float8[], $7::text[], $8::bool[], \
                    $9::int4[], $10::text[], $11::text[]) \
             AS u(id, topic, payload, idempotency_key, delay, ordering_key, releases_key, version, \
                  traceparent, tracestate) \
     ) \
     SELECT pg_notify('outbox_wakeup', w.id::text) FROM outbox_workers w \
     WHERE w.waiting AND w.topics && $6::text[] \
       AND w.heartbeat_at > now() - interval '5 seconds' LIMIT 1";

/// `$1` handler, `$2` message id.
const RECORD_PROCESSED: &str =
    "INSERT INTO outbox_processed (handler, message_id) VALUES ($1, $2) \
     ON CONFLICT (handler, message_id) DO NOTHING";

/// One insert for one or many rows.
pub(super) async fn insert(
    conn: &mut PgConnection,
    rows: &[NewMessage],
) -> Result<(), sqlx::Error> {
    if let [row] = rows {
        let sql = match row.trace {
            Some(_) => INSERT_ONE_TRACED,
            None => INSERT_ONE,
        };
        let mut query = sqlx::query(sql)
            .bind(row.id)
            .bind(row.topic)
            .bind(&row.payload)
            .bind(&row.idempotency_key)
            .bind(secs(row.delay))
            .bind(&row.ordering_key)
            .bind(row.releases_key)
            .bind(row.version);
        if let Some(trace) = &row.trace {
            query = query.bind(trace.traceparent()).bind(trace.tracestate());
        }
        query.execute(conn).await?;
        return Ok(());
    }
    let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
    let topics: Vec<&str> = rows.iter().map(|r| r.topic).collect();
    let payloads: Vec<&str> = rows.iter().map(|r| r.payload.as_str()).collect();
    let keys: Vec<Option<&str>> = rows.iter().map(|r| r.idempotency_key.as_deref()).collect();
    let delays: Vec<f64> = rows.iter().map(|r| secs(r.delay)).collect();
    let ordering: Vec<Option<&str>> = rows.iter().map(|r| r.ordering_key.as_deref()).collect();
    let releases: Vec<bool> = rows.iter().map(|r| r.releases_key).collect();
    let versions: Vec<i32> = rows.iter().map(|r| r.version).collect();
    let due_now: Vec<&str> = rows
        .iter()
        .filter(|r| r.delay.is_zero())
        .map(|r| r.topic)
        .collect();
    let traced = rows.iter().any(|r| r.trace.is_some());
    let sql = if traced {
        INSERT_MANY_TRACED
    } else {
        INSERT_MANY
    };
    let mut query = sqlx::query(sql)
        .bind(ids)
        .bind(topics)
        .bind(payloads)
        .bind(keys)
        .bind(delays)
        .bind(due_now)
        .bind(ordering)
        .bind(releases)
        .bind(versions);
    if traced {
        let parents: Vec<Option<&str>> = rows
            .iter()
            .map(|r| r.trace.as_ref().map(|t| t.traceparent()))
            .collect();
        let states: Vec<Option<&str>> = rows
            .iter()
            .map(|r| r.trace.as_ref().and_then(|t| t.tracestate()))
            .collect();
        query = query.bind(parents).bind(states);
    }
    query.execute(conn).await?;
    Ok(())
}

/// Records `(handler, message_id)` as processed on `conn` (the dedup wrapper's transaction);
/// false when it already was. A concurrent transaction recording the same pair makes this wait
/// on the primary key until it ends.
pub(super) async fn record_processed(
    conn: &mut PgConnection,
    handler: &str,
    message_id: Uuid,
) -> Result<bool, sqlx::Error> {
    let inserted = sqlx::query(RECORD_PROCESSED)
        .bind(handler)
        .bind(message_id)
        .execute(conn)
        .await?
        .rows_affected();
    Ok(inserted == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The traced inserts are the plain ones with the trace columns added, nothing else.
    #[test]
    fn traced_inserts_only_add_the_trace_columns() {
        let columns = "releases_key, version, seq) ";
        let traced = "releases_key, version, seq, traceparent, tracestate) ";
        let seq = "nextval('outbox_messages_seq') END";
        assert_eq!(
            INSERT_ONE_TRACED,
            INSERT_ONE.replacen(columns, traced, 1).replacen(
                &format!("{seq})"),
                &format!("{seq}, $9, $10)"),
                1
            )
        );
        assert_eq!(
            INSERT_MANY_TRACED,
            INSERT_MANY
                .replacen(columns, traced, 1)
                .replacen(
                    &format!("{seq} "),
                    &format!("{seq}, u.traceparent, u.tracestate "),
                    1
                )
                .replacen("$9::int4[])", "$9::int4[], $10::text[], $11::text[])", 1)
                .replacen(
                    "releases_key, version) ",
                    "releases_key, version, traceparent, tracestate) ",
                    1
                )
        );
    }
}
