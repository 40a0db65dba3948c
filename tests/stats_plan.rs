//! The statistics statement over a keyed backlog, on every backend: its plan, read with
//! `EXPLAIN`, finds each key's head once (a `GROUP BY` over the key index) and joins the rows
//! to it, never a subquery per row, which made `Store::stats` take seconds over 50,000 keyed
//! messages on MariaDB. (The bench's W16 times it: docs/performance.md.)

use outbox::{enqueue_many, outbox_event, Store};
use serde::{Deserialize, Serialize};
use sqlx::Row;

#[outbox_event(topic = "plan.keyed", ordering_key = "key")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Keyed {
    key: String,
    n: i64,
}

/// A row of MariaDB's `EXPLAIN`: select type, table, access type, key, Extra.
type PlanRow = (
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    String,
);

const MESSAGES: i64 = 20_000;
const KEYS: i64 = 200;

fn backlog() -> Vec<Keyed> {
    (0..MESSAGES)
        .map(|n| Keyed {
            key: format!("k{}", n % KEYS),
            n,
        })
        .collect()
}

/// Each key's first message ready, the rest blocked behind it.
async fn check_counts(store: &Store) {
    let stats = store.stats().await.unwrap();
    let t = stats
        .topics
        .iter()
        .find(|t| t.topic == "plan.keyed")
        .expect("stats of plan.keyed");
    assert_eq!((t.ready, t.blocked), (KEYS, MESSAGES - KEYS), "{t:?}");
}

#[tokio::test]
async fn postgres_stats_join_each_row_to_its_keys_head() {
    let db = outbox_tests::pg().await;
    for chunk in backlog().chunks(1_000) {
        let mut tx = db.pool.begin().await.unwrap();
        enqueue_many(&mut *tx, chunk).await.unwrap();
        tx.commit().await.unwrap();
    }
    sqlx::query("ANALYZE").execute(&db.pool).await.unwrap();
    let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN {}",
        outbox::__private::POSTGRES_STATS
    )))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let plan = plan.join("\n");
    println!("{plan}");
    assert!(!plan.contains("SubPlan"), "no subquery per row:\n{plan}");
    assert_eq!(
        plan.matches("Seq Scan on outbox_messages m").count(),
        1,
        "the live rows are read once:\n{plan}"
    );
    assert!(
        plan.contains("Hash") && plan.contains("Join"),
        "rows join their key's head:\n{plan}"
    );
    check_counts(&Store::from(&db.pool)).await;
    db.drop_db().await;
}

#[tokio::test]
async fn sqlite_stats_join_each_row_to_its_keys_head() {
    let db = outbox_tests::sqlite().await;
    for chunk in backlog().chunks(1_000) {
        let mut tx = outbox::sqlite_begin_immediate(&db.pool).await.unwrap();
        enqueue_many(&mut *tx, chunk).await.unwrap();
        tx.commit().await.unwrap();
    }
    sqlx::query("ANALYZE").execute(&db.pool).await.unwrap();
    let plan: Vec<String> = sqlx::query(sqlx::AssertSqlSafe(format!(
        "EXPLAIN QUERY PLAN {}",
        outbox::__private::SQLITE_STATS
    )))
    .bind(0_i64)
    .bind(5_000_i64)
    .fetch_all(&db.pool)
    .await
    .unwrap()
    .iter()
    .map(|r| r.get::<String, _>("detail"))
    .collect();
    let plan = plan.join("\n");
    println!("{plan}");
    assert!(!plan.contains("CORRELATED"), "no subquery per row:\n{plan}");
    assert!(
        plan.contains("MATERIALIZE key_heads"),
        "the heads are found once:\n{plan}"
    );
    assert!(
        plan.contains("SEARCH h USING AUTOMATIC COVERING INDEX (ordering_key=?)"),
        "each row looks its key's head up by an index:\n{plan}"
    );
    assert_eq!(
        plan.matches("SCAN m").count(),
        1,
        "the live rows are read once:\n{plan}"
    );
    assert!(
        plan.contains("USING COVERING INDEX outbox_messages_key_idx")
            || plan.contains("USING INDEX outbox_messages_key_idx"),
        "over the key index:\n{plan}"
    );
    check_counts(&Store::from(&db.pool)).await;
    db.drop_db().await;
}

#[tokio::test]
async fn mysql_stats_join_each_row_to_its_keys_head() {
    outbox_tests::skip_without_mysql!();
    let db = outbox_tests::mysql().await;
    for chunk in backlog().chunks(1_000) {
        let mut tx = db.pool.begin().await.unwrap();
        enqueue_many(&mut *tx, chunk).await.unwrap();
        tx.commit().await.unwrap();
    }
    sqlx::query("ANALYZE TABLE outbox_messages, outbox_dead")
        .execute(&db.pool)
        .await
        .unwrap();
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "EXPLAIN {}",
        outbox::__private::MYSQL_STATS
    )))
    .bind(5_000_i64)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let plan: Vec<PlanRow> = rows
        .iter()
        .map(|r| {
            (
                r.try_get::<String, _>("select_type").unwrap(),
                r.try_get::<Option<String>, _>("table").unwrap(),
                r.try_get::<Option<String>, _>("type").unwrap(),
                r.try_get::<Option<String>, _>("key").unwrap(),
                r.try_get::<Option<String>, _>("Extra")
                    .unwrap()
                    .unwrap_or_default(),
            )
        })
        .collect();
    for row in &plan {
        println!("{row:?}");
    }
    assert!(
        !plan.iter().any(|(s, ..)| s.contains("DEPENDENT")),
        "no subquery per row: {plan:#?}"
    );
    assert!(
        plan.iter()
            .any(|(_, t, _, k, e)| t.as_deref() == Some("outbox_messages")
                && k.as_deref() == Some("outbox_messages_key_idx")
                && e.contains("Using index for group-by")),
        "the heads: a loose scan of the key index, one probe per key: {plan:#?}"
    );
    // Each live row looks its key's head up by the derived table's own key; a head table
    // without a key (an ordering key too long for a temporary table's key) was scanned per
    // row, or joined through a join buffer.
    let rows: Vec<_> = plan
        .iter()
        .filter(|(_, t, ..)| t.as_deref() == Some("m"))
        .collect();
    assert_eq!(rows.len(), 1, "the live rows are read once: {plan:#?}");
    assert!(
        plan.iter().any(
            |(_, t, ty, k, _)| t.as_deref().is_some_and(|t| t.starts_with("<derived"))
                && ty.as_deref() == Some("ref")
                && k.as_deref() == Some("key0")
        ),
        "{plan:#?}"
    );
    assert!(
        !plan.iter().any(|(.., e)| e.contains("join buffer")),
        "no join buffer: {plan:#?}"
    );
    check_counts(&Store::from(&db.pool)).await;
    db.drop_db().await;
}
