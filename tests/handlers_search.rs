//! The search-index handler (`outbox_handlers::search`) against a small axum app on 127.0.0.1
//! that enforces Elasticsearch's external-version rules (it stores id -> (version, document);
//! a PUT or DELETE whose version is not above the stored one gets 409
//! `version_conflict_engine_exception`; a DELETE of a missing document gets 404 and leaves a
//! tombstone), driven by a real worker on PostgreSQL: events delivered out of order leave the
//! newest document, deletes, failure classification, `Retry-After`, authentication, and
//! configuration.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::put;
use axum::{Json, Router};
use outbox::{
    enqueue, enqueue_many, outbox_event, Context, Event, FailureKind, FromResources, Handler,
    Resources, RetryPolicy, Worker, WorkerConfig,
};
use outbox_handlers::search::{
    message_version, Applied, IndexOp, SearchClient, SearchConfig, SearchHandler, SearchMapping,
};
use outbox_tests::{pg, TestDb};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use uuid::Uuid;

// ---------------------------------------------------------------------------------------------
// The index: external versions, as Elasticsearch enforces them.

/// A stored document: its version, and `None` once deleted (a tombstone keeps the version).
type Stored = (u64, Option<Value>);

#[derive(Default)]
struct IndexState {
    docs: Mutex<HashMap<(String, String), Stored>>,
    /// Answers to give before the normal ones: (status, Retry-After, body).
    fail_next: Mutex<VecDeque<(u16, Option<&'static str>, String)>>,
    /// (method, path and query, Authorization header) of every request.
    log: Mutex<Vec<(String, String, Option<String>)>>,
}

#[derive(Deserialize)]
struct VersionQuery {
    version: u64,
    version_type: String,
}

fn conflict(id: &str, current: u64, given: u64) -> Response {
    (
        StatusCode::CONFLICT,
        Json(json!({
            "error": {
                "type": "version_conflict_engine_exception",
                "reason": format!("[{id}]: version conflict, current version [{current}] is higher or equal to the one provided [{given}]"),
            },
            "status": 409,
        })),
    )
        .into_response()
}

/// Records the request; answers with a queued failure if there is one.
fn prelude(s: &IndexState, method: &str, uri: String, headers: &HeaderMap) -> Option<Response> {
    let auth = headers
        .get("authorization")
        .map(|v| v.to_str().unwrap().to_string());
    s.log.lock().unwrap().push((method.to_string(), uri, auth));
    let (status, retry_after, body) = s.fail_next.lock().unwrap().pop_front()?;
    let mut r = (StatusCode::from_u16(status).unwrap(), body).into_response();
    if let Some(secs) = retry_after {
        r.headers_mut().insert("retry-after", secs.parse().unwrap());
    }
    Some(r)
}

async fn put_doc(
    State(s): State<Arc<IndexState>>,
    Path((index, id)): Path<(String, String)>,
    Query(q): Query<VersionQuery>,
    headers: HeaderMap,
    Json(doc): Json<Value>,
) -> Response {
    let uri = format!(
        "/{index}/_doc/{id}?version={}&version_type={}",
        q.version, q.version_type
    );
    if let Some(r) = prelude(&s, "PUT", uri, &headers) {
        return r;
    }
    if q.version_type != "external" {
        return (StatusCode::BAD_REQUEST, "version_type must be external").into_response();
    }
    let mut docs = s.docs.lock().unwrap();
    let key = (index, id.clone());
    match docs.get(&key) {
        Some((current, _)) if q.version <= *current => conflict(&id, *current, q.version),
        existing => {
            let created = !matches!(existing, Some((_, Some(_))));
            docs.insert(key, (q.version, Some(doc)));
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            let result = if created { "created" } else { "updated" };
            (
                status,
                Json(json!({"_id": id, "_version": q.version, "result": result})),
            )
                .into_response()
        }
    }
}

async fn delete_doc(
    State(s): State<Arc<IndexState>>,
    Path((index, id)): Path<(String, String)>,
    Query(q): Query<VersionQuery>,
    headers: HeaderMap,
) -> Response {
    let uri = format!(
        "/{index}/_doc/{id}?version={}&version_type={}",
        q.version, q.version_type
    );
    if let Some(r) = prelude(&s, "DELETE", uri, &headers) {
        return r;
    }
    let mut docs = s.docs.lock().unwrap();
    let key = (index, id.clone());
    match docs.get(&key).cloned() {
        Some((current, _)) if q.version <= current => conflict(&id, current, q.version),
        Some((_, Some(_))) => {
            docs.insert(key, (q.version, None));
            (
                StatusCode::OK,
                Json(json!({"_id": id, "result": "deleted"})),
            )
                .into_response()
        }
        _ => {
            docs.insert(key, (q.version, None));
            (
                StatusCode::NOT_FOUND,
                Json(json!({"_id": id, "result": "not_found"})),
            )
                .into_response()
        }
    }
}

struct App {
    url: String,
    state: Arc<IndexState>,
}

impl App {
    fn doc(&self, index: &str, id: &str) -> Option<Stored> {
        self.state
            .docs
            .lock()
            .unwrap()
            .get(&(index.to_string(), id.to_string()))
            .cloned()
    }

