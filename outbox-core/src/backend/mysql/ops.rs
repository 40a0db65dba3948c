//! STUB: to be written for MySQL (mirror of sqlite/ops.rs).
#![allow(unused)]

use std::time::Duration;
use uuid::Uuid;
use super::MySqlBackend;
use crate::error::Result;
use chrono::{DateTime, Utc};
use crate::model::*;
use crate::retention::*;
use crate::backend::*;

pub(super) async fn unknown_topics(
    b: &MySqlBackend,
    known: &[&str],
) -> Result<Vec<(String, i64)>> {
    unimplemented!()
}

pub(super) async fn stats(b: &MySqlBackend) -> Result<Vec<TopicStats>> {
    unimplemented!()
}

pub(super) async fn done_per_minute(
    b: &MySqlBackend,
    minutes: u32,
) -> Result<Vec<(DateTime<Utc>, i64)>> {
    unimplemented!()
}

pub(super) async fn dead_list(b: &MySqlBackend, f: &DeadLetterFilter) -> Result<Vec<MessageInfo>> {
    unimplemented!()
}

pub(super) async fn message(b: &MySqlBackend, id: Uuid) -> Result<Option<MessageInfo>> {
    unimplemented!()
}

pub(super) async fn dead_retry(b: &MySqlBackend, which: &DeadSelection) -> Result<u64> {
    unimplemented!()
}

pub(super) async fn dead_discard(b: &MySqlBackend, which: &DeadSelection) -> Result<u64> {
    unimplemented!()
}

pub(super) async fn purge_done(b: &MySqlBackend, older_than: Duration, batch: i64) -> Result<u64> {
    unimplemented!()
}

pub(super) async fn purge_processed(
    b: &MySqlBackend,
    older_than: Duration,
    batch: i64,
) -> Result<u64> {
    unimplemented!()
}
