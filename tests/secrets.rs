//! Secrets stay secret: the email and search handlers run against local HTTP servers
//! (wiremock on 127.0.0.1) that echo every credential back, with an API key, a basic-auth
//! password and a database URL with a password, on a worker connected through that URL. Every
//! log line (all levels, all threads), every error string, every `last_error` and every `Debug`
//! of arguments, configuration, builders, clients and errors is collected, and none may hold a
//! secret. The worker and `outbox` binaries are run too: `--help` with the secret in the
//! environment, and failing connections, must not print it.

use std::io::Write;
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use clap::Parser;
use outbox::cli::WorkerArgs;
use outbox::{enqueue, outbox_event, Context, RetryPolicy, Worker, WorkerConfig};
use outbox_handlers::email::{Email, EmailConfig, EmailHandler, HttpTransport};
use outbox_handlers::search::{IndexOp, SearchClient, SearchConfig, SearchHandler};
use outbox_handlers::Secret;
use outbox_tests::{pg, TestDb};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgConnectOptions;
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

const EMAIL_KEY: &str = "sk-email-7c1d9a0b3e";
const SEARCH_KEY: &str = "ak-search-5f2e8b7c4d";
const SEARCH_PASSWORD: &str = "pw-search-Q9x8W7v6";
const DB_PASSWORD: &str = "pw-database-K3j4H5g6";
/// `indexer:{SEARCH_PASSWORD}` in base64, as the basic-auth header carries it.
const SEARCH_BASIC: &str = "aW5kZXhlcjpwdy1zZWFyY2gtUTl4OFc3djY=";

const SECRETS: [&str; 5] = [
    EMAIL_KEY,
    SEARCH_KEY,
    SEARCH_PASSWORD,
    DB_PASSWORD,
    SEARCH_BASIC,
];

#[outbox_event(topic = "secrets.mail")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Mail {
    to: String,
}

#[outbox_event(topic = "secrets.doc")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Doc {
    id: String,
}

/// Every byte any `tracing` event of the process writes, from any thread.
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

/// A global subscriber at `trace`, so the worker's own thread is captured too.
fn capture() -> &'static Capture {
    static CAPTURE: OnceLock<Capture> = OnceLock::new();
    CAPTURE.get_or_init(|| {
        let capture = Capture::default();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("trace"))
            .with_writer(capture.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("no other subscriber");
        capture
    })
}

/// Answers with every header and the body of the request it got, so whatever was sent comes
/// back in the error: the worst case of a service that echoes credentials.
struct Echo(u16);

impl Respond for Echo {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let headers: Vec<String> = request
            .headers
            .iter()
            .map(|(k, v)| format!("{k}: {}", v.to_str().unwrap_or("?")))
            .collect();
        ResponseTemplate::new(self.0).set_body_string(format!(
            "rejected {} {} with headers [{}] and body {}",
            request.method,
            request.url,
            headers.join("; "),
            String::from_utf8_lossy(&request.body)
        ))
    }
}

/// `url` (of the test database) with the user's password set: the server trusts local
/// connections, so the password is not needed, only carried.
fn with_password(url: &str, port: Option<u16>) -> String {
    let o: PgConnectOptions = url.parse().unwrap();
    format!(
        "postgres://{}:{DB_PASSWORD}@{}:{}/{}",
        o.get_username(),
        o.get_host(),
        port.unwrap_or(o.get_port()),
        o.get_database().unwrap_or("postgres")
    )
}

/// Collects texts and fails naming the ones that hold a secret.
#[derive(Default)]
struct Seen(Vec<(String, String)>);

impl Seen {
    fn add(&mut self, what: &str, text: impl Into<String>) {
        self.0.push((what.to_string(), text.into()));
    }

    fn assert_clean(&self) {
        let leaks: Vec<String> = self
            .0
            .iter()
            .flat_map(|(what, text)| {
                text.lines()
                    .filter(|l| SECRETS.iter().any(|s| l.contains(s)))
                    .map(move |l| format!("{what}: {l}"))
            })
            .collect();
        assert!(leaks.is_empty(), "secrets leaked:\n{}", leaks.join("\n"));
    }
}