    fn fail_next(&self, status: u16, retry_after: Option<&'static str>, body: &str) {
        self.state
            .fail_next
            .lock()
            .unwrap()
            .push_back((status, retry_after, body.to_string()));
    }

    fn log(&self) -> Vec<(String, String, Option<String>)> {
        self.state.log.lock().unwrap().clone()
    }
}

async fn start_index() -> App {
    let state = Arc::new(IndexState::default());
    let app = Router::new()
        .route("/{index}/_doc/{id}", put(put_doc).delete(delete_doc))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    App { url, state }
}

// ---------------------------------------------------------------------------------------------
// Events and handlers.

#[outbox_event(topic = "test.hotel")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct HotelChanged {
    hotel_id: i64,
    name: String,
    /// A version from the source row; the message id's timestamp when absent.
    #[serde(default)]
    version: Option<u64>,
    #[serde(default)]
    deleted: bool,
}

fn hotel(id: i64, name: &str, version: Option<u64>) -> HotelChanged {
    HotelChanged {
        hotel_id: id,
        name: name.into(),
        version,
        deleted: false,
    }
}

fn op(e: &HotelChanged, ctx: &Context) -> IndexOp {
    let id = e.hotel_id.to_string();
    let version = e.version.unwrap_or_else(|| message_version(ctx));
    if e.deleted {
        IndexOp::Delete { id, version }
    } else {
        IndexOp::Upsert {
            id,
            version,
            document: json!({ "name": e.name }),
        }
    }
}

fn client(app: &App) -> SearchClient {
    SearchClient::builder()
        .base_url(&app.url)
        .index("hotels")
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

fn config() -> WorkerConfig {
    WorkerConfig::default()
        .retry(
            RetryPolicy::default()
                .jitter(false)
                .base(Duration::from_millis(100)),
        )
        .handler_timeout(Duration::from_secs(5))
        .lease(Duration::from_secs(10))
}

fn worker(db: &TestDb, app: &App) -> Worker {
    Worker::builder(&db.pool)
        .handler(SearchHandler::from_fn(client(app), op).unwrap())
        .config(config())
        .build()
        .unwrap()
}

async fn put_event(db: &TestDb, e: &HotelChanged) -> Uuid {
    let mut tx = db.pool.begin().await.unwrap();
    let id = enqueue(&mut *tx, e).await.unwrap();
    tx.commit().await.unwrap();
    id
}

/// Makes only `id` due now, and every other pending message wait.
async fn deliver_next(db: &TestDb, id: Uuid) {
    sqlx::query(
        "UPDATE outbox_messages SET available_at = CASE WHEN id = $1 THEN now() \
         ELSE now() + interval '1 hour' END WHERE locked_until IS NULL",
    )
    .bind(id)
    .execute(&db.pool)
    .await
    .unwrap();
}

/// A fresh database that keeps the last row of each done message (see `row`).
async fn db() -> TestDb {
    let db = pg().await;
    db.archive_done().await;
    db
}

/// (status, attempts, last_error); a done message's as it was deleted.
async fn row(db: &TestDb, id: Uuid) -> (String, i32, Option<String>) {
    db.status_archived(id).await
}

fn name_of(stored: Option<Stored>) -> Option<String> {
    stored
        .and_then(|(_, d)| d)
        .map(|d| d["name"].as_str().unwrap().to_string())
}

// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn an_older_event_arriving_late_never_overwrites_a_newer_document() {
    let db = db().await;
    let app = start_index().await;
    let w = worker(&db, &app);
    let old = put_event(&db, &hotel(1, "Old name", None)).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let new = put_event(&db, &hotel(1, "New name", None)).await;

    // The newer event first, the older one late.
    deliver_next(&db, new).await;
    assert_eq!(w.run_once().await.unwrap().done, 1);
    deliver_next(&db, old).await;
    assert_eq!(
        w.run_once().await.unwrap().done,
        1,
        "the stale event counts as handled"
    );

    assert_eq!(name_of(app.doc("hotels", "1")), Some("New name".into()));
    for id in [old, new] {
        assert_eq!(
            row(&db, id).await,
            ("done".to_string(), 1, None),
            "no retry, no error"
        );
    }
    let log = app.log();
    assert_eq!(log.len(), 2);
    assert!(log.iter().all(|(m, _, _)| m == "PUT"));
    assert!(
        log[0].1.ends_with("version_type=external") && log[1].1.contains("?version="),
        "{log:?}"
    );
    let v_new: u64 = log[0]
        .1
        .split("version=")
        .nth(1)
        .unwrap()
        .split('&')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let v_old: u64 = log[1]
        .1
        .split("version=")
        .nth(1)
        .unwrap()
        .split('&')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        v_old < v_new,
        "versions from the message ids: {v_old} < {v_new}"
    );
    assert_eq!(app.doc("hotels", "1").unwrap().0, v_new);
    db.drop_db().await;
}

