//! STUB: to be written for MySQL (mirror of sqlite/log.rs).
#![allow(unused)]

use super::MySqlBackend;
use crate::backend::*;
use crate::error::Result;
use crate::model::*;
use crate::retention::*;
use chrono::{DateTime, Utc};
use std::time::Duration;
use uuid::Uuid;

pub(super) async fn declare(
    b: &MySqlBackend,
    windows: &[(&str, Duration)],
    _days_ahead: u32,
) -> Result<()> {
    unimplemented!()
}

pub(super) async fn set(
    b: &MySqlBackend,
    topic: &str,
    window: Option<Duration>,
    _days_ahead: u32,
) -> Result<bool> {
    unimplemented!()
}

pub(super) async fn upkeep(
    b: &MySqlBackend,
    _days_ahead: u32,
    at: Option<DateTime<Utc>>,
) -> Result<Option<LogUpkeep>> {
    unimplemented!()
}

pub(super) async fn topics(b: &MySqlBackend, sizes: bool) -> Result<Vec<RetainedTopic>> {
    unimplemented!()
}

pub(super) async fn events(b: &MySqlBackend, f: &EventFilter) -> Result<Vec<RetainedEvent>> {
    unimplemented!()
}
