//! W11: W1's drain where every stored message is version 1 and the handler takes version 3, so
//! each payload is decoded as version 1 and converted twice (`From` v1 -> v2 -> v3).

use std::sync::Arc;

use anyhow::Result;
use outbox::{outbox_event, Context, Handler, HandlerError, Worker, WorkerConfig};
use serde::{Deserialize, Serialize};

use crate::db::{Db, Pool};
use crate::workloads::{messages, timed_drain, BenchMessage, ProbeState, Sample};

/// Version 2 of W1's message: `customer` renamed.
#[outbox_event(topic = "bench.message", version = 2, previous = BenchMessage)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct BenchMessageV2 {
    seq: u64,
    order_id: String,
    customer_email: String,
    amount_cents: u64,
    currency: String,
    note: String,
}

/// Version 3: the amount and its currency as one field.
#[outbox_event(topic = "bench.message", version = 3, previous = BenchMessageV2)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct BenchMessageV3 {
    seq: u64,
    order_id: String,
    customer_email: String,
    amount: Amount,
    note: String,
}

/// An amount of money.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Amount {
    cents: u64,
    currency: String,
}

impl From<BenchMessage> for BenchMessageV2 {
    fn from(v1: BenchMessage) -> Self {
        Self {
            seq: v1.seq,
            order_id: v1.order_id,
            customer_email: v1.customer,
            amount_cents: v1.amount_cents,
            currency: v1.currency,
            note: v1.note,
        }
    }
}

impl From<BenchMessageV2> for BenchMessageV3 {
    fn from(v2: BenchMessageV2) -> Self {
        Self {
            seq: v2.seq,
            order_id: v2.order_id,
            customer_email: v2.customer_email,
            amount: Amount {
                cents: v2.amount_cents,
                currency: v2.currency,
            },
            note: v2.note,
        }
    }
}

/// W1's probe, taking version 3.
struct UpcastProbe(Arc<ProbeState>);

#[outbox::async_trait]
impl Handler for UpcastProbe {
    type Event = BenchMessageV3;
    const NAME: &'static str = "bench-probe";

    async fn handle(&self, event: BenchMessageV3, _ctx: &Context) -> Result<(), HandlerError> {
        self.0.record(event.seq);
        Ok(())
    }
}

fn worker(pool: &Pool, state: &Arc<ProbeState>, config: WorkerConfig) -> Result<Worker> {
    Ok(Worker::builder(pool.store())
        .handler(UpcastProbe(state.clone()))
        .config(config)
        .build()?)
}

/// W11: W1's `n` version 1 messages drained by a worker whose handler takes version 3.
pub(crate) async fn w11(db: &Db, n: u64, config: WorkerConfig) -> Result<Sample> {
    db.seed(&messages(n)).await?;
    timed_drain(db, n, config, ProbeState::new(n, 0), 0, worker).await
}
