//! STUB: to be written for MySQL (mirror of sqlite/replay.rs).
#![allow(unused)]

use super::MySqlBackend;
use crate::backend::*;
use crate::error::Result;
use crate::model::*;
use crate::retention::*;
use chrono::{DateTime, Utc};
use std::time::Duration;
use uuid::Uuid;

pub(super) async fn plan(
    b: &MySqlBackend,
    r: &ReplayRequest,
    until: DateTime<Utc>,
) -> Result<ReplayPlan> {
    unimplemented!()
}

pub(super) async fn create(
    b: &MySqlBackend,
    id: Uuid,
    r: &ReplayRequest,
    until: DateTime<Utc>,
    total: i64,
    backfill: bool,
) -> Result<bool> {
    unimplemented!()
}

pub(super) async fn list(b: &MySqlBackend) -> Result<Vec<ReplayInfo>> {
    unimplemented!()
}

pub(super) async fn get(b: &MySqlBackend, id: Uuid) -> Result<Option<ReplayInfo>> {
    unimplemented!()
}

pub(super) async fn failures(b: &MySqlBackend, id: Uuid) -> Result<Vec<ReplayFailure>> {
    unimplemented!()
}

pub(super) async fn set_state(b: &MySqlBackend, id: Uuid, to: ReplayState) -> Result<bool> {
    unimplemented!()
}

pub(super) async fn lease(
    b: &MySqlBackend,
    worker: Uuid,
    token: Uuid,
    handlers: &[(&str, &str)],
    lease: Duration,
) -> Result<Option<ReplayInfo>> {
    unimplemented!()
}

pub(super) async fn advance(
    b: &MySqlBackend,
    id: Uuid,
    token: Uuid,
    step: &ReplayStep,
) -> Result<Option<ReplayState>> {
    unimplemented!()
}

pub(super) async fn seen(
    b: &MySqlBackend,
    handlers: &[(&str, &str)],
) -> Result<Vec<(String, String)>> {
    unimplemented!()
}

pub(super) async fn known(b: &MySqlBackend, topic: &str, handler: &str) -> Result<bool> {
    unimplemented!()
}
