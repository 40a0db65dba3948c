//! The email handler (`outbox_handlers::email`) against a real HTTP server on 127.0.0.1
//! (wiremock) and a real worker on PostgreSQL: the headers and body as sent, one idempotency key
//! across real retries, how every class of answer is classified (2xx, 409, 408, 429, 5xx, other
//! 4xx, a server slower than the timeout, a closed port), `Retry-After`, an API key that shows up
//! in no log line and no `last_error`, configuration, and the file transport leaving one file per
//! email however often it is delivered.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::{
    enqueue, enqueue_with, outbox_event, Context, EnqueueOptions, Event, FailureKind,
    FromResources, Handler, HandlerError, Resources, RetryPolicy, Worker, WorkerConfig,
};
use outbox_handlers::email::{
    Email, EmailConfig, EmailHandler, EmailMapping, EmailTransport, FileTransport, HttpTransport,
};
use outbox_tests::{pg, TestDb};
use serde::{Deserialize, Serialize};
use serde_json::json;
use uuid::Uuid;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

const KEY: &str = "sk_test_9f8e7d6c5b4a";

#[outbox_event(topic = "test.welcome")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Welcome {
    to: String,
    name: String,
}

fn welcome() -> Welcome {
    Welcome {
        to: "guest@example.com".into(),
        name: "Ada".into(),
    }
}

fn mail(e: &Welcome, _ctx: &Context) -> Email {
    Email::new(
        &e.to,
        format!("Welcome, {}", e.name),
        format!("Hello {}!", e.name),
    )
    .html(format!("<p>Hello <b>{}</b>!</p>", e.name))
}

fn transport(server: &MockServer) -> HttpTransport {
    HttpTransport::builder()
        .base_url(server.uri())
        .api_key(KEY)
        .from("Stayhub <bookings@stayhub.example>")
        .timeout(Duration::from_millis(500))
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

fn worker(db: &TestDb, server: &MockServer) -> Worker {
    Worker::builder(&db.pool)
        .handler(EmailHandler::from_fn(transport(server), mail))
        .config(config())
        .build()
        .unwrap()
}

async fn put(db: &TestDb, e: &Welcome) -> Uuid {
    let mut tx = db.pool.begin().await.unwrap();
    let id = enqueue(&mut *tx, e).await.unwrap();
    tx.commit().await.unwrap();
    id
}

/// A fresh database that keeps the last row of each done message (see `row`).
async fn db() -> TestDb {
    let db = pg().await;
    db.archive_done().await;
    db
}

async fn make_due(db: &TestDb) {
    db.make_due().await;
}

/// (status, attempts, last_error); a done message's as it was deleted.
async fn row(db: &TestDb, id: Uuid) -> (String, i32, Option<String>) {
    db.status_archived(id).await
}

async fn requests(server: &MockServer) -> Vec<Request> {
    server
        .received_requests()
        .await
        .expect("request recording is on")
}

fn header(r: &Request, name: &str) -> String {
    r.headers
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header"))
        .to_str()
        .unwrap()
        .to_string()
}

async fn mount(server: &MockServer, p: &str, response: ResponseTemplate) {
    Mock::given(method("POST"))
        .and(path(p))
        .respond_with(response)
        .mount(server)
        .await;
}

#[tokio::test]
async fn headers_and_body_are_as_sent() {
    let db = db().await;
    let server = MockServer::start().await;
    mount(
        &server,
        "/emails",
        ResponseTemplate::new(200).set_body_json(json!({"id": "em_1"})),
    )
    .await;
    let id = put(&db, &welcome()).await;
    assert_eq!(worker(&db, &server).run_once().await.unwrap().done, 1);

    let reqs = requests(&server).await;
    assert_eq!(reqs.len(), 1);
    let r = &reqs[0];
    assert_eq!(r.method.as_str(), "POST");
    assert_eq!(r.url.path(), "/emails");
    assert_eq!(header(r, "authorization"), format!("Bearer {KEY}"));
    assert_eq!(header(r, "idempotency-key"), format!("{id}:email"));
    assert_eq!(header(r, "content-type"), "application/json");
    assert!(header(r, "user-agent").starts_with("outbox-handlers/"));
    let body: serde_json::Value = r.body_json().unwrap();
    assert_eq!(
        body,
        json!({
            "from": "Stayhub <bookings@stayhub.example>",
            "to": ["guest@example.com"],
            "subject": "Welcome, Ada",
            "text": "Hello Ada!",
            "html": "<p>Hello <b>Ada</b>!</p>",
        })
    );
    assert_eq!(row(&db, id).await.0, "done");
    db.drop_db().await;
}

#[tokio::test]
async fn the_idempotency_key_is_identical_across_real_retries() {
    let db = db().await;
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(503))
        .up_to_n_times(2)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(202))
        .with_priority(2)
        .mount(&server)
        .await;
    let w = worker(&db, &server);
    let derived = put(&db, &welcome()).await;
    let mut tx = db.pool.begin().await.unwrap();
    let keyed = enqueue_with(
        &mut *tx,
        &welcome(),
        &EnqueueOptions::default().idempotency_key("welcome-guest-42"),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();

    let r = w.run_once().await.unwrap();
    assert_eq!((r.claimed, r.retried), (2, 2), "both hit the two 503s");
    make_due(&db).await;
    let r = w.run_once().await.unwrap();
    assert_eq!((r.claimed, r.done), (2, 2));
    assert_eq!(row(&db, derived).await.0, "done");
    assert_eq!(row(&db, derived).await.1, 2);
    assert_eq!(row(&db, keyed).await.1, 2);

    let reqs = requests(&server).await;
    assert_eq!(reqs.len(), 4);
    let mut keys: Vec<String> = reqs.iter().map(|r| header(r, "idempotency-key")).collect();
    keys.sort();
    let mut expected = vec![
        format!("{derived}:email"),
        format!("{derived}:email"),
        "welcome-guest-42".to_string(),
        "welcome-guest-42".to_string(),
    ];
    expected.sort();
    assert_eq!(
        keys, expected,
        "one key per message, the same on every attempt"
    );
    db.drop_db().await;
}

