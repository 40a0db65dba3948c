//! STUB: to be written for MySQL (mirror of sqlite/workers.rs).
#![allow(unused)]

use std::time::Duration;
use uuid::Uuid;
use super::MySqlBackend;
use crate::error::Result;
use chrono::{DateTime, Utc};
use crate::model::*;
use crate::retention::*;
use crate::backend::*;

pub(super) async fn heartbeat(backend: &MySqlBackend, b: &Beat<'_>) -> Result<i64> {
    unimplemented!()
}

pub(super) async fn list(b: &MySqlBackend) -> Result<Vec<WorkerInfo>> {
    unimplemented!()
}

pub(super) async fn deregister(b: &MySqlBackend, id: Uuid) -> Result<()> {
    unimplemented!()
}
