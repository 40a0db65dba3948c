//! A producer of the commit-order test (tests/commit_order.rs), as an application writes one
//! aggregate: take the aggregate's row lock, read and bump its version, enqueue the event of
//! that version with the aggregate as ordering key, commit. Its writes of one aggregate are
//! serialised with every other producer's by the row lock, so the versions are the commit order.
//!
//! `order-producer URL WRITES AGGREGATES`: writes `WRITES` events, round-robin over aggregates
//! `0..AGGREGATES` of table `aggregates (id, n)`, on PostgreSQL, SQLite or MariaDB/MySQL. It
//! first prints `clock WALL_NS MONOTONIC_NS`, read back to back, so the test can tell how
//! far this process's wall clock is shifted (the test runs one producer under libfaketime); it
//! prints `wrote N` at the end.

use std::process::ExitCode;

use outbox::{enqueue, outbox_event, sqlite_begin_immediate};
use serde::{Deserialize, Serialize};
use sqlx::{MySqlPool, PgPool, SqlitePool};

/// A new version of an aggregate.
#[outbox_event(topic = "order.changed", ordering_key = "key")]
#[derive(Debug, Serialize, Deserialize)]
struct Changed {
    key: String,
    agg: i64,
    n: i64,
}

fn changed(agg: i64, n: i64) -> Changed {
    Changed {
        key: format!("agg:{agg}"),
        agg,
        n,
    }
}

/// This process's wall clock, as `SystemTime` reads it (through libc, which libfaketime
/// wraps), and the machine's monotonic clock (read without libc), in nanoseconds.
fn clocks() -> (i128, i128) {
    let real = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i128::try_from(d.as_nanos()).unwrap_or(i128::MAX));
    let mono = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (
        real,
        i128::from(mono.tv_sec) * 1_000_000_000 + i128::from(mono.tv_nsec),
    )
}

async fn write_pg(pool: &PgPool, agg: i64) -> Result<(), Box<dyn std::error::Error>> {
    let mut tx = pool.begin().await?;
    let n: i64 = sqlx::query_scalar("SELECT n FROM aggregates WHERE id = $1 FOR UPDATE")
        .bind(agg)
        .fetch_one(&mut *tx)
        .await?;
    sqlx::query("UPDATE aggregates SET n = $2 WHERE id = $1")
        .bind(agg)
        .bind(n + 1)
        .execute(&mut *tx)
        .await?;
    enqueue(&mut *tx, &changed(agg, n + 1)).await?;
    tx.commit().await?;
    Ok(())
}

async fn write_mysql(pool: &MySqlPool, agg: i64) -> Result<(), Box<dyn std::error::Error>> {
    let mut tx = pool.begin().await?;
    let n: i64 = sqlx::query_scalar("SELECT n FROM aggregates WHERE id = ? FOR UPDATE")
        .bind(agg)
        .fetch_one(&mut *tx)
        .await?;
    sqlx::query("UPDATE aggregates SET n = ? WHERE id = ?")
        .bind(n + 1)
        .bind(agg)
        .execute(&mut *tx)
        .await?;
    enqueue(&mut *tx, &changed(agg, n + 1)).await?;
    tx.commit().await?;
    Ok(())
}

async fn write_sqlite(pool: &SqlitePool, agg: i64) -> Result<(), Box<dyn std::error::Error>> {
    // SQLite has no row locks: BEGIN IMMEDIATE takes the write lock first, which serialises
    // every write of the database.
    let mut tx = sqlite_begin_immediate(pool).await?;
    let n: i64 = sqlx::query_scalar("SELECT n FROM aggregates WHERE id = ?1")
        .bind(agg)
        .fetch_one(&mut *tx)
        .await?;
    sqlx::query("UPDATE aggregates SET n = ?2 WHERE id = ?1")
        .bind(agg)
        .bind(n + 1)
        .execute(&mut *tx)
        .await?;
    enqueue(&mut *tx, &changed(agg, n + 1)).await?;
    tx.commit().await?;
    Ok(())
}

enum Pool {
    Pg(PgPool),
    MySql(MySqlPool),
    Sqlite(SqlitePool),
}

async fn run(url: &str, writes: i64, aggregates: i64) -> Result<(), Box<dyn std::error::Error>> {
    let pool = if url.starts_with("postgres") {
        Pool::Pg(PgPool::connect(url).await?)
    } else if url.starts_with("mysql") {
        Pool::MySql(MySqlPool::connect(url).await?)
    } else {
        Pool::Sqlite(outbox::sqlite_pool(url).await?)
    };
    let (real, mono) = clocks();
    println!("clock {real} {mono}");
    for i in 0..writes {
        let agg = i % aggregates;
        // A write that fails (a busy database) is tried again: each one must land once.
        let mut tries = 0;
        loop {
            let written = match &pool {
                Pool::Pg(p) => write_pg(p, agg).await,
                Pool::MySql(p) => write_mysql(p, agg).await,
                Pool::Sqlite(p) => write_sqlite(p, agg).await,
            };
            match written {
                Ok(()) => break,
                Err(e) if tries < 20 => {
                    tries += 1;
                    eprintln!("write of aggregate {agg} failed, trying again: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
    println!("wrote {writes}");
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (Some(url), Some(writes), Some(aggregates)) = (
        args.get(1),
        args.get(2).and_then(|s| s.parse().ok()),
        args.get(3).and_then(|s| s.parse().ok()),
    ) else {
        eprintln!("usage: order-producer URL WRITES AGGREGATES");
        return ExitCode::from(2);
    };
    match run(url, writes, aggregates).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("order-producer: {e}");
            ExitCode::FAILURE
        }
    }
}