/// The outcome of one send through `transport` to a server answering `status` (with `body`).
async fn send_to(server: &MockServer, status: u16, body: &str) -> Result<(), HandlerError> {
    let p = format!("/s/{status}/{}", Uuid::now_v7().simple());
    mount(
        server,
        &p,
        ResponseTemplate::new(status).set_body_string(body),
    )
    .await;
    let t = HttpTransport::builder()
        .base_url(server.uri())
        .path(&p)
        .api_key(KEY)
        .from("a@b.example")
        .build()
        .unwrap();
    t.send(&Email::new("guest@example.com", "s", "t"), "key-1")
        .await
}

#[tokio::test]
async fn every_status_class_is_classified() {
    let server = MockServer::start().await;
    for status in [200, 201, 202, 204] {
        assert!(send_to(&server, status, "").await.is_ok(), "{status}");
    }
    assert!(
        send_to(&server, 409, r#"{"name":"idempotency_key_used"}"#)
            .await
            .is_ok(),
        "409: the key was already used, so the email was sent"
    );
    for status in [408, 429, 500, 502, 503, 504] {
        let e = send_to(&server, status, "try later").await.unwrap_err();
        assert_eq!(e.kind(), FailureKind::Retry, "{status}");
        assert!(
            e.to_string()
                .contains(&format!("email provider answered {status}")),
            "{e}"
        );
    }
    for status in [400, 401, 403, 404, 422] {
        let e = send_to(&server, status, r#"{"message":"recipient is not valid"}"#)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), FailureKind::Permanent, "{status}");
        assert!(
            e.to_string().contains("recipient is not valid"),
            "{status}: {e}"
        );
    }
    // The provider's message is kept, bounded.
    let e = send_to(&server, 422, &"x".repeat(100_000))
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(text.len() < 1200, "{}", text.len());
    assert!(text.ends_with("[truncated]"), "{text}");
    // Empty bodies say so.
    let e = send_to(&server, 400, "").await.unwrap_err();
    assert!(e.to_string().ends_with("(empty body)"), "{e}");
}

#[tokio::test]
async fn a_server_slower_than_the_timeout_and_a_closed_port_are_retried() {
    let server = MockServer::start().await;
    mount(
        &server,
        "/emails",
        ResponseTemplate::new(200).set_delay(Duration::from_secs(5)),
    )
    .await;
    let t = HttpTransport::builder()
        .base_url(server.uri())
        .api_key(KEY)
        .from("a@b.example")
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let start = std::time::Instant::now();
    let e = t
        .send(&Email::new("g@example.com", "s", "t"), "k")
        .await
        .unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(e.kind(), FailureKind::Retry);
    assert!(e.to_string().contains("did not answer within 300ms"), "{e}");

    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    }; // closed again: connections are refused
    let t = HttpTransport::builder()
        .base_url(format!("http://127.0.0.1:{port}"))
        .api_key(KEY)
        .from("a@b.example")
        .build()
        .unwrap();
    let e = t
        .send(&Email::new("g@example.com", "s", "t"), "k")
        .await
        .unwrap_err();
    assert_eq!(e.kind(), FailureKind::Retry);
    let text = e.to_string();
    assert!(text.contains("email provider request failed"), "{text}");
    assert!(!text.contains(KEY), "{text}");
}

#[tokio::test]
async fn retry_after_sets_the_next_attempt() {
    let db = db().await;
    let server = MockServer::start().await;
    mount(
        &server,
        "/emails",
        ResponseTemplate::new(429).insert_header("Retry-After", "120"),
    )
    .await;
    let id = put(&db, &welcome()).await;
    let r = worker(&db, &server).run_once().await.unwrap();
    assert_eq!(r.retried, 1);
    let status = row(&db, id).await.0;
    let delay = db.delay_secs(id).await;
    assert_eq!(status, "pending");
    assert!(
        (delay - 120.0).abs() < 3.0,
        "available_at is now + {delay}s, expected 120s"
    );

    // Without Retry-After, the worker's backoff (100 ms here) applies.
    server.reset().await;
    mount(&server, "/emails", ResponseTemplate::new(503)).await;
    make_due(&db).await;
    worker(&db, &server).run_once().await.unwrap();
    let delay = db.delay_secs(id).await;
    assert!(
        delay < 2.0,
        "backoff after attempt 2 is 200 ms, got {delay}s"
    );
    db.drop_db().await;
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Capture {
    type Writer = Capture;
    fn make_writer(&'a self) -> Capture {
        self.clone()
    }
}

// A current-thread runtime: the worker's tasks run on this thread, under this subscriber.
#[tokio::test(flavor = "current_thread")]
async fn the_api_key_is_in_no_log_line_and_no_last_error() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("trace"))
        .with_writer(capture.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let db = db().await;
    let server = MockServer::start().await;
    // A provider that echoes the key back in its error bodies.
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(500).set_body_string(format!("backend rejected key {KEY}")),
        )
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(401)
                .set_body_json(json!({"message": format!("API key {KEY} is not valid")})),
        )
        .with_priority(2)
        .mount(&server)
        .await;
    let w = worker(&db, &server);
    let id = put(&db, &welcome()).await;
    assert_eq!(w.run_once().await.unwrap().retried, 1);
    let (_, _, err) = row(&db, id).await;
    let err = err.unwrap();
    assert!(err.contains("backend rejected key [redacted]"), "{err}");
    make_due(&db).await;
    assert_eq!(w.run_once().await.unwrap().dead, 1);
    let (status, _, err) = row(&db, id).await;
    let err = err.unwrap();
    assert_eq!(status, "dead");
    assert!(err.contains("401 Unauthorized"), "{err}");
    assert!(err.contains("API key [redacted] is not valid"), "{err}");

    // And a timeout and a refused connection, whose client errors carry the URL.
    let slow = MockServer::start().await;
    mount(
        &slow,
        "/emails",
        ResponseTemplate::new(200).set_delay(Duration::from_secs(3)),
    )
    .await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for base in [slow.uri(), format!("http://127.0.0.1:{port}")] {
        let t = HttpTransport::builder()
            .base_url(base)
            .api_key(KEY)
            .from("a@b.example")
            .timeout(Duration::from_millis(200))
            .build()
            .unwrap();
        tracing::info!(transport = ?t, "built a transport");
        let e = t
            .send(&Email::new("g@example.com", "s", "t"), "k")
            .await
            .unwrap_err();
        tracing::warn!(error = %e, debug = ?e, "send failed");
        assert!(!format!("{e} {e:?}").contains(KEY));
    }

    let dead: Vec<Option<String>> = sqlx::query_scalar(
        "SELECT last_error FROM outbox_messages UNION ALL SELECT last_error FROM outbox_dead",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(dead.iter().flatten().all(|e| !e.contains(KEY)));
    drop(_guard);
    let logs = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
    assert!(
        logs.contains("handler failed"),
        "the worker's failures were captured:\n{logs}"
    );
    assert!(logs.contains("built a transport"), "{logs}");
    let leaks: Vec<&str> = logs.lines().filter(|l| l.contains(KEY)).collect();
    assert!(leaks.is_empty(), "the API key leaked into logs: {leaks:#?}");
    db.drop_db().await;
}

