//! A stand-in for Elasticsearch/OpenSearch, started by the demo when no `SEARCH_URL` is set.
//!
//! It keeps documents in memory and enforces external versioning the way the real thing does:
//! a write whose version is not above the stored one is refused with 409, so a late event can
//! never overwrite a newer document. It is not a search engine.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, put};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

type Docs = Arc<Mutex<HashMap<(String, String), (u64, Value)>>>;

#[derive(Deserialize)]
struct Versioned {
    version: u64,
}

/// Starts the stand-in on 127.0.0.1 and returns its address.
pub(crate) async fn start() -> std::io::Result<SocketAddr> {
    let docs: Docs = Arc::default();
    let app = Router::new()
        .route(
            "/{index}/_doc/{id}",
            put(put_doc).delete(delete_doc).get(get_doc),
        )
        .route("/{index}/_count", get(count))
        .with_state(docs);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(addr)
}

fn conflict(id: &str, held: u64) -> (StatusCode, Json<Value>) {
    let reason = format!(
        "[{id}]: version conflict, current version [{held}] is higher or equal to the one provided"
    );
    (
        StatusCode::CONFLICT,
        Json(json!({"error": {"type": "version_conflict_engine_exception", "reason": reason}})),
    )
}

async fn put_doc(
    State(docs): State<Docs>,
    Path((index, id)): Path<(String, String)>,
    Query(v): Query<Versioned>,
    Json(doc): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let mut docs = docs
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let key = (index, id.clone());
    match docs.get(&key) {
        Some((held, _)) if *held >= v.version => conflict(&id, *held),
        _ => {
            docs.insert(key, (v.version, doc));
            (
                StatusCode::CREATED,
                Json(json!({"result": "created", "_version": v.version})),
            )
        }
    }
}

async fn delete_doc(
    State(docs): State<Docs>,
    Path((index, id)): Path<(String, String)>,
    Query(v): Query<Versioned>,
) -> (StatusCode, Json<Value>) {
    let mut docs = docs
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let key = (index, id.clone());
    match docs.get(&key) {
        None => (StatusCode::NOT_FOUND, Json(json!({"result": "not_found"}))),
        Some((held, _)) if *held >= v.version => conflict(&id, *held),
        Some(_) => {
            docs.remove(&key);
            (StatusCode::OK, Json(json!({"result": "deleted"})))
        }
    }
}

async fn get_doc(
    State(docs): State<Docs>,
    Path((index, id)): Path<(String, String)>,
) -> (StatusCode, Json<Value>) {
    let docs = docs
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match docs.get(&(index, id.clone())) {
        Some((version, doc)) => (
            StatusCode::OK,
            Json(json!({"_id": id, "_version": version, "_source": doc})),
        ),
        None => (
            StatusCode::NOT_FOUND,
            Json(json!({"_id": id, "found": false})),
        ),
    }
}

async fn count(State(docs): State<Docs>, Path(index): Path<String>) -> Json<Value> {
    let docs = docs
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    Json(json!({"count": docs.keys().filter(|(i, _)| *i == index).count()}))
}
