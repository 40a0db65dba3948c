//! What runs on the application's own connection (the [`Connection`](crate::Connection)
//! trait): the insert of `enqueue`, and the dedup wrapper's processed record.
//!
//! Nothing here retries: a deadlock or a lock wait timeout in the caller's transaction is
//! the caller's to handle (it comes back as [`DatabaseErrorKind::Conflict`]), since only the
//! caller can run its whole transaction again. A deadlock (1213) has already rolled the
//! transaction back; a lock wait timeout (1205) ends only the failed statement (unless the
//! server runs with `innodb_rollback_on_timeout = ON`), leaving the caller's business rows in
//! an open transaction that a commit would store without their event. So after either,
//! [`end_after_conflict`] rolls the transaction back and, inside a transaction sqlx tracks,
//! opens a read-only one in its place until the caller ends it: a commit then stores nothing,
//! and a later write fails instead of committing on its own.
//!
//! An insert larger than the server's `max_allowed_packet` would make the server close the
//! connection, and the caller's transaction with it. So a large insert first reads the limit
//! (one `SELECT @@max_allowed_packet` on the same connection) and is refused before it is
//! sent, with [`Error::PacketTooLarge`]; the transaction stays usable.
//!
//! [`DatabaseErrorKind::Conflict`]: crate::error::DatabaseErrorKind::Conflict

use sqlx::MySqlConnection;
use uuid::Uuid;

use super::{ms, now_ms, wake};
use crate::backend::NewMessage;
use crate::error::{Error, Result};

/// The columns of an insert, in the order each row binds them.
const COLUMNS: &str = "INSERT INTO outbox_messages (id, topic, payload, idempotency_key, \
     available_at, created_at, ordering_key, releases_key, version, traceparent, tracestate) VALUES ";

/// One row's values: `?` id, topic, payload, idempotency key, delay in ms, ordering key,
/// releases key, version, traceparent, tracestate; due at the server's now plus the delay.
const ROW: &str = concat!(
    "(?, ?, ?, ?, ",
    now_ms!(),
    " + ?, ",
    now_ms!(),
    ", ?, ?, ?, ?, ?)"
);

/// Rows per statement: MySQL takes at most 65,535 placeholders in one statement, and a row
/// binds 10.
const ROWS_PER_STATEMENT: usize = 4_000;

/// What an insert sends besides its payloads, per row, at most (ids, topic, keys, times, the
/// statement's own text), for the packet check.
const ROW_OVERHEAD: usize = 1_500;

/// Inserts whose payloads together stay under this never ask the server for its packet limit:
/// every server allows at least 4 MiB unless set lower by hand (MariaDB's default is 16 MiB,
/// MySQL 8's 64 MiB).
const PACKET_CHECK_FROM: usize = 1024 * 1024;

/// `?` handler, message id.
const RECORD_PROCESSED: &str = concat!(
    "INSERT IGNORE INTO outbox_processed (handler, message_id, processed_at) VALUES (?, ?, ",
    now_ms!(),
    ")"
);

/// Inserts `rows`, in statements of up to [`ROWS_PER_STATEMENT`] rows.
pub(super) async fn insert(conn: &mut MySqlConnection, rows: &[NewMessage]) -> Result<()> {
    let Some(first) = rows.first() else {
        return Ok(());
    };
    let size: usize = rows
        .iter()
        .map(|r| r.payload.len() + r.idempotency_key.as_ref().map_or(0, String::len))
        .sum::<usize>()
        .saturating_add(rows.len().min(ROWS_PER_STATEMENT) * ROW_OVERHEAD);
    if size > PACKET_CHECK_FROM {
        let limit: u64 = sqlx::query_scalar("SELECT @@max_allowed_packet")
            .fetch_one(&mut *conn)
            .await?;
        let largest = rows
            .chunks(ROWS_PER_STATEMENT)
            .map(|c| {
                c.iter()
                    .map(|r| {
                        r.payload.len()
                            + r.idempotency_key.as_ref().map_or(0, String::len)
                            + ROW_OVERHEAD
                    })
                    .sum::<usize>()
            })
            .max()
            .unwrap_or(0);
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        if largest > limit {
            return Err(Error::PacketTooLarge {
                topic: first.topic,
                size: largest,
                limit,
            });
        }
    }
    for chunk in rows.chunks(ROWS_PER_STATEMENT) {
        let mut sql = String::with_capacity(COLUMNS.len() + chunk.len() * (ROW.len() + 2));
        sql.push_str(COLUMNS);
        for i in 0..chunk.len() {
            if i > 0 {
                sql.push_str(", ");
            }
            sql.push_str(ROW);
        }
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for r in chunk {
            query = query
                .bind(r.id)
                .bind(r.topic)
                .bind(&r.payload)
                .bind(&r.idempotency_key)
                .bind(ms(r.delay))
                .bind(&r.ordering_key)
                .bind(r.releases_key)
                .bind(r.version)
                .bind(r.trace.as_ref().map(|t| t.traceparent()))
                .bind(r.trace.as_ref().and_then(|t| t.tracestate()));
        }
        query.execute(&mut *conn).await?;
    }
    if rows.iter().any(|r| r.delay.is_zero()) {
        wake::enqueued();
    }
    Ok(())
}

/// Records `(handler, message_id)` as processed on `conn` (the dedup wrapper's transaction);
/// false when it already was. The insert locks the key, so a concurrent transaction recording
/// the same pair waits until this one ends (up to `innodb_lock_wait_timeout`).
pub(super) async fn record_processed(
    conn: &mut MySqlConnection,
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

/// Ends the caller's transaction, whether sqlx began it or the caller's own `BEGIN` did (with
/// no transaction open it does nothing).
const ROLLBACK: &str = "ROLLBACK";

/// What stands in for the caller's transaction once [`ROLLBACK`] ended it: sqlx still counts
/// it open and ends it with the caller's commit or rollback (or its drop); meanwhile writes
/// fail (1792) rather than commit one statement at a time.
const READ_ONLY: &str = "START TRANSACTION READ ONLY";

/// After an insert met a deadlock (1213) or a lock wait timeout (1205) on the caller's
/// connection: rolls the caller's transaction back, so that a caller who commits anyway stores
/// nothing of it rather than its business rows without their event, and, when sqlx tracks a
/// transaction on `conn`, opens a read-only one in its place (see [`READ_ONLY`]).
///
/// Failures are only logged: the caller gets the conflict, and a connection too broken to
/// roll back has lost its transaction with it.
pub(super) async fn end_after_conflict(conn: &mut MySqlConnection) {
    let tracked = sqlx::Connection::is_in_transaction(&*conn);
    let mut result = sqlx::query(ROLLBACK).execute(&mut *conn).await.map(drop);
    if tracked && result.is_ok() {
        result = sqlx::query(READ_ONLY).execute(&mut *conn).await.map(drop);
    }
    if let Err(e) = result {
        tracing::debug!(error = %e, "could not roll back the caller's transaction after a conflict");
    }
}