#[tokio::test]
async fn the_file_transport_leaves_one_file_per_email_however_often_delivered() {
    let db = db().await;
    let dir = std::env::temp_dir().join(format!("outbox-mail-{}", Uuid::now_v7().simple()));
    let files = FileTransport::new(&dir)
        .unwrap()
        .from("demo@stayhub.example");
    let w = Worker::builder(&db.pool)
        .handler(EmailHandler::from_fn(files.clone(), mail))
        .config(config())
        .build()
        .unwrap();
    let id = put(&db, &welcome()).await;
    assert_eq!(w.run_once().await.unwrap().done, 1);
    // The outcome is lost: the message is delivered again.
    db.undo_done(id).await;
    assert_eq!(w.run_once().await.unwrap().done, 1);
    assert_eq!(row(&db, id).await.1, 2, "delivered twice");

    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(
        names.len(),
        1,
        "one file, no temporary leftovers: {names:?}"
    );
    let key = format!("{id}:email");
    assert_eq!(files.path_for(&key), dir.join(&names[0]));
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(&names[0])).unwrap()).unwrap();
    assert_eq!(written["idempotency_key"], key.as_str());
    assert_eq!(written["from"], "demo@stayhub.example");
    assert_eq!(written["to"], json!(["guest@example.com"]));
    assert_eq!(written["subject"], "Welcome, Ada");
    assert_eq!(written["html"], "<p>Hello <b>Ada</b>!</p>");
    std::fs::remove_dir_all(&dir).unwrap();
    db.drop_db().await;
}

