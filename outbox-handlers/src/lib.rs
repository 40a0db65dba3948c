//! Ready-made handlers for `outbox-core`: email, search index and processed-id dedup.
//!
//! This crate is being built; it exports nothing yet.