#[tokio::test]
async fn two_changes_in_the_same_millisecond_keep_the_newer() {
    let db = pg().await;
    let app = start_index().await;
    let w = worker(&db, &app);
    // Two changes of one hotel enqueued in the same millisecond (retried until they are).
    let ids = loop {
        let mut tx = db.pool.begin().await.unwrap();
        let ids = enqueue_many(
            &mut *tx,
            &[hotel(3, "Older name", None), hotel(3, "Newer name", None)],
        )
        .await
        .unwrap();
        if ids[0].as_bytes()[..6] == ids[1].as_bytes()[..6] {
            tx.commit().await.unwrap();
            break ids;
        }
        tx.rollback().await.unwrap();
    };

    // Delivered in the order they were made.
    for id in &ids {
        deliver_next(&db, *id).await;
        assert_eq!(w.run_once().await.unwrap().done, 1);
    }
    assert_eq!(
        name_of(app.doc("hotels", "3")),
        Some("Newer name".into()),
        "the newer change must not be dropped as stale: {:?}",
        app.log()
    );
    let puts: Vec<String> = app.log().into_iter().map(|(_, uri, _)| uri).collect();
    assert_eq!(puts.len(), 2, "{puts:?}");
    db.drop_db().await;
}

#[tokio::test]
async fn versions_from_the_event_order_changes_whatever_the_delivery_order() {
    let db = db().await;
    let app = start_index().await;
    let w = worker(&db, &app);
    let mut ids = Vec::new();
    for v in 1..=4u64 {
        ids.push(put_event(&db, &hotel(7, &format!("v{v}"), Some(v))).await);
    }
    for i in [2usize, 0, 3, 1] {
        deliver_next(&db, ids[i]).await;
        assert_eq!(w.run_once().await.unwrap().done, 1);
    }
    let (version, doc) = app.doc("hotels", "7").unwrap();
    assert_eq!(version, 4);
    assert_eq!(doc.unwrap()["name"], "v4");
    // Written: v3, then v4; refused as stale: v1, v2.
    let statuses: Vec<String> = app.log().into_iter().map(|(_, uri, _)| uri).collect();
    assert_eq!(statuses.len(), 4, "{statuses:?}");
    db.drop_db().await;
}