/// A mapping with its own name, built from the worker's resources.
#[derive(Default)]
struct WelcomeMail;

impl EmailMapping for WelcomeMail {
    type Event = Welcome;
    const NAME: &'static str = "welcome-mail";
    fn email(&self, e: &Welcome, ctx: &Context) -> Result<Email, HandlerError> {
        if e.to.is_empty() {
            return Err(HandlerError::permanent("no address"));
        }
        Ok(mail(e, ctx))
    }
}

#[tokio::test]
async fn configuration_builds_working_handlers() {
    let server = MockServer::start().await;
    mount(&server, "/v1/send", ResponseTemplate::new(200)).await;
    let uri = server.uri();
    let vars = [
        ("OUTBOX_EMAIL_BASE_URL", uri.as_str()),
        ("OUTBOX_EMAIL_PATH", "/v1/send"),
        ("OUTBOX_EMAIL_API_KEY", KEY),
        ("OUTBOX_EMAIL_FROM", "env@stayhub.example"),
        ("OUTBOX_EMAIL_TIMEOUT", "2s"),
    ];
    let config = EmailConfig::from_lookup("OUTBOX_EMAIL_", |name| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| (*v).to_string())
    })
    .unwrap();
    assert!(!format!("{config:?}").contains(KEY));

    // Registered-handler style: built from the resources.
    let handler =
        EmailHandler::<WelcomeMail>::from_resources(&Resources::new().with(config)).unwrap();
    assert_eq!(<EmailHandler<WelcomeMail> as Handler>::NAME, "welcome-mail");
    let ctx = Context::for_test(Welcome::TOPIC, "welcome-mail", Resources::new());
    handler.handle(welcome(), &ctx).await.unwrap();
    let e = handler
        .handle(
            Welcome {
                to: String::new(),
                name: "x".into(),
            },
            &ctx,
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind(), FailureKind::Permanent);

    let reqs = requests(&server).await;
    assert_eq!(reqs.len(), 1);
    assert_eq!(header(&reqs[0], "idempotency-key"), ctx.idempotency_key());
    assert_eq!(
        reqs[0].body_json::<serde_json::Value>().unwrap()["from"],
        "env@stayhub.example"
    );

    // TOML, with errors that name the key.
    let toml = format!("[email]\nbase_url = '{uri}'\napi_key = '{KEY}'\nfrom = 'toml@x.example'\n");
    let t = EmailConfig::from_toml_str(&toml)
        .unwrap()
        .transport()
        .unwrap();
    // The default path, /emails, has no mock here: 404, a permanent failure.
    let e = t
        .send(&Email::new("g@example.com", "s", "t"), "k2")
        .await
        .unwrap_err();
    assert_eq!(e.kind(), FailureKind::Permanent);
    assert!(e.to_string().contains("answered 404 Not Found"), "{e}");
    let e = EmailConfig::from_toml_str("[email]\nbase_url = 'foo'\napi_key = 'k'")
        .unwrap()
        .transport()
        .unwrap_err();
    assert_eq!(e.to_string(), "email.base_url: not a valid URL (got `foo`)");
    let e = EmailHandler::<WelcomeMail>::from_resources(&Resources::new()).unwrap_err();
    assert!(e.to_string().contains("EmailConfig"), "{e}");
}