fn a_closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_a_log_line_an_error_or_a_debug() {
    let capture = capture();
    let mut seen = Seen::default();
    let db: TestDb = pg().await;
    let db_url = with_password(&db.url, None);

    // The worker's command line, and the store it connects to through the URL.
    let args = WorkerArgs::try_parse_from(["worker", "--database-url", &db_url, "--once"]).unwrap();
    seen.add("WorkerArgs Debug", format!("{args:?}"));
    tracing::info!(?args, "worker arguments");
    let store = outbox::cli::connect(&args.database_url).await.unwrap();
    seen.add("Store Debug", format!("{store:?}"));
    tracing::info!(?store, "connected");
    let refused = with_password(&db.url, Some(a_closed_port()));
    let e = outbox::cli::connect(&refused).await.unwrap_err();
    seen.add("connect error", outbox::cli::error_line(&e));
    seen.add("connect error Debug", format!("{e:?}"));
    tracing::warn!(error = %e, debug = ?e, "connect failed");
    let malformed = format!("postgres://app:{DB_PASSWORD}@127.0.0.1:port/db");
    let e = outbox::cli::connect(&malformed).await.unwrap_err();
    seen.add("malformed URL error", outbox::cli::error_line(&e));
    seen.add("malformed URL error Debug", format!("{e:?}"));

    // An email provider and a search index that echo every credential back.
    let mail_server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(Echo(500))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&mail_server)
        .await;
    Mock::given(method("POST"))
        .respond_with(Echo(401))
        .with_priority(2)
        .mount(&mail_server)
        .await;
    let search_server = MockServer::start().await;
    Mock::given(method("PUT"))
        .respond_with(Echo(503))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&search_server)
        .await;
    Mock::given(method("PUT"))
        .respond_with(Echo(403))
        .with_priority(2)
        .mount(&search_server)
        .await;

    // Email, from configuration.
    let email_config = EmailConfig::from_lookup("E_", |name| match name {
        "E_BASE_URL" => Some(mail_server.uri()),
        "E_API_KEY" => Some(EMAIL_KEY.into()),
        "E_FROM" => Some("bookings@stayhub.example".into()),
        "E_TIMEOUT" => Some("2s".into()),
        _ => None,
    })
    .unwrap();
    seen.add("EmailConfig Debug", format!("{email_config:?}"));
    let email_builder = HttpTransport::builder()
        .base_url(mail_server.uri())
        .api_key(EMAIL_KEY);
    seen.add("HttpTransportBuilder Debug", format!("{email_builder:?}"));
    let email = email_config.http_transport().unwrap();
    seen.add("HttpTransport Debug", format!("{email:?}"));
    tracing::info!(config = ?email_config, transport = ?email, "email configured");

    // Search, from configuration with basic auth, and from a builder with an API key.
    let search_config = SearchConfig::from_toml_str(&format!(
        "[search]\nbase_url = '{}'\nindex = 'hotels'\nusername = 'indexer'\npassword = '{SEARCH_PASSWORD}'\ntimeout = '2s'\n",
        search_server.uri()
    ))
    .unwrap();
    seen.add("SearchConfig Debug", format!("{search_config:?}"));
    let basic = search_config.client().unwrap();
    seen.add("SearchClient (basic) Debug", format!("{basic:?}"));
    let keyed_builder = SearchClient::builder()
        .base_url(search_server.uri())
        .index("hotels")
        .api_key(SEARCH_KEY);
    seen.add("SearchClientBuilder Debug", format!("{keyed_builder:?}"));
    let keyed = keyed_builder.build().unwrap();
    seen.add("SearchClient (key) Debug", format!("{keyed:?}"));
    seen.add("Secret Debug", format!("{:?}", Secret::new(SEARCH_KEY)));
    tracing::info!(config = ?search_config, basic = ?basic, keyed = ?keyed, "search configured");

    // Construction errors that are about a secret.
    for e in [
        HttpTransport::builder()
            .base_url("http://mail.internal")
            .api_key(EMAIL_KEY)
            .build()
            .unwrap_err(),
        HttpTransport::builder()
            .base_url("https://mail.internal")
            .api_key(format!("{EMAIL_KEY} x"))
            .build()
            .unwrap_err(),
        SearchClient::builder()
            .base_url("http://search.internal")
            .basic_auth("indexer", SEARCH_PASSWORD)
            .build()
            .unwrap_err(),
        SearchClient::builder()
            .base_url(format!("https://indexer:{SEARCH_PASSWORD}@search.internal"))
            .build()
            .unwrap_err(),
        SearchClient::builder()
            .base_url("https://search.internal")
            .api_key(SEARCH_KEY)
            .basic_auth("indexer", SEARCH_PASSWORD)
            .build()
            .unwrap_err(),
        SearchConfig::from_toml_str("[search]\nbase_url = 'https://x'\npassword = 12345")
            .unwrap_err(),
    ] {
        seen.add("config error", e.to_string());
        seen.add("config error Debug", format!("{e:?}"));
    }

    // The handlers on a worker, through every kind of failure, to the dead letter.
    let worker = Worker::builder(store)
        .handler(EmailHandler::from_fn(email, |m: &Mail, _ctx: &Context| {
            Email::new(&m.to, "Hello", "Hello!")
        }))
        .handler(
            SearchHandler::from_fn(basic, |d: &Doc, _ctx: &Context| IndexOp::Upsert {
                id: d.id.clone(),
                version: 1,
                document: serde_json::json!({ "id": d.id }),
            })
            .unwrap(),
        )
        .config(
            WorkerConfig::default()
                .retry(
                    RetryPolicy::default()
                        .max_attempts(2)
                        .jitter(false)
                        .base(Duration::from_millis(10)),
                )
                .handler_timeout(Duration::from_secs(5)),
        )
        .build()
        .unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    enqueue(
        &mut *tx,
        &Mail {
            to: "guest@example.com".into(),
        },
    )
    .await
    .unwrap();
    enqueue(&mut *tx, &Doc { id: "h-1".into() }).await.unwrap();
    tx.commit().await.unwrap();
    let first = worker.run_once().await.unwrap();
    assert_eq!(first.retried, 2, "{first:?}");
    db.make_due().await;
    let second = worker.run_once().await.unwrap();
    assert_eq!(second.dead, 2, "{second:?}");
    let errors: Vec<Option<String>> = sqlx::query_scalar(
        "SELECT last_error FROM outbox_messages UNION ALL SELECT last_error FROM outbox_dead",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(errors.len(), 2);
    for e in errors.iter().flatten() {
        seen.add("last_error", e.clone());
    }
    assert!(
        errors.iter().flatten().any(|e| e.contains("[redacted]")),
        "the servers echoed the secrets, which were scrubbed: {errors:?}"
    );
    drop(worker);

    // Direct calls: an echoing server, a server slower than the timeout, a closed port.
    let slow = MockServer::start().await;
    Mock::given(wiremock::matchers::any())
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(3)))
        .mount(&slow)
        .await;
    let closed = format!("http://127.0.0.1:{}", a_closed_port());
    for base in [search_server.uri(), slow.uri(), closed.clone()] {
        for client in [
            SearchClient::builder()
                .base_url(&base)
                .api_key(SEARCH_KEY)
                .timeout(Duration::from_millis(300))
                .build()
                .unwrap(),
            SearchClient::builder()
                .base_url(&base)
                .basic_auth("indexer", SEARCH_PASSWORD)
                .timeout(Duration::from_millis(300))
                .build()
                .unwrap(),
        ] {
            let op = IndexOp::Upsert {
                id: "h-2".into(),
                version: 2,
                document: serde_json::json!({}),
            };
            let e = client.apply("hotels", &op).await.unwrap_err();
            tracing::warn!(error = %e, debug = ?e, "index failed");
            seen.add("search error", e.to_string());
            seen.add("search error Debug", format!("{e:?}"));
        }
        let transport = HttpTransport::builder()
            .base_url(&base)
            .api_key(EMAIL_KEY)
            .from("a@b.example")
            .timeout(Duration::from_millis(300))
            .build()
            .unwrap();
        let e = outbox_handlers::email::EmailTransport::send(
            &transport,
            &Email::new("g@example.com", "s", "t"),
            "k-1",
        )
        .await
        .unwrap_err();
        tracing::warn!(error = %e, debug = ?e, "send failed");
        seen.add("email error", e.to_string());
        seen.add("email error Debug", format!("{e:?}"));
    }

    // The servers did get the secrets: what is asserted above is not vacuous.
    let received: Vec<String> = mail_server
        .received_requests()
        .await
        .unwrap()
        .into_iter()
        .chain(search_server.received_requests().await.unwrap())
        .flat_map(|r| {
            r.headers
                .values()
                .map(|v| v.to_str().unwrap_or("").to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    for secret in [EMAIL_KEY, SEARCH_KEY, SEARCH_BASIC] {
        assert!(
            received.iter().any(|h| h.contains(secret)),
            "{secret} was sent"
        );
    }

    let logs = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("handler failed"), "{logs}");
    assert!(logs.contains("search configured"), "{logs}");
    seen.add("log", logs);
    seen.assert_clean();
    db.drop_db().await;
}

/// The output of a binary of this package, run with `args` and `env`.
fn run(bin: &str, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = Command::new(bin);
    cmd.args(args).env("RUST_LOG", "trace");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

#[tokio::test]
async fn binaries_print_no_database_password() {
    let db = pg().await;
    let url = with_password(&db.url, None);
    let refused = with_password(&db.url, Some(a_closed_port()));
    let worker = env!("CARGO_BIN_EXE_test-worker");
    let ops = env!("CARGO_BIN_EXE_ops");
    let mut seen = Seen::default();
    for bin in [worker, ops] {
        let (code, help) = run(bin, &["--help"], &[("DATABASE_URL", &url)]);
        assert_eq!(code, Some(0), "{help}");
        assert!(help.contains("DATABASE_URL"), "{help}");
        seen.add(&format!("{bin} --help"), help);
    }
    let (code, out) = run(worker, &["--once"], &[("DATABASE_URL", &url)]);
    assert_eq!(code, Some(0), "{out}");
    seen.add("worker --once", out);
    let (code, out) = run(ops, &["stats"], &[("DATABASE_URL", &url)]);
    assert_eq!(code, Some(0), "{out}");
    seen.add("outbox stats", out);
    for bin in [worker, ops] {
        let args: &[&str] = if bin == ops { &["stats"] } else { &["--once"] };
        let (code, out) = run(bin, args, &[("DATABASE_URL", &refused)]);
        assert_eq!(code, Some(i32::from(outbox::cli::exit::DATABASE)), "{out}");
        seen.add(&format!("{bin} refused"), out);
        let (code, out) = run(bin, &[&["--database-url", &refused], args].concat(), &[]);
        assert_eq!(code, Some(i32::from(outbox::cli::exit::DATABASE)), "{out}");
        seen.add(&format!("{bin} --database-url refused"), out);
    }
    seen.assert_clean();
    db.drop_db().await;
}