#[tokio::test]
async fn deletes_remove_the_document_and_a_missing_one_is_fine() {
    let db = db().await;
    let app = start_index().await;
    let w = worker(&db, &app);
    let created = put_event(&db, &hotel(3, "Seaside", Some(10))).await;
    deliver_next(&db, created).await;
    w.run_once().await.unwrap();
    assert_eq!(name_of(app.doc("hotels", "3")), Some("Seaside".into()));

    let gone = put_event(
        &db,
        &HotelChanged {
            deleted: true,
            ..hotel(3, "Seaside", Some(11))
        },
    )
    .await;
    deliver_next(&db, gone).await;
    assert_eq!(w.run_once().await.unwrap().done, 1);
    assert_eq!(
        app.doc("hotels", "3"),
        Some((11, None)),
        "deleted, tombstone at 11"
    );

    // A stale upsert after the delete does not bring it back.
    let stale = put_event(&db, &hotel(3, "Seaside", Some(10))).await;
    deliver_next(&db, stale).await;
    assert_eq!(w.run_once().await.unwrap().done, 1);
    assert_eq!(app.doc("hotels", "3"), Some((11, None)));

    // Deleting a document that was never there: 404, which is a success.
    let missing = put_event(
        &db,
        &HotelChanged {
            deleted: true,
            ..hotel(99, "", Some(1))
        },
    )
    .await;
    deliver_next(&db, missing).await;
    assert_eq!(w.run_once().await.unwrap().done, 1);
    assert_eq!(row(&db, missing).await, ("done".to_string(), 1, None));
    let methods: Vec<String> = app.log().into_iter().map(|(m, _, _)| m).collect();
    assert_eq!(methods, ["PUT", "DELETE", "PUT", "DELETE"]);

    // The client says what happened.
    let c = client(&app);
    let del = IndexOp::Delete {
        id: "100".into(),
        version: 1,
    };
    assert_eq!(c.apply("hotels", &del).await.unwrap(), Applied::Missing);
    let up = IndexOp::Upsert {
        id: "100".into(),
        version: 1,
        document: json!({}),
    };
    assert_eq!(c.apply("hotels", &up).await.unwrap(), Applied::Stale);
    let up = IndexOp::Upsert {
        id: "100".into(),
        version: 2,
        document: json!({}),
    };
    assert_eq!(c.apply("hotels", &up).await.unwrap(), Applied::Written);
    db.drop_db().await;
}

#[tokio::test]
async fn failures_are_classified_and_retry_after_is_honoured() {
    let db = db().await;
    let app = start_index().await;
    let w = worker(&db, &app);
    let c = client(&app);
    let up = |v: u64| IndexOp::Upsert {
        id: "5".into(),
        version: v,
        document: json!({"name": "x"}),
    };

    for status in [408u16, 429, 500, 503] {
        app.fail_next(status, None, "busy");
        let e = c.apply("hotels", &up(1)).await.unwrap_err();
        assert_eq!(e.kind(), FailureKind::Retry, "{status}");
        assert!(
            e.to_string()
                .contains(&format!("search index answered {status}")),
            "{e}"
        );
    }
    for status in [400u16, 401, 403, 422] {
        app.fail_next(
            status,
            None,
            r#"{"error":{"type":"mapper_parsing_exception"}}"#,
        );
        let e = c.apply("hotels", &up(1)).await.unwrap_err();
        assert_eq!(e.kind(), FailureKind::Permanent, "{status}");
        assert!(e.to_string().contains("mapper_parsing_exception"), "{e}");
    }
    // A 404 on an upsert (no such index, say) is not a success.
    app.fail_next(404, None, "index_not_found_exception");
    assert_eq!(
        c.apply("hotels", &up(1)).await.unwrap_err().kind(),
        FailureKind::Permanent
    );
    // A closed port.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let closed = SearchClient::builder()
        .base_url(format!("http://127.0.0.1:{port}"))
        .build()
        .unwrap();
    assert_eq!(
        closed.apply("hotels", &up(1)).await.unwrap_err().kind(),
        FailureKind::Retry
    );

    // Through the worker: Retry-After sets the next attempt, then it goes through.
    let id = put_event(&db, &hotel(5, "Harbour", Some(3))).await;
    app.fail_next(429, Some("90"), "too many requests");
    assert_eq!(w.run_once().await.unwrap().retried, 1);
    let delay = db.delay_secs(id).await;
    assert!(
        (delay - 90.0).abs() < 3.0,
        "available_at is now + {delay}s, expected 90s"
    );
    deliver_next(&db, id).await;
    assert_eq!(w.run_once().await.unwrap().done, 1);
    assert_eq!(row(&db, id).await.1, 2);

    // A rejected document is dead-lettered with the index's message.
    let bad = put_event(&db, &hotel(6, "Bad", Some(1))).await;
    app.fail_next(400, None, "failed to parse field [name]");
    assert_eq!(w.run_once().await.unwrap().dead, 1);
    let (status, _, err) = row(&db, bad).await;
    assert_eq!(status, "dead");
    assert!(err
        .unwrap()
        .contains("400 Bad Request: failed to parse field [name]"));
    db.drop_db().await;
}

