//! W7 and W8: the JetStream relay against raw async-nats publishing, and the inbox consuming;
//! W7R: the RabbitMQ relay against raw lapin publishing.
//!
//! W7 and W8 run against the NATS server at `--nats-url` (JetStream enabled), in a file-backed
//! stream the bench creates and deletes; W7R against the RabbitMQ at `--amqp-url`, in a durable
//! queue the bench declares and deletes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use futures_util::stream::{FuturesUnordered, StreamExt};
use outbox::{Context, HandlerError, RawHandler, Worker, WorkerConfig};
use outbox_handlers::async_nats::{self, jetstream, HeaderMap};
use outbox_handlers::dedup::TxHandler;
use outbox_handlers::inbox::Inbox;
use outbox_handlers::lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions, QueuePurgeOptions,
};
use outbox_handlers::lapin::types::FieldTable;
use outbox_handlers::lapin::{self, BasicProperties, Confirmation};
use outbox_handlers::relay::nats::NatsPublisher;
use outbox_handlers::relay::rabbitmq::RabbitPublisher;
use sqlx::PgConnection;

use crate::cpu::CpuMeter;
use crate::db::{Db, Pool};
use crate::workloads::{messages, BenchMessage, Sample, TOPIC};

/// A file-backed stream of its own, capturing `{prefix}.>`.
pub(crate) struct BenchStream {
    js: jetstream::Context,
    name: String,
    prefix: String,
}

impl BenchStream {
    pub(crate) async fn create(url: &str) -> Result<BenchStream> {
        let client = async_nats::connect(url)
            .await
            .with_context(|| format!("connecting to NATS at {url}"))?;
        let js = jetstream::new(client);
        let id = uuid::Uuid::now_v7().simple().to_string();
        let (name, prefix) = (format!("bench_{id}"), format!("b{id}"));
        js.create_stream(jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![format!("{prefix}.>")],
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        })
        .await
        .map_err(|e| anyhow!("creating a JetStream stream (is JetStream enabled?): {e}"))?;
        Ok(BenchStream { js, name, prefix })
    }

    async fn purge(&self) -> Result<()> {
        let stream = self.js.get_stream(&self.name).await?;
        stream.purge().await.map_err(|e| anyhow!("{e}"))?;
        Ok(())
    }

    async fn messages(&self) -> Result<u64> {
        let mut stream = self.js.get_stream(&self.name).await?;
        Ok(stream.info().await?.state.messages)
    }

    pub(crate) async fn delete(self) {
        let _ = self.js.delete_stream(&self.name).await;
    }
}

/// W7, ours: `n` pending messages relayed by a default worker (`raw_handler` with the
/// publisher), timed from worker start until none is live; the stream must then hold `n`.
pub(crate) async fn w7_relay(db: &Db, stream: &BenchStream, n: u64) -> Result<Sample> {
    stream.purge().await?;
    let nats = NatsPublisher::builder(stream.js.clone())
        .prefix(stream.prefix.clone())
        .build()?;
    let sample = relay_drain(db, n, nats).await?;
    let stored = stream.messages().await?;
    if stored != n {
        bail!("the stream holds {stored} messages, not {n}");
    }
    Ok(sample)
}

/// `n` pending messages handled by a default worker with `relay` as their topic's raw
/// handler, timed from worker start until none is live.
async fn relay_drain<H: RawHandler>(db: &Db, n: u64, relay: H) -> Result<Sample> {
    db.seed(&messages(n)).await?;
    db.analyze().await?;
    db.checkpoint().await?;
    let meter = CpuMeter::start(db).await;
    let start = Instant::now();
    let w = Worker::builder(db.pool.store())
        .raw_handler(TOPIC, Arc::new(relay))
        .config(WorkerConfig::default())
        .build()?;
    let mut drained = Err(anyhow!("the worker stopped first"));
    w.run_until(async {
        drained = until_empty(db, Duration::from_secs(120)).await;
    })
    .await?;
    drained?;
    let secs = start.elapsed().as_secs_f64();
    let cpu = meter.stop(db).await;
    Ok(Sample {
        rate: n as f64 / secs,
        cpu: cpu.per(n),
    })
}

/// The JSON of messages `0..n`, as the raw publishes of W7 and W7R send them.
fn payloads(n: u64) -> Result<Vec<Vec<u8>>> {
    Ok(messages(n)
        .iter()
        .map(serde_json::to_vec)
        .collect::<Result<_, _>>()?)
}

