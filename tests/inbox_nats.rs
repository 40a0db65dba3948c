//! The inbox (`outbox_handlers::inbox`) against the NATS server at `NATS_URL` (default
//! 127.0.0.1:4222), on PostgreSQL and on MariaDB: messages relayed into a stream are consumed
//! through the processed-id dedup, so each effect row exists exactly once even when the same
//! outbox message is delivered twice (published again past the duplicate window, or redelivered
//! after a crash between the commit and the ack); a retryable failure is retried, a permanent
//! one terminated.
//!
//! Each test is written once, generic over the database ([`Db`]), and run on each by
//! [`on_each_database!`]: `postgres::…` and `mariadb::…`.
//!
//! Every test makes a stream and a durable consumer of its own and deletes them at the end.

use std::time::Duration;

use futures_util::StreamExt;
use outbox::{outbox_event, Context, Event, HandlerError, Resources};
use outbox_handlers::async_nats::{self, jetstream};
use outbox_handlers::dedup::TxHandler;
use outbox_handlers::inbox::{Inbox, InboxMessage, Processed};
use outbox_handlers::relay::headers;
use outbox_handlers::relay::nats::NatsPublisher;
use outbox_tests::{mysql, pg, wait_until, MySqlDb, TestDb};
use serde::{Deserialize, Serialize};
use sqlx::{Database, MySql, Pool, Postgres};
use uuid::Uuid;

#[outbox_event(topic = "inbox.payment.captured")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct PaymentCaptured {
    n: i64,
    #[serde(default)]
    fail_first: bool,
    #[serde(default)]
    poison: bool,
}

/// Inserts one row into `effects`, keyed by the original outbox message id.
struct Record;

/// [`Record`] on database `$db`, whose placeholders `$insert` uses.
macro_rules! record_on {
    ($db:ty, $insert:literal) => {
        #[outbox::async_trait]
        impl TxHandler<$db> for Record {
            type Event = PaymentCaptured;
            const NAME: &'static str = "record-payment";

            async fn handle(
                &self,
                e: PaymentCaptured,
                ctx: &Context,
                tx: &mut <$db as Database>::Connection,
            ) -> Result<(), HandlerError> {
                let origin = InboxMessage::of(ctx).expect("inbox metadata").message_id;
                if ctx.message_id() != origin {
                    return Err(HandlerError::permanent(format!(
                        "the context names message {}, the relay sent {origin}",
                        ctx.message_id()
                    )));
                }
                // The context's message id is the producer's: the effects below are checked by
                // it.
                sqlx::query($insert)
                    .bind(ctx.message_id())
                    .bind(e.n)
                    .execute(&mut *tx)
                    .await?;
                if e.poison {
                    return Err(HandlerError::permanent("poison payment"));
                }
                if e.fail_first && ctx.attempt() == 1 {
                    return Err(HandlerError::retry("the ledger is busy"));
                }
                Ok(())
            }
        }
    };
}

record_on!(
    Postgres,
    "INSERT INTO effects (message_id, n) VALUES ($1, $2)"
);
record_on!(MySql, "INSERT INTO effects (message_id, n) VALUES (?, ?)");

/// A migrated test database with an `effects` table, on one of the servers the inbox runs on.
trait Db: Sized {
    type Database: Database<Connection: outbox::Connection>;

    /// A fresh database, migrated, with an empty `effects` table.
    async fn create() -> Self;
    fn pool(&self) -> &Pool<Self::Database>;
    /// The rows of `effects`, `(message_id, n)` by `n`.
    async fn effects(&self) -> Vec<(Uuid, i64)>;
    /// The processed records of `handler`.
    async fn records(&self, handler: &str) -> i64;
    async fn drop_db(self);
}

impl Db for TestDb {
    type Database = Postgres;

    async fn create() -> Self {
        let db = pg().await;
        sqlx::raw_sql(
            "CREATE TABLE effects (id BIGSERIAL PRIMARY KEY, message_id UUID NOT NULL, n BIGINT NOT NULL)",
        )
        .execute(&db.pool)
        .await
        .unwrap();
        db
    }

    fn pool(&self) -> &Pool<Postgres> {
        &self.pool
    }

    async fn effects(&self) -> Vec<(Uuid, i64)> {
        sqlx::query_as("SELECT message_id, n FROM effects ORDER BY n, id")
            .fetch_all(&self.pool)
            .await
            .unwrap()
    }

    async fn records(&self, handler: &str) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM outbox_processed WHERE handler = $1")
            .bind(handler)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    async fn drop_db(self) {
        TestDb::drop_db(self).await;
    }
}

impl Db for MySqlDb {
    type Database = MySql;

    async fn create() -> Self {
        let db = mysql().await;
        sqlx::raw_sql(
            "CREATE TABLE effects (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
             message_id BINARY(16) NOT NULL, n BIGINT NOT NULL)",
        )
        .execute(&db.pool)
        .await
        .unwrap();
        db
    }

    fn pool(&self) -> &Pool<MySql> {
        &self.pool
    }

    async fn effects(&self) -> Vec<(Uuid, i64)> {
        sqlx::query_as("SELECT message_id, n FROM effects ORDER BY n, id")
            .fetch_all(&self.pool)
            .await
            .unwrap()
    }

    async fn records(&self, handler: &str) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM outbox_processed WHERE handler = ?")
            .bind(handler)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    async fn drop_db(self) {
        MySqlDb::drop_db(self).await;
    }
}