#[tokio::test]
async fn credentials_are_sent_and_never_leak() {
    let app = start_index().await;
    let up = IndexOp::Upsert {
        id: "1".into(),
        version: 1,
        document: json!({}),
    };

    let basic = SearchClient::builder()
        .base_url(&app.url)
        .basic_auth("indexer", "s3cret-pw")
        .build()
        .unwrap();
    basic.apply("hotels", &up).await.unwrap();
    let key = SearchClient::builder()
        .base_url(&app.url)
        .api_key("ak-123456")
        .build()
        .unwrap();
    app.fail_next(401, None, "bad credentials ak-123456");
    let e = key.apply("hotels", &up).await.unwrap_err();
    assert_eq!(e.kind(), FailureKind::Permanent);
    assert!(e.to_string().contains("bad credentials [redacted]"), "{e}");
    app.fail_next(500, None, "login s3cret-pw failed");
    let e = basic.apply("hotels", &up).await.unwrap_err();
    assert!(!e.to_string().contains("s3cret-pw"), "{e}");

    let auth: Vec<Option<String>> = app.log().into_iter().map(|(_, _, a)| a).collect();
    assert_eq!(
        auth,
        [
            Some("Basic aW5kZXhlcjpzM2NyZXQtcHc=".to_string()),
            Some("ApiKey ak-123456".to_string()),
            Some("Basic aW5kZXhlcjpzM2NyZXQtcHc=".to_string()),
        ]
    );
    for dbg in [format!("{basic:?}"), format!("{key:?}")] {
        assert!(
            !dbg.contains("s3cret") && !dbg.contains("ak-123456"),
            "{dbg}"
        );
    }
}

/// A mapping with its own name and index, built from the worker's resources.
#[derive(Default)]
struct HotelsByName;

impl SearchMapping for HotelsByName {
    type Event = HotelChanged;
    const NAME: &'static str = "hotels-by-name";
    fn index_op(&self, e: &HotelChanged, ctx: &Context) -> Result<IndexOp, outbox::HandlerError> {
        Ok(op(e, ctx))
    }
    fn index(&self) -> Option<&str> {
        Some("hotels-by-name")
    }
}

#[tokio::test]
async fn configuration_builds_working_handlers() {
    let app = start_index().await;
    let vars = [
        ("APP_SEARCH_BASE_URL", app.url.clone()),
        ("APP_SEARCH_API_KEY", "ak-env".to_string()),
        ("APP_SEARCH_TIMEOUT", "1500ms".to_string()),
    ];
    let config = SearchConfig::from_lookup("APP_SEARCH_", |name| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
    })
    .unwrap();
    // No default index: the mapping names its own.
    let h = SearchHandler::<HotelsByName>::from_resources(&Resources::new().with(config.clone()))
        .unwrap();
    assert_eq!(h.index(), "hotels-by-name");
    assert_eq!(
        <SearchHandler<HotelsByName> as Handler>::NAME,
        "hotels-by-name"
    );
    let ctx = Context::for_test(HotelChanged::TOPIC, "hotels-by-name", Resources::new());
    h.handle(hotel(8, "Inn", Some(1)), &ctx).await.unwrap();
    assert_eq!(name_of(app.doc("hotels-by-name", "8")), Some("Inn".into()));
    assert_eq!(app.log()[0].2.as_deref(), Some("ApiKey ak-env"));

    // A closure handler needs an index from somewhere.
    let e = SearchHandler::from_fn(config.client().unwrap(), op).unwrap_err();
    assert_eq!(e.key(), Some("search.index"));
    let e = SearchConfig::from_toml_str(&format!(
        "[search]\nbase_url = '{}'\nindex = 'Bad Name'",
        app.url
    ))
    .unwrap()
    .client()
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "search.index: use lowercase (got `Bad Name`)"
    );
    let e = SearchHandler::<HotelsByName>::from_resources(&Resources::new()).unwrap_err();
    assert!(e.to_string().contains("SearchConfig"), "{e}");
}