async fn until_empty(db: &Db, limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    while db.remaining(&[TOPIC]).await? > 0 {
        if Instant::now() >= deadline {
            bail!("messages still live after {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

/// W7, raw: the same `n` payloads published with async-nats, `in_flight` awaiting their
/// acknowledgement at once, each with a `Nats-Msg-Id` as the relay sends.
pub(crate) async fn w7_raw(
    db: &Db,
    stream: &BenchStream,
    n: u64,
    in_flight: usize,
) -> Result<Sample> {
    stream.purge().await?;
    let payloads = payloads(n)?;
    let subject = format!("{}.{TOPIC}", stream.prefix);
    let meter = CpuMeter::start(db).await;
    let start = Instant::now();
    let mut pending = FuturesUnordered::new();
    for (i, payload) in payloads.into_iter().enumerate() {
        if pending.len() >= in_flight {
            if let Some(r) = pending.next().await {
                r?;
            }
        }
        let mut h = HeaderMap::new();
        h.insert("Nats-Msg-Id", format!("raw-{i}").as_str());
        let js = stream.js.clone();
        let subject = subject.clone();
        pending.push(async move {
            let ack = js
                .publish_with_headers(subject, h, payload.into())
                .await
                .map_err(|e| anyhow!("{e}"))?;
            ack.await.map_err(|e| anyhow!("{e}"))?;
            Ok::<(), anyhow::Error>(())
        });
    }
    while let Some(r) = pending.next().await {
        r?;
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = meter.stop(db).await;
    Ok(Sample {
        rate: n as f64 / secs,
        cpu: cpu.per(n),
    })
}

/// The inbox's handler in W8: does nothing but take part in the dedup transaction.
struct Consume;

#[outbox::async_trait]
impl TxHandler<sqlx::Postgres> for Consume {
    type Event = BenchMessage;
    const NAME: &'static str = "bench-consume";

    async fn handle(
        &self,
        _: BenchMessage,
        _: &Context,
        _: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// W8: the inbox consumes what W7's relay left in the stream (`n` messages with the relay's
/// headers), each in a transaction with its processed-id record; timed from the inbox's start
/// until every message is acknowledged.
pub(crate) async fn w8_inbox(db: &Db, stream: &BenchStream, n: u64) -> Result<Sample> {
    let Pool::Pg(pool) = &db.pool else {
        bail!("the inbox runs on PostgreSQL");
    };
    sqlx::query("TRUNCATE outbox_processed")
        .execute(pool)
        .await?;
    let js_stream = stream.js.get_stream(&stream.name).await?;
    let durable = format!("w8_{}", uuid::Uuid::now_v7().simple());
    let consumer = js_stream
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some(durable.clone()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .map_err(|e| anyhow!("{e}"))?;
    let meter = CpuMeter::start(db).await;
    let start = Instant::now();
    let inbox = Inbox::builder(consumer.clone(), pool.clone())
        .handler(Consume)
        .concurrency(32)
        .build()?;
    let deadline = start + Duration::from_secs(120);
    let mut done = Err(anyhow!("the inbox stopped first"));
    inbox
        .run_until(async {
            done = async {
                loop {
                    let (processed,): (i64,) =
                        sqlx::query_as("SELECT count(*) FROM outbox_processed")
                            .fetch_one(pool)
                            .await?;
                    if processed as u64 >= n {
                        let mut c = consumer.clone();
                        let info = c.info().await.map_err(|e| anyhow!("{e}"))?;
                        if info.num_ack_pending == 0 && info.num_pending == 0 {
                            return Ok(());
                        }
                    }
                    if Instant::now() >= deadline {
                        bail!("{processed} of {n} consumed after 120 s");
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
            .await;
        })
        .await
        .map_err(|e| anyhow!("the inbox failed: {e}"))?;
    done?;
    let secs = start.elapsed().as_secs_f64();
    let cpu = meter.stop(db).await;
    let _ = js_stream.delete_consumer(&durable).await;
    Ok(Sample {
        rate: n as f64 / secs,
        cpu: cpu.per(n),
    })
}

/// Whether the NATS server at `url` answers.
pub(crate) async fn reachable(url: &str) -> bool {
    tokio::time::timeout(Duration::from_secs(2), async_nats::connect(url))
        .await
        .is_ok_and(|c| c.is_ok())
}

/// W7R's broker side: a direct exchange of its own and a durable queue bound to it for
/// [`TOPIC`], on the RabbitMQ at `--amqp-url`.
pub(crate) struct BenchQueue {
    url: String,
    conn: lapin::Connection,
    channel: lapin::Channel,
    exchange: String,
    queue: String,
}

impl BenchQueue {
    pub(crate) async fn create(url: &str) -> Result<BenchQueue> {
        let conn = lapin::Connection::connect(url, lapin::ConnectionProperties::default())
            .await
            .with_context(|| format!("connecting to RabbitMQ at {url}"))?;
        let channel = conn.create_channel().await?;
        let id = uuid::Uuid::now_v7().simple().to_string();
        let (exchange, queue) = (format!("bench-x-{id}"), format!("bench-q-{id}"));
        channel
            .exchange_declare(
                exchange.as_str().into(),
                lapin::ExchangeKind::Direct,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            )
            .await?;
        channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        channel
            .queue_bind(
                queue.as_str().into(),
                exchange.as_str().into(),
                TOPIC.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok(BenchQueue {
            url: url.to_string(),
            conn,
            channel,
            exchange,
            queue,
        })
    }

    async fn purge(&self) -> Result<()> {
        self.channel
            .queue_purge(self.queue.as_str().into(), QueuePurgeOptions::default())
            .await?;
        Ok(())
    }

    async fn messages(&self) -> Result<u32> {
        let q = self
            .channel
            .queue_declare(
                self.queue.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        Ok(q.message_count())
    }

    pub(crate) async fn delete(self) {
        let _ = self
            .channel
            .queue_delete(self.queue.as_str().into(), QueueDeleteOptions::default())
            .await;
        let _ = self
            .channel
            .exchange_delete(
                self.exchange.as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await;
        let _ = self.conn.close(200, "bench done".into()).await;
    }
}

/// W7R, ours: `n` pending messages relayed to RabbitMQ by a default worker (`raw_handler` with
/// the publisher, a confirm-mode channel per publish in flight), timed from worker start until
/// none is live; the queue must then hold `n`.
pub(crate) async fn w7r_relay(db: &Db, queue: &BenchQueue, n: u64) -> Result<Sample> {
    queue.purge().await?;
    let rabbit = RabbitPublisher::builder(queue.url.clone())
        .exchange(queue.exchange.clone())
        .build()?;
    let sample = relay_drain(db, n, rabbit).await?;
    let held = u64::from(queue.messages().await?);
    if held != n {
        bail!("the queue holds {held} messages, not {n}");
    }
    Ok(sample)
}

/// W7R, raw: the same `n` payloads published with lapin from one task on one confirm-mode
/// channel, persistent and mandatory as the relay sends, `in_flight` awaiting their confirm at
/// once. One task publishing in turn keeps the channel's numbering right, which is what the
/// relay's concurrent calls cannot do on one channel.
pub(crate) async fn w7r_raw(
    db: &Db,
    queue: &BenchQueue,
    n: u64,
    in_flight: usize,
) -> Result<Sample> {
    queue.purge().await?;
    let payloads = payloads(n)?;
    let channel = queue.conn.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let meter = CpuMeter::start(db).await;
    let start = Instant::now();
    let mut pending = FuturesUnordered::new();
    for (i, payload) in payloads.iter().enumerate() {
        if pending.len() >= in_flight {
            if let Some(r) = pending.next().await {
                confirmed(r)?;
            }
        }
        let confirm = channel
            .basic_publish(
                queue.exchange.as_str().into(),
                TOPIC.into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                payload,
                BasicProperties::default()
                    .with_message_id(format!("raw-{i}").into())
                    .with_delivery_mode(2)
                    .with_content_type("application/json".into()),
            )
            .await?;
        pending.push(confirm);
    }
    while let Some(r) = pending.next().await {
        confirmed(r)?;
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = meter.stop(db).await;
    let _ = channel.close(200, "bench done".into()).await;
    Ok(Sample {
        rate: n as f64 / secs,
        cpu: cpu.per(n),
    })
}

fn confirmed(r: lapin::Result<Confirmation>) -> Result<()> {
    match r? {
        Confirmation::Ack(None) => Ok(()),
        other => bail!("RabbitMQ did not confirm a raw publish: {other:?}"),
    }
}