/// Runs each of the generic tests named on PostgreSQL (`postgres::<test>`) and on MariaDB
/// (`mariadb::<test>`).
macro_rules! on_each_database {
    ($($test:ident),* $(,)?) => {
        mod postgres {
            $(#[tokio::test]
            async fn $test() {
                super::$test::<outbox_tests::TestDb>().await;
            })*
        }
        mod mariadb {
            $(#[tokio::test]
            async fn $test() {
                outbox_tests::skip_without_mysql!();
                super::$test::<outbox_tests::MySqlDb>().await;
            })*
        }
    };
}

on_each_database!(
    each_effect_happens_once_when_a_message_is_delivered_twice,
    a_redelivery_after_a_crash_between_commit_and_ack_is_skipped,
);

async fn setup<D: Db>() -> (jetstream::Context, String, String, D) {
    let js = outbox_tests::nats::jetstream().await;
    let (name, prefix) = outbox_tests::nats::memory_stream(&js, "inbox").await;
    (js, name, prefix, D::create().await)
}

async fn consumer(js: &jetstream::Context, stream: &str) -> jetstream::consumer::PullConsumer {
    js.get_stream(stream)
        .await
        .unwrap()
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some("inbox".into()),
            ack_wait: Duration::from_secs(1),
            ..Default::default()
        })
        .await
        .expect("create the durable consumer")
}

fn ctx() -> Context {
    Context::for_test(PaymentCaptured::TOPIC, "nats-relay", Resources::new())
}

fn payment(n: i64) -> PaymentCaptured {
    PaymentCaptured {
        n,
        fail_first: false,
        poison: false,
    }
}

async fn each_effect_happens_once_when_a_message_is_delivered_twice<D: Db>()
where
    Record: TxHandler<D::Database>,
{
    let (js, stream, prefix, db) = setup::<D>().await;
    let nats = NatsPublisher::builder(js.clone())
        .prefix(prefix.clone())
        .build()
        .unwrap();

    let first = ctx();
    nats.publish(&payment(1), &first).await.unwrap();
    // The same outbox message again, past the stream's duplicate window: another Nats-Msg-Id,
    // the same outbox message id.
    let mut again = async_nats::HeaderMap::new();
    again.insert("Nats-Msg-Id", "published-again");
    again.insert(headers::MESSAGE_ID, first.message_id().to_string().as_str());
    again.insert(headers::TOPIC, PaymentCaptured::TOPIC);
    js.publish_with_headers(
        nats.subject(PaymentCaptured::TOPIC),
        again,
        serde_json::to_vec(&payment(1)).unwrap().into(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    nats.publish(&payment(2), &ctx()).await.unwrap();
    let retried = ctx();
    nats.publish(
        &PaymentCaptured {
            n: 3,
            fail_first: true,
            poison: false,
        },
        &retried,
    )
    .await
    .unwrap();
    nats.publish(
        &PaymentCaptured {
            n: 4,
            fail_first: false,
            poison: true,
        },
        &ctx(),
    )
    .await
    .unwrap();

    let inbox = Inbox::builder(consumer(&js, &stream).await, db.pool().clone())
        .handler(Record)
        .build()
        .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn({
        let inbox = inbox.clone();
        async move {
            inbox
                .run_until(async {
                    let _ = stopped.await;
                })
                .await
        }
    });

    let probe = consumer(&js, &stream).await;
    wait_until(
        Duration::from_secs(20),
        "the inbox answers every message",
        async || {
            let info = probe.get_info().await.unwrap();
            info.num_pending == 0 && info.num_ack_pending == 0
        },
    )
    .await;
    stop.send(()).unwrap();
    running.await.unwrap().unwrap();

    let rows = db.effects().await;
    let ns: Vec<i64> = rows.iter().map(|r| r.1).collect();
    // 1 once despite two deliveries; 3 once after its retry; 4 rolled back with its record.
    assert_eq!(ns, vec![1, 2, 3], "{rows:?}");
    assert_eq!(rows[0].0, first.message_id());
    assert_eq!(rows[2].0, retried.message_id());
    assert_eq!(db.records("record-payment").await, 3);

    js.delete_stream(&stream).await.unwrap();
    db.drop_db().await;
}

async fn a_redelivery_after_a_crash_between_commit_and_ack_is_skipped<D: Db>()
where
    Record: TxHandler<D::Database>,
{
    let (js, stream, prefix, db) = setup::<D>().await;
    let nats = NatsPublisher::builder(js.clone())
        .prefix(prefix.clone())
        .build()
        .unwrap();
    let published = ctx();
    nats.publish(&payment(7), &published).await.unwrap();

    let consumer = consumer(&js, &stream).await;
    let inbox = Inbox::builder(consumer.clone(), db.pool().clone())
        .handler(Record)
        .build()
        .unwrap();
    let fetch = || async {
        consumer
            .fetch()
            .max_messages(1)
            .expires(Duration::from_secs(5))
            .messages()
            .await
            .unwrap()
            .next()
            .await
            .expect("a message")
            .unwrap()
    };

    // The effect commits, then the process "dies" before acknowledging.
    let delivery = fetch().await;
    let done: Processed = inbox.process(&delivery).await.unwrap();
    assert_eq!((done.ran, done.skipped), (1, 0));
    drop(delivery);

    // After ack_wait, JetStream delivers it again: the record says it is done.
    let redelivery = fetch().await;
    let meta = InboxMessage::from_message(&redelivery).unwrap();
    assert_eq!(meta.delivered, 2);
    assert_eq!(meta.message_id, published.message_id());
    let done = inbox.process(&redelivery).await.unwrap();
    assert_eq!((done.ran, done.skipped), (0, 1));
    inbox.handle(redelivery).await;

    assert_eq!(db.effects().await.len(), 1);
    let info = consumer.get_info().await.unwrap();
    assert_eq!((info.num_pending, info.num_ack_pending), (0, 0));

    js.delete_stream(&stream).await.unwrap();
    db.drop_db().await;
}
