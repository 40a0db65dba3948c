//! The operator's console: in a real browser (headless Chromium over WebDriver) and over
//! plain HTTP for the rules a browser would hide (tokens, credentials, hosts, read-only).
//!
//! The browser tests need Debian's `chromium` and `chromium-driver`. With `CONSOLE_SCREENSHOTS`
//! set, the StayHub test rewrites the README's `docs/console-overview.png` and
//! `docs/console-dead-letter.png`.

use std::io::Write as _;
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use outbox::console::{self, ConsoleConfig};
use outbox::{
    enqueue_many, enqueue_with, outbox_event, Context, EnqueueOptions, Handler, HandlerError,
    Store, TopicStats, Worker,
};
use outbox_tests::{pg, wait_until, TestDb};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use uuid::Uuid;

#[outbox_event(topic = "console.mail")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Mail {
    to: String,
    note: String,
}

#[outbox_event(topic = "console.index")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Index {
    doc: i64,
}

#[outbox_event(topic = "console.audit")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Audit {
    n: i32,
}

/// Fails every mail for good, quoting its note: each one run becomes a dead letter.
struct Bounce;

#[outbox::async_trait]
impl Handler for Bounce {
    type Event = Mail;
    const NAME: &'static str = "bounce";
    async fn handle(&self, m: Mail, _: &Context) -> Result<(), HandlerError> {
        Err(HandlerError::permanent(format!(
            "550 mailbox {} unavailable: {}",
            m.to, m.note
        )))
    }
}

/// Fails every index update for good.
struct Reject;

#[outbox::async_trait]
impl Handler for Reject {
    type Event = Index;
    const NAME: &'static str = "reject";
    async fn handle(&self, i: Index, _: &Context) -> Result<(), HandlerError> {
        Err(HandlerError::permanent(format!(
            "mapping conflict on doc {}",
            i.doc
        )))
    }
}

fn mail(to: &str, note: &str) -> Mail {
    Mail {
        to: to.into(),
        note: note.into(),
    }
}

/// Enqueues mails and runs them once: each becomes a dead letter. Returns their ids.
async fn dead_mails(db: &TestDb, mails: &[Mail]) -> Vec<Uuid> {
    let mut tx = db.pool.begin().await.unwrap();
    let ids = enqueue_many(&mut *tx, mails).await.unwrap();
    tx.commit().await.unwrap();
    run_once(db).await;
    ids
}

/// Enqueues index updates and runs them once: each becomes a dead letter.
async fn dead_index(db: &TestDb, n: i64) -> Vec<Uuid> {
    let docs: Vec<Index> = (0..n).map(|doc| Index { doc }).collect();
    let mut tx = db.pool.begin().await.unwrap();
    let ids = enqueue_many(&mut *tx, &docs).await.unwrap();
    tx.commit().await.unwrap();
    run_once(db).await;
    ids
}

async fn run_once(db: &TestDb) {
    Worker::builder(&db.pool)
        .handler(Bounce)
        .handler(Reject)
        .build()
        .unwrap()
        .run_once()
        .await
        .unwrap();
}

/// Runs `worker` in the background until the sender is used or dropped.
fn start(
    worker: Worker,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<outbox::Result<()>>,
) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        worker
            .run_until(async {
                let _ = stopped.await;
            })
            .await
    });
    (stop, running)
}

/// Waits (30 s at most) until the statistics of `topic` are as `ok` wants them.
async fn wait_for_topic(db: &TestDb, what: &str, topic: &str, ok: impl Fn(&TopicStats) -> bool) {
    let store = Store::from(&db.pool);
    wait_until(Duration::from_secs(30), what, async || {
        let stats = store.stats().await.unwrap();
        stats.topics.iter().any(|t| t.topic == topic && ok(t))
    })
    .await;
}

async fn status(db: &TestDb, id: Uuid) -> Option<String> {
    Store::from(&db.pool)
        .message(id)
        .await
        .unwrap()
        .map(|m| m.status.to_string())
}

/// Serves the console (at `mount`, `""` for the root) on a free loopback port.
async fn serve_at(db: &TestDb, config: ConsoleConfig, mount: &str) -> SocketAddr {
    serve_store(Store::from(&db.pool), config, mount).await
}

/// Serves the console of `store`, of either backend, (at `mount`) on a free loopback port.
async fn serve_store(store: Store, config: ConsoleConfig, mount: &str) -> SocketAddr {
    let router = console::router(store, config);
    let app = if mount.is_empty() {
        router
    } else {
        axum::Router::new().nest(mount, router)
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    addr
}

async fn serve(db: &TestDb, config: ConsoleConfig) -> SocketAddr {
    serve_at(db, config, "").await
}

// ---------------------------------------------------------------------------------------------
// Plain HTTP

/// An HTTP answer: status, headers (lower-case names) and body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 request to `addr`: `extra` headers as written, `body` as a form.
async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    extra: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !extra.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in extra {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if method == "POST" {
        req.push_str(&format!(
            "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut raw))
        .await
        .expect("the console answers in time")
        .unwrap();
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines.next().unwrap().split_whitespace().nth(1).unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Answer {
        status: status.parse().unwrap(),
        headers,
        body: body.to_owned(),
    }
}

/// The CSRF token embedded in a page's forms.
fn csrf_of(page: &str) -> String {
    let at = page
        .find("name=\"csrf\" value=\"")
        .expect("the page has a form with a token");
    page[at + 19..].split('"').next().unwrap().to_owned()
}

#[tokio::test]
async fn a_post_without_the_token_is_refused() {
    let db = pg().await;
    dead_mails(
        &db,
        &[mail("a@example.com", "x"), mail("b@example.com", "y")],
    )
    .await;
    let addr = serve(&db, ConsoleConfig::new()).await;
    let store = Store::from(&db.pool);
    let dead = || async { store.stats().await.unwrap().total.dead };

    for body in [
        "action=discard&scope=all",
        "action=discard&scope=all&csrf=",
        "action=discard&scope=all&csrf=0000",
    ] {
        let a = http(addr, "POST", "/dead/apply", &[], body).await;
        assert_eq!(a.status, 403, "{body}: {}", a.body);
        assert!(a.body.contains("security token"), "{}", a.body);
    }
    let a = http(addr, "POST", "/dead/confirm", &[], "op=discard:all").await;
    assert_eq!(a.status, 403);
    // A GET never changes anything.
    let a = http(addr, "GET", "/dead/apply?action=discard&scope=all", &[], "").await;
    assert_eq!(a.status, 405);
    assert_eq!(dead().await, 2, "nothing was discarded");

    // The page's own token from another origin: refused too.
    let page = http(addr, "GET", "/dead", &[], "").await;
    assert_eq!(page.status, 200);
    let csrf = csrf_of(&page.body);
    let form = format!("action=discard&scope=all&csrf={csrf}");
    let a = http(
        addr,
        "POST",
        "/dead/apply",
        &[("Origin", "http://evil.example")],
        &form,
    )
    .await;
    assert_eq!(a.status, 403);
    assert_eq!(dead().await, 2);

    // With it, from the console's own origin, the same request goes through.
    let origin = format!("http://{addr}");
    let a = http(addr, "POST", "/dead/apply", &[("Origin", &origin)], &form).await;
    assert_eq!(a.status, 303, "{}", a.body);
    assert_eq!(
        a.header("location"),
        Some("/dead?topic=&done=discarded&n=2")
    );
    assert_eq!(dead().await, 0);
    db.drop_db().await;
}

#[tokio::test]
async fn without_credentials_only_loopback_hosts_are_answered() {
    let db = pg().await;
    let addr = serve(&db, ConsoleConfig::new()).await;
    for host in ["127.0.0.1", "localhost:8080", "[::1]:8080"] {
        let a = http(addr, "GET", "/", &[("Host", host)], "").await;
        assert_eq!(a.status, 200, "{host}");
    }
    // A rebound DNS name or a proxy forwarding the outside's Host: refused, assets too.
    for host in ["console.example", "10.1.2.3:8080", "localhost.evil.example"] {
        for path in ["/", "/dead", "/assets/console.css"] {
            let a = http(addr, "GET", path, &[("Host", host)], "").await;
            assert_eq!(a.status, 403, "{host}{path}");
        }
    }
    // Security headers on every answer.
    let a = http(addr, "GET", "/", &[], "").await;
    let csp = a.header("content-security-policy").unwrap();
    assert!(csp.contains("script-src 'self'"), "{csp}");
    assert_eq!(a.header("x-frame-options"), Some("DENY"));
    assert_eq!(a.header("cache-control"), Some("no-store"));

    // The command line refuses a non-loopback address without credentials, before connecting.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ops"))
        .args(["console", "--addr", "0.0.0.0:0"])
        .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
        .env_remove("OUTBOX_CONSOLE_TOKEN")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("not a loopback address"), "{err}");
    db.drop_db().await;
}

#[tokio::test]
async fn a_token_guards_every_page_and_signs_in_once() {
    let db = pg().await;
    let addr = serve(&db, ConsoleConfig::new().token("s3cret-token")).await;
    // Any host name is fine once credentials are required.
    let outside = [("Host", "console.example")];

    let a = http(addr, "GET", "/dead", &outside, "").await;
    assert_eq!((a.status, a.header("location")), (303, Some("/login")));
    let a = http(
        addr,
        "POST",
        "/dead/apply",
        &outside,
        "action=retry&scope=all",
    )
    .await;
    assert_eq!(a.status, 401);
    let wrong = [
        ("Host", "console.example"),
        ("Authorization", "Bearer nope"),
    ];
    assert_eq!(http(addr, "GET", "/", &wrong, "").await.status, 303);
    let right = [
        ("Host", "console.example"),
        ("Authorization", "Bearer s3cret-token"),
    ];
    assert_eq!(http(addr, "GET", "/", &right, "").await.status, 200);
    // The sign-in page and its stylesheet need no credentials.
    assert_eq!(
        http(addr, "GET", "/assets/console.css", &outside, "")
            .await
            .status,
        200
    );
    let login = http(addr, "GET", "/login", &outside, "").await;
    assert_eq!(login.status, 200);
    let csrf = csrf_of(&login.body);

    let a = http(
        addr,
        "POST",
        "/login",
        &outside,
        &format!("csrf={csrf}&token=guess"),
    )
    .await;
    assert_eq!(a.status, 401);
    assert!(a.header("set-cookie").is_none());
    let a = http(addr, "POST", "/login", &outside, "token=s3cret-token").await;
    assert_eq!(a.status, 403, "signing in needs the form's token too");
    let a = http(
        addr,
        "POST",
        "/login",
        &outside,
        &format!("csrf={csrf}&token=s3cret-token"),
    )
    .await;
    assert_eq!(a.status, 303);
    let cookie = a.header("set-cookie").unwrap().to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(
        !cookie.contains("s3cret-token"),
        "the cookie is not the token"
    );
    let session = cookie.split(';').next().unwrap().to_owned();
    let signed_in = [("Host", "console.example"), ("Cookie", session.as_str())];
    let a = http(addr, "GET", "/dead", &signed_in, "").await;
    assert_eq!(a.status, 200);
    assert!(a.body.contains("Sign out"));
    db.drop_db().await;
}

#[tokio::test]
async fn basic_auth_and_a_nested_mount() {
    let db = pg().await;
    Store::from(&db.pool)
        .declare_retention(&[("console.log", LOG_WINDOW)])
        .await
        .unwrap();
    let addr = serve_at(&db, ConsoleConfig::new().basic("ops", "pa:ss"), "/ops").await;
    for path in ["/ops/dead", "/ops/events", "/ops/events?topic=console.log"] {
        let a = http(addr, "GET", path, &[], "").await;
        assert_eq!(a.status, 401, "{path}");
    }
    let a = http(addr, "GET", "/ops/dead", &[], "").await;
    assert_eq!(a.status, 401);
    assert!(a.header("www-authenticate").unwrap().starts_with("Basic"));
    // "ops:wrong" and "ops:pa:ss" in base64.
    let wrong = [("Authorization", "Basic b3BzOndyb25n")];
    assert_eq!(http(addr, "GET", "/ops/dead", &wrong, "").await.status, 401);
    let right = [("Authorization", "Basic b3BzOnBhOnNz")];
    let a = http(addr, "GET", "/ops", &right, "").await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(
        a.body.contains("href=\"/ops/dead\""),
        "links follow the mount"
    );
    assert!(a.body.contains("href=\"/ops/assets/console.css\""));
    assert!(
        a.body.contains("href=\"/ops/events\""),
        "the event log in the nav"
    );
    let a = http(addr, "GET", "/ops/dead", &right, "").await;
    assert_eq!(a.status, 200);
    let a = http(addr, "GET", "/ops/events", &right, "").await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(
        a.body.contains("href=\"/ops/events?topic=console.log\""),
        "a topic's link follows the mount: {}",
        a.body
    );
    let a = http(addr, "GET", "/ops/events?topic=console.log", &right, "").await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(a.body.contains("action=\"/ops/events\""), "{}", a.body);
    assert!(a.body.contains("href=\"/ops/events\" id=\"all-topics\""));
    assert_eq!(
        http(addr, "GET", "/ops/assets/console.css", &right, "")
            .await
            .status,
        200
    );
    db.drop_db().await;
}

#[tokio::test]
async fn read_only_refuses_every_change() {
    let db = pg().await;
    dead_mails(&db, &[mail("a@example.com", "x")]).await;
    let addr = serve(&db, ConsoleConfig::new().read_only(true)).await;
    let a = http(addr, "GET", "/dead", &[], "").await;
    assert_eq!(a.status, 200);
    assert!(!a.body.contains("name=\"op\""), "{}", a.body);
    assert!(!a.body.contains("name=\"csrf\""));
    for path in ["/dead/confirm", "/dead/apply"] {
        let a = http(addr, "POST", path, &[], "action=discard&scope=all&csrf=x").await;
        assert_eq!(a.status, 403);
        assert!(a.body.contains("read-only"), "{}", a.body);
    }
    assert_eq!(Store::from(&db.pool).stats().await.unwrap().total.dead, 1);
    db.drop_db().await;
}

/// The overview lists the live workers' handlers with a Pause button each; the button asks
/// first, then pauses the handler for every worker, and Resume lifts it; read-only shows
/// neither, and a form without the token is refused.
#[tokio::test]
async fn pause_and_resume_a_handler_from_the_overview() {
    let db = pg().await;
    let store = Store::from(&db.pool);
    let worker = Worker::builder(&db.pool)
        .handler(Bounce)
        .handler(Reject)
        .build()
        .unwrap();
    let (stop, running) = start(worker);
    wait_until(Duration::from_secs(10), "the worker is live", async || {
        store.workers().await.unwrap().iter().any(|w| w.live)
    })
    .await;
    let addr = serve(&db, ConsoleConfig::new()).await;
    let page = http(addr, "GET", "/", &[], "").await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("id=\"pause-bounce\""), "{}", page.body);
    assert!(page.body.contains("id=\"pause-reject\""), "{}", page.body);
    let csrf = csrf_of(&page.body);

    let a = http(addr, "POST", "/pauses/confirm", &[], "op=pause:bounce").await;
    assert_eq!(a.status, 403, "no token, no confirmation");
    let a = http(
        addr,
        "POST",
        "/pauses/confirm",
        &[],
        &format!("op=pause:bounce&csrf={csrf}"),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(a.body.contains("Pause handler bounce?"), "{}", a.body);
    assert!(
        store.pauses().await.unwrap().is_empty(),
        "the confirmation changes nothing"
    );

    let form = format!("action=pause&handler=bounce&csrf={csrf}");
    let a = http(addr, "POST", "/pauses/apply", &[], &form).await;
    assert_eq!(
        (a.status, a.header("location")),
        (303, Some("/")),
        "{}",
        a.body
    );
    let pauses = store.pauses().await.unwrap();
    assert_eq!(pauses.len(), 1);
    assert_eq!(pauses[0].target, outbox::PauseTarget::handler("bounce"));
    let page = http(addr, "GET", "/", &[], "").await;
    assert!(page.body.contains("id=\"resume-bounce\""), "{}", page.body);
    assert!(page.body.contains("paused</span>"), "{}", page.body);

    let ro = serve(&db, ConsoleConfig::new().read_only(true)).await;
    let page = http(ro, "GET", "/", &[], "").await;
    assert!(
        page.body.contains("bounce") && !page.body.contains("id=\"resume-bounce\""),
        "{}",
        page.body
    );
    let a = http(
        ro,
        "POST",
        "/pauses/apply",
        &[],
        "action=resume&handler=bounce&csrf=x",
    )
    .await;
    assert_eq!(a.status, 403);

    let a = http(
        addr,
        "POST",
        "/pauses/apply",
        &[],
        &format!("action=resume&handler=bounce&csrf={csrf}"),
    )
    .await;
    assert_eq!(a.status, 303, "{}", a.body);
    assert!(store.pauses().await.unwrap().is_empty());
    let a = http(
        addr,
        "POST",
        "/pauses/apply",
        &[],
        &format!("action=pause&handler=nobody&csrf={csrf}"),
    )
    .await;
    assert_eq!(a.status, 400, "an unknown handler is refused: {}", a.body);
    assert!(a.body.contains("known handlers"), "{}", a.body);
    let _ = stop.send(());
    running.await.unwrap().unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn dead_letters_page_and_filter() {
    let db = pg().await;
    let mails: Vec<Mail> = (0..5)
        .map(|i| mail(&format!("m{i}@example.com"), ""))
        .collect();
    dead_mails(&db, &mails).await;
    dead_index(&db, 1).await;
    let addr = serve(&db, ConsoleConfig::new().page_size(2)).await;
    let rows = |body: &str| body.matches("<tr data-id=").count();

    // A topic no topic can be: a 400 page saying why, not a database error.
    let long = "t".repeat(65);
    for path in [
        "/dead?topic=a%00b".to_string(),
        format!("/dead?topic={long}"),
    ] {
        let a = http(addr, "GET", &path, &[], "").await;
        assert_eq!(a.status, 400, "{path}: {}", a.body);
        assert!(
            a.body.contains("id=\"bad-request\"") && a.body.contains("is not a topic"),
            "{}",
            a.body
        );
    }

    // The "Older" link of a page, as the browser would follow it.
    let next = |body: &str| -> Option<String> {
        let at = body.find("id=\"next\"")?;
        let href = body[..at].rfind("href=\"")? + 6;
        Some(body[href..].split('"').next()?.replace("&amp;", "&"))
    };
    let ids = |body: &str| -> Vec<String> {
        body.split("<tr data-id=\"")
            .skip(1)
            .map(|r| r.split('"').next().unwrap().to_owned())
            .collect()
    };

    let a = http(addr, "GET", "/dead?topic=console.mail", &[], "").await;
    assert_eq!(rows(&a.body), 2);
    assert!(a.body.contains("5 dead letters in topic"), "{}", a.body);
    assert!(a.body.contains("<span>1–2</span>"), "{}", a.body);
    assert!(!a.body.contains("id=\"prev\""));
    let mut seen = ids(&a.body);
    let b = http(addr, "GET", &next(&a.body).expect("an Older link"), &[], "").await;
    assert_eq!(rows(&b.body), 2);
    assert!(b.body.contains("<span>3–4</span>"), "{}", b.body);
    seen.extend(ids(&b.body));
    let c = http(addr, "GET", &next(&b.body).expect("an Older link"), &[], "").await;
    assert_eq!(rows(&c.body), 1);
    assert!(next(&c.body).is_none() && c.body.contains("id=\"prev\""));
    assert!(
        !c.body.contains("<td>console.index</td>"),
        "only the topic asked for"
    );
    seen.extend(ids(&c.body));
    let distinct: std::collections::BTreeSet<_> = seen.iter().collect();
    assert_eq!(
        distinct.len(),
        5,
        "each dead letter on exactly one page: {seen:?}"
    );
    // Everything, and nothing dead for an hour yet.
    let a = http(addr, "GET", "/dead", &[], "").await;
    let b = http(addr, "GET", &next(&a.body).expect("an Older link"), &[], "").await;
    assert_eq!(rows(&b.body), 2);
    let a = http(addr, "GET", "/dead?older_than=1h", &[], "").await;
    assert_eq!(rows(&a.body), 0);
    assert!(a.body.contains("No dead letters here."));
    let a = http(addr, "GET", "/dead?older_than=soon", &[], "").await;
    assert!(a.body.contains("is not an age"), "{}", a.body);
    assert_eq!(rows(&a.body), 2);
    // A message that does not exist, and one that is not a uuid.
    let a = http(
        addr,
        "GET",
        &format!("/messages/{}", Uuid::now_v7()),
        &[],
        "",
    )
    .await;
    assert_eq!(a.status, 404);
    let a = http(addr, "GET", "/messages/%3Cscript%3E", &[], "").await;
    assert_eq!(a.status, 404);
    assert!(a.body.contains("&lt;script&gt;") && !a.body.contains("<script>"));
    db.drop_db().await;
}

/// The text of the first `<tag ...>...</tag>` in `html` after `from`, with inner tags removed.
fn element_text(html: &str, from: &str, tag: &str) -> Option<String> {
    let rest = &html[html.find(from)?..];
    let open = rest.find(&format!("<{tag}"))?;
    let inner = &rest[open..];
    let inner = &inner[inner.find('>')? + 1..inner.find(&format!("</{tag}>"))?];
    let mut text = String::new();
    let mut in_tag = false;
    for c in inner.chars() {
        match c {
            '<' => in_tag = true,
            '>' => in_tag = false,
            c if !in_tag => text.push(c),
            _ => {}
        }
    }
    Some(text)
}

#[tokio::test]
async fn dead_letters_enqueued_in_one_millisecond_look_different() {
    let db = pg().await;
    // Two mails whose ids share their millisecond, the first 13 characters of a UUID v7.
    let mut pair = Vec::new();
    for _ in 0..100 {
        let mut tx = db.pool.begin().await.unwrap();
        let ids = enqueue_many(
            &mut *tx,
            &[mail("a@example.com", ""), mail("b@example.com", "")],
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        if ids[0].to_string()[..13] == ids[1].to_string()[..13] {
            pair = ids;
            break;
        }
    }
    assert_eq!(pair.len(), 2, "no two ids made in one millisecond");
    run_once(&db).await;
    let addr = serve(&db, ConsoleConfig::new().page_size(500)).await;
    let page = http(addr, "GET", "/dead", &[], "").await;
    assert_eq!(page.status, 200);
    let shown: Vec<String> = pair
        .iter()
        .map(|id| {
            let row = format!("<tr data-id=\"{id}\">");
            let text = element_text(&page.body, &row, "a")
                .unwrap_or_else(|| panic!("no row for {id}: {}", page.body));
            let link = format!("href=\"/messages/{id}\"");
            assert!(page.body.contains(&link), "{link}: {}", page.body);
            text
        })
        .collect();
    assert_ne!(shown[0], shown[1], "two dead letters look the same");
    assert_eq!(shown, [pair[0].to_string(), pair[1].to_string()]);
    db.drop_db().await;
}

/// The text of the overview's cell of class `class` in the row of `topic`, as a number.
fn overview_cell(page: &str, topic: &str, class: &str) -> Option<i64> {
    let start = page.find(&format!("<tr data-topic=\"{topic}\""))?;
    let row = &page[start..];
    let row = &row[..row.find("</tr>")?];
    // The cell's class is `n {class}`, maybe followed by a colour (`bad`, `warn`).
    let cell = format!("<td class=\"n {class}");
    let at = row
        .match_indices(&cell)
        .map(|(i, _)| i)
        .find(|&i| matches!(row.as_bytes().get(i + cell.len()), Some(b'"' | b' ')))?;
    element_text(&row[at..], "<td", "td")?
        .replace(',', "")
        .parse()
        .ok()
}

#[tokio::test]
async fn the_overview_counts_what_outbox_stats_counts() {
    let db = pg().await;
    // A live worker; a guest's two mails of one ordering key, the first of which dies and
    // holds back the second; and ready messages of a topic this worker does not serve.
    let mut tx = db.pool.begin().await.unwrap();
    for note in ["first", "second"] {
        enqueue_with(
            &mut *tx,
            &mail("guest-7@example.com", note),
            &EnqueueOptions::new().ordering_key("guest-7"),
        )
        .await
        .unwrap();
    }
    enqueue_many(&mut *tx, &(0..3).map(|n| Audit { n }).collect::<Vec<_>>())
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let worker = Worker::builder(&db.pool)
        .handler(Bounce)
        .handler(Reject)
        .config(outbox::WorkerConfig::default().poll_interval(Duration::from_millis(50)))
        .build()
        .unwrap();
    let (stop, running) = start(worker);
    wait_for_topic(
        &db,
        "a dead letter blocks its key under a live worker",
        "console.mail",
        |t| (t.dead, t.blocked, t.blocked_by_dead, t.live_workers) == (1, 1, 1, 1),
    )
    .await;

    let addr = serve(&db, ConsoleConfig::new()).await;
    let page = http(addr, "GET", "/", &[], "").await;
    assert_eq!(page.status, 200);
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_ops"))
        .args(["stats", "--json"])
        .env("DATABASE_URL", &db.url)
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let cli: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = cli["topics"]
        .as_array()
        .unwrap()
        .iter()
        .chain([&cli["total"]]);
    let mut compared = 0;
    for row in rows {
        let topic = row["topic"].as_str().unwrap();
        for (class, field) in [
            ("ready", "ready"),
            ("scheduled", "scheduled"),
            ("in-flight", "in_flight"),
            ("blocked", "blocked"),
            ("blocked-by-dead", "blocked_by_dead"),
            ("awaiting-version", "awaiting_version"),
            ("stalled", "stalled"),
            ("dead", "dead"),
            ("done", "done_last_5m"),
            ("workers", "live_workers"),
        ] {
            assert_eq!(
                overview_cell(&page.body, topic, class),
                row[field].as_i64(),
                "{topic} {field}: the console against `outbox stats`\n{}",
                page.body
            );
            compared += 1;
        }
    }
    let topics: Vec<&str> = cli["topics"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["topic"].as_str())
        .collect();
    assert!(
        topics.contains(&"console.mail") && topics.contains(&"console.audit"),
        "{topics:?}"
    );
    assert_eq!(
        compared,
        10 * (topics.len() + 1),
        "every topic and all topics"
    );
    assert_eq!(cli["total"]["live_workers"], 1);
    assert_eq!(cli["total"]["blocked_by_dead"], 1);
    let _ = stop.send(());
    running.await.unwrap().unwrap();
    db.drop_db().await;
}

// ---------------------------------------------------------------------------------------------
// The event log

/// How long `console.log` keeps its delivered events.
const LOG_WINDOW: Duration = Duration::from_secs(30 * 86_400);

/// An event of a topic that keeps its delivered events.
#[outbox_event(topic = "console.log", ordering_key = "key", retain = "30d")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Logged {
    key: String,
    note: String,
}

/// Delivers every `Logged`.
struct Accept;

#[outbox::async_trait]
impl Handler for Accept {
    type Event = Logged;
    const NAME: &'static str = "accept";
    async fn handle(&self, _: Logged, _: &Context) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// Runs a worker of `Logged` on `store` until nothing is pending.
async fn deliver_all(store: &Store) {
    let worker = Worker::builder(store.clone())
        .handler(Accept)
        .build()
        .unwrap();
    wait_until(
        Duration::from_secs(30),
        "every event delivered",
        async || {
            worker.run_once().await.unwrap();
            store.stats().await.unwrap().total.pending() == 0
        },
    )
    .await;
}

/// The address of the link `id` on a page, as a browser would follow it.
fn link_of(body: &str, id: &str) -> Option<String> {
    let at = body.find(&format!("id=\"{id}\""))?;
    let href = body[..at].rfind("href=\"")? + 6;
    Some(body[href..].split('"').next()?.replace("&amp;", "&"))
}

/// The ids of a page's rows, in order.
fn row_ids(body: &str) -> Vec<String> {
    body.split("<tr data-id=\"")
        .skip(1)
        .map(|r| r.split('"').next().unwrap().to_owned())
        .collect()
}

/// The text of the cell of class `class` in the event log's row of `topic`.
fn log_cell(page: &str, topic: &str, class: &str) -> Option<String> {
    let start = page.find(&format!("<tr data-topic=\"{topic}\""))?;
    let row = &page[start..];
    let row = &row[..row.find("</tr>")?];
    element_text(row, &format!("<td class=\"{class}\""), "td")
}

outbox_tests::all_backends! {
    async fn the_event_log_lists_the_retained_topics_and_pages_through_one(db, store, pool) {
        let addr = serve_store(store.clone(), ConsoleConfig::new().page_size(3), "").await;
        // Nothing retained yet: one sentence saying how to retain.
        let a = http(addr, "GET", "/events", &[], "").await;
        assert_eq!(a.status, 200, "{}", a.body);
        assert!(a.body.contains("id=\"no-retained\""), "{}", a.body);
        assert!(a.body.contains("retain = \"180d\""), "{}", a.body);
        assert!(
            a.body.contains("<a href=\"/events\" aria-current=\"page\">Event log</a>"),
            "the nav entry, current: {}",
            a.body
        );
        let home = http(addr, "GET", "/", &[], "").await;
        assert!(home.body.contains("<a href=\"/events\">Event log</a>"), "{}", home.body);
        assert!(!home.body.contains("event-log-runway"), "{}", home.body);

        store.declare_retention(&[("console.log", LOG_WINDOW)]).await.unwrap();
        let events: Vec<Logged> = (0..7)
            .map(|n| Logged {
                key: format!("k{}", n % 3),
                note: if n == 4 {
                    "<script>alert('pwned')</script>".into()
                } else {
                    format!("note {n}")
                },
            })
            .collect();
        let mut tx = pool.begin().await.unwrap();
        let ids = enqueue_many(&mut *tx, &events).await.unwrap();
        tx.commit().await.unwrap();
        deliver_all(&store).await;

        // The list: window, count, size (PostgreSQL), oldest event, partitions (PostgreSQL).
        let a = http(addr, "GET", "/events", &[], "").await;
        assert_eq!(a.status, 200, "{}", a.body);
        assert!(a.body.contains("1 topic keeps its delivered events"), "{}", a.body);
        assert_eq!(log_cell(&a.body, "console.log", "window").as_deref(), Some("30d"));
        assert_eq!(log_cell(&a.body, "console.log", "n events").as_deref(), Some("7"));
        let oldest = log_cell(&a.body, "console.log", "oldest").unwrap();
        assert!(oldest.contains(" UTC"), "{oldest}");
        let (size, until) = (
            log_cell(&a.body, "console.log", "n size").unwrap(),
            log_cell(&a.body, "console.log", "until").unwrap(),
        );
        if store.kind() == "postgres" {
            assert!(size.ends_with('B') && size != "0 B", "{size}");
            assert!(until.contains("(in "), "partitions ahead: {until}");
        } else {
            assert_eq!((size.as_str(), until.as_str()), ("-", "-"));
        }
        assert!(!a.body.contains("id=\"runway\""), "{}", a.body);
        assert!(a.body.contains("href=\"/events?topic=console.log\""), "{}", a.body);

        // The topic's events, oldest first, three a page, on through `after`.
        let mut page = http(addr, "GET", "/events?topic=console.log", &[], "").await;
        let mut seen = Vec::new();
        let mut pages = 0;
        loop {
            assert_eq!(page.status, 200, "{}", page.body);
            assert!(!page.body.contains("method=\"post\""), "read only: {}", page.body);
            pages += 1;
            seen.extend(row_ids(&page.body));
            if pages > 1 {
                assert!(page.body.contains("id=\"first\""), "{}", page.body);
            }
            let Some(next) = link_of(&page.body, "next") else { break };
            assert!(next.starts_with("/events?topic=console.log&after="), "{next}");
            page = http(addr, "GET", &next, &[], "").await;
        }
        let expected: Vec<String> = ids.iter().map(Uuid::to_string).collect();
        assert_eq!(seen, expected, "every event once, in enqueue order");
        assert_eq!(pages, 3);
        let last = format!("/events?topic=console.log&after={}", ids[6]);
        let a = http(addr, "GET", &last, &[], "").await;
        assert!(a.body.contains("No more events."), "{}", a.body);

        // A payload holding a script shows as text; each row has its key and version.
        let a = http(addr, "GET", &format!("/events?topic=console.log&after={}", ids[2]), &[], "").await;
        assert!(!a.body.contains("<script>alert"), "{}", a.body);
        assert!(a.body.contains("&lt;script&gt;alert(&#39;pwned&#39;)&lt;/script&gt;"), "{}", a.body);
        let row = &a.body[a.body.find(&format!("<tr data-id=\"{}\"", ids[4])).unwrap()..];
        let row = &row[..row.find("</tr>").unwrap()];
        assert!(row.contains(">k1</td>") && row.contains("<td class=\"n\">1</td>"), "{row}");

        // One ordering key, and one that has none.
        let a = http(addr, "GET", "/events?topic=console.log&key=k1", &[], "").await;
        assert_eq!(row_ids(&a.body), [ids[1].to_string(), ids[4].to_string()]);
        assert!(a.body.contains("value=\"k1\""), "the form keeps the key: {}", a.body);
        let a = http(addr, "GET", "/events?topic=console.log&key=%3Ci%3E", &[], "").await;
        assert!(a.body.contains("No event of ordering key <strong>&lt;i&gt;</strong>"), "{}", a.body);

        // A topic that keeps nothing says how to keep it.
        for (topic, shown) in [("console.mail", "console.mail"), ("%3Cb%3Ex", "&lt;b&gt;x")] {
            let a = http(addr, "GET", &format!("/events?topic={topic}"), &[], "").await;
            assert_eq!(a.status, 200, "{}", a.body);
            assert!(a.body.contains("id=\"not-retained\""), "{}", a.body);
            assert!(
                a.body.contains(&format!("outbox events retain --topic {shown} --for 180d")),
                "{}",
                a.body
            );
            assert!(!a.body.contains("<b>x"), "{}", a.body);
        }

        // Addresses it cannot read: a 400 page saying why, escaped.
        let long = "t".repeat(65);
        for (path, says) in [
            ("/events?topic=console.log&after=nope".to_string(), "not an event id"),
            ("/events?topic=console.log&after=%3Cscript%3E".to_string(), "&lt;script&gt;"),
            (format!("/events?topic={long}"), "not a topic"),
            ("/events?topic=a%00b".to_string(), "not a topic"),
            ("/events?topic=console.log&key=a%00".to_string(), "NUL"),
            (format!("/events?after={}", ids[0]), "need a topic"),
            ("/events?key=k1".to_string(), "need a topic"),
            ("/events?topic=a&topic=b".to_string(), "at most once"),
        ] {
            let a = http(addr, "GET", &path, &[], "").await;
            assert_eq!(a.status, 400, "{path}: {}", a.body);
            assert!(a.body.contains("id=\"bad-request\"") && a.body.contains(says), "{path}: {}", a.body);
            assert!(!a.body.contains("<script>"), "{path}: {}", a.body);
        }

        // The replays, with their progress: none, then one that no worker runs yet, cancelled.
        let a = http(addr, "GET", "/events", &[], "").await;
        assert!(a.body.contains("id=\"no-replays\""), "{}", a.body);
        let replay = store
            .start_replay(&outbox::ReplayRequest::new("console.log", "accept"))
            .await
            .unwrap();
        let a = http(addr, "GET", "/events", &[], "").await;
        let row = &a.body[a.body.find(&format!("<tr data-replay=\"{}\"", replay.id)).unwrap()..];
        let row = &row[..row.find("</tr>").unwrap()];
        assert!(row.contains("<td>console.log</td><td>accept</td>"), "{row}");
        assert!(row.contains("<td class=\"state\">running</td>") && row.contains("0/7"), "{row}");
        store.cancel_replay(replay.id).await.unwrap();
        let a = http(addr, "GET", "/events", &[], "").await;
        assert!(a.body.contains("<td class=\"state\">cancelled</td>"), "{}", a.body);
    }
}

/// PostgreSQL: when a retained topic's day partitions run short (dropped by hand here), the
/// overview says so and links to the event log, which says which topic; an upkeep ends it.
#[tokio::test]
async fn the_overview_warns_when_the_event_log_runs_short_of_partitions() {
    let db = pg().await;
    let store = Store::from(&db.pool);
    store
        .declare_retention(&[("console.log", LOG_WINDOW)])
        .await
        .unwrap();
    let addr = serve(&db, ConsoleConfig::new()).await;
    let a = http(addr, "GET", "/", &[], "").await;
    assert!(!a.body.contains("event-log-runway"), "{}", a.body);

    assert_eq!(db.drop_future_log_days().await, 7, "seven days ahead");

    let a = http(addr, "GET", "/", &[], "").await;
    assert_eq!(a.status, 200, "{}", a.body);
    let notice = element_text(
        &a.body,
        "<div class=\"notice warn\" id=\"event-log-runway\"",
        "div",
    )
    .unwrap_or_else(|| panic!("no runway notice: {}", a.body));
    assert!(
        notice.contains("console.log") && notice.contains("more hours"),
        "{notice}"
    );
    let at = a.body.find("id=\"event-log-runway\"").unwrap();
    assert!(
        a.body[at..].contains("<a href=\"/events\">See the event log</a>"),
        "{}",
        a.body
    );
    let a = http(addr, "GET", "/events", &[], "").await;
    assert!(a.body.contains("id=\"runway\""), "{}", a.body);
    assert!(a.body.contains("partitions run short"), "{}", a.body);
    let a = http(addr, "GET", "/events?topic=console.log", &[], "").await;
    assert!(a.body.contains("id=\"runway\""), "{}", a.body);

    store.log_upkeep().await.unwrap().expect("the lock is free");
    let a = http(addr, "GET", "/", &[], "").await;
    assert!(!a.body.contains("event-log-runway"), "{}", a.body);
    let a = http(addr, "GET", "/events", &[], "").await;
    assert!(!a.body.contains("id=\"runway\""), "{}", a.body);
    db.drop_db().await;
}

// ---------------------------------------------------------------------------------------------
// In a browser

/// One browser at a time: two cores do not run several Chromiums well.
static BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A headless Chromium driven through a chromedriver on a free loopback port. Both end
/// when it is dropped, even when a test fails half-way.
struct Browser {
    client: Client,
    /// chromedriver, leader of a process group of its own that its Chromium joins.
    driver: tokio::process::Child,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Killing chromedriver alone would leave its Chromium running: end the whole group.
        if let Some(pid) = self.driver.id() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Whether `program` is on `PATH`.
fn installed(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

impl Browser {
    /// A browser; `None`, after saying so on the terminal, when Chromium or chromedriver is
    /// missing and the run does not require them (`OUTBOX_REQUIRE_BROWSER`, set by CI, makes a
    /// missing browser a failure, so CI can never pass these tests by skipping them).
    async fn start() -> Option<Browser> {
        let missing: Vec<&str> = ["chromium", "chromedriver"]
            .into_iter()
            .filter(|p| !installed(p))
            .collect();
        if !missing.is_empty() {
            let why = format!(
                "{} not on PATH: install them with `apt-get install chromium chromium-driver`",
                missing.join(" and ")
            );
            assert!(
                std::env::var_os("OUTBOX_REQUIRE_BROWSER").is_none(),
                "{why} (OUTBOX_REQUIRE_BROWSER is set, so this browser test may not be skipped)"
            );
            let test = std::thread::current()
                .name()
                .unwrap_or("a browser test")
                .to_string();
            // Past the test harness's capture, so that the skip shows even when the test passes.
            let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
            return None;
        }
        let turn = BROWSER.lock().await;
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let driver = tokio::process::Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver runs: apt-get install chromium chromium-driver");
        let url = format!("http://127.0.0.1:{port}");
        wait_until(
            Duration::from_secs(20),
            "chromedriver listens",
            async || TcpStream::connect(("127.0.0.1", port)).await.is_ok(),
        )
        .await;
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1280,800", "--hide-scrollbars", "--force-device-scale-factor=1",
                ],
            }),
        );
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&url)
            .await
            .expect("a WebDriver session");
        Some(Browser {
            client,
            driver,
            _turn: turn,
        })
    }

    async fn text(&self, css: &str) -> String {
        let found = self
            .client
            .wait()
            .at_most(Duration::from_secs(10))
            .for_element(Locator::Css(css))
            .await;
        match found {
            Ok(e) => e.text().await.unwrap(),
            Err(e) => {
                let url = self.client.current_url().await.unwrap();
                let page = self.client.source().await.unwrap_or_default();
                panic!("{css}: {e}\nat {url}:\n{page}")
            }
        }
    }

    /// Clicks the element once it is on the page: a click that navigates returns before the
    /// next page has loaded, so the next click waits for its element instead of failing.
    async fn click(&self, css: &str) {
        self.client
            .wait()
            .at_most(Duration::from_secs(10))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"))
            .click()
            .await
            .unwrap();
    }

    async fn count(&self, css: &str) -> usize {
        self.client.find_all(Locator::Css(css)).await.unwrap().len()
    }

    /// Saves a screenshot into `docs/` when `CONSOLE_SCREENSHOTS` is set.
    async fn screenshot(&self, name: &str) {
        if std::env::var_os("CONSOLE_SCREENSHOTS").is_none() {
            return;
        }
        let png = self.client.screenshot().await.unwrap();
        let path = format!("{}/../docs/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::create_dir_all(format!("{}/../docs", env!("CARGO_MANIFEST_DIR"))).unwrap();
        std::fs::write(&path, png).unwrap();
    }

    async fn close(self) {
        self.client.clone().close().await.unwrap();
    }
}

#[tokio::test]
async fn the_overview_shows_what_the_database_holds() {
    let db = pg().await;
    dead_mails(
        &db,
        &[
            mail("ana@example.com", "mailbox full"),
            mail("bo@example.com", "no such user"),
        ],
    )
    .await;
    dead_index(&db, 1).await;
    // Ready messages of a topic no worker serves, and one mail scheduled for later.
    let mut tx = db.pool.begin().await.unwrap();
    enqueue_many(&mut *tx, &(0..4).map(|n| Audit { n }).collect::<Vec<_>>())
        .await
        .unwrap();
    enqueue_with(
        &mut *tx,
        &mail("later@example.com", ""),
        &EnqueueOptions::new().delay(Duration::from_secs(3600)),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();

    let addr = serve(&db, ConsoleConfig::new()).await;
    let Some(b) = Browser::start().await else {
        return;
    };
    b.client.goto(&format!("http://{addr}/")).await.unwrap();
    let stats = Store::from(&db.pool).stats().await.unwrap();
    assert_eq!(stats.topics.len(), 3);
    for t in stats.topics.iter().chain([&stats.total]) {
        let row = format!("tr[data-topic='{}']", t.topic);
        for (class, want) in [
            ("ready", t.ready),
            ("scheduled", t.scheduled),
            ("in-flight", t.in_flight),
            ("stalled", t.stalled),
            ("dead", t.dead),
        ] {
            let got = b.text(&format!("{row} td.{class}")).await;
            assert_eq!(got, want.to_string(), "{} {class}", t.topic);
        }
    }
    assert_eq!(b.text("#total-ready").await, "4");
    assert_eq!(b.text("#total-scheduled").await, "1");
    assert_eq!(b.text("#total-dead").await, "3");
    let unserved = b.text("#unserved").await;
    assert!(unserved.contains("console.audit (4 ready)"), "{unserved}");
    assert!(!unserved.contains("console.mail"), "{unserved}");
    // The dead count leads to that topic's dead letters.
    b.click("tr[data-topic='console.mail'] td.dead a").await;
    b.text("#filters").await;
    assert_eq!(b.count("#dead tbody tr").await, 2);
    b.close().await;
    db.drop_db().await;
}

#[tokio::test]
async fn open_a_dead_letter_retry_it_and_see_it_leave_the_list() {
    let db = pg().await;
    let ids = dead_mails(
        &db,
        &[
            mail("ana@example.com", "mailbox full"),
            mail("bo@example.com", "no such user"),
            mail("cy@example.com", "greylisted"),
        ],
    )
    .await;
    let addr = serve(&db, ConsoleConfig::new()).await;
    let Some(b) = Browser::start().await else {
        return;
    };
    b.client.goto(&format!("http://{addr}/dead")).await.unwrap();
    assert_eq!(b.count("#dead tbody tr").await, 3);

    b.click(&format!("tr[data-id='{}'] a", ids[0])).await;
    assert_eq!(b.text("#message-id").await, ids[0].to_string());
    assert_eq!(b.text("#status").await, "dead");
    assert_eq!(b.text("#topic").await, "console.mail");
    assert_eq!(b.text("#attempts").await, "1");
    assert_eq!(
        b.text("#last-error").await,
        "handler `bounce`: 550 mailbox ana@example.com unavailable: mailbox full"
    );
    let payload = b.text("#payload").await;
    assert!(payload.starts_with("{\n  \""), "pretty-printed: {payload}");
    assert!(
        payload.contains("\n  \"to\": \"ana@example.com\""),
        "{payload}"
    );
    assert!(
        payload.contains("\n  \"note\": \"mailbox full\""),
        "{payload}"
    );
    b.click("#retry").await;
    assert_eq!(b.text("#confirm-title").await, "Retry 1 dead letter?");
    assert_eq!(
        status(&db, ids[0]).await.as_deref(),
        Some("dead"),
        "not before confirming"
    );
    b.click("#confirm").await;
    assert_eq!(
        b.text("#flash").await,
        "1 dead letter sent back to pending."
    );
    assert_eq!(b.count(&format!("tr[data-id='{}']", ids[0])).await, 0);
    assert_eq!(b.count("#dead tbody tr").await, 2);
    assert_eq!(status(&db, ids[0]).await.as_deref(), Some("pending"));

    // Select the rest with "select all" and retry the selection.
    b.click("#select-all").await;
    assert_eq!(b.text("#retry-selected").await, "Retry selected (2)");
    b.click("#retry-selected").await;
    assert_eq!(b.text("#confirm-title").await, "Retry 2 dead letters?");
    b.click("#confirm").await;
    assert_eq!(
        b.text("#flash").await,
        "2 dead letters sent back to pending."
    );
    assert_eq!(b.text("#no-dead").await, "No dead letters here.");
    for id in &ids {
        assert_eq!(status(&db, *id).await.as_deref(), Some("pending"));
    }
    b.close().await;
    db.drop_db().await;
}

#[tokio::test]
async fn discard_a_topics_dead_letters_through_the_confirmation() {
    let db = pg().await;
    let mails = dead_mails(
        &db,
        &[
            mail("a@example.com", "1"),
            mail("b@example.com", "2"),
            mail("c@example.com", "3"),
        ],
    )
    .await;
    let docs = dead_index(&db, 2).await;
    let addr = serve(&db, ConsoleConfig::new()).await;
    let Some(b) = Browser::start().await else {
        return;
    };
    b.client
        .goto(&format!("http://{addr}/dead?topic=console.mail"))
        .await
        .unwrap();
    assert_eq!(b.count("#dead tbody tr").await, 3);
    b.click("#discard-topic").await;
    assert_eq!(b.text("#confirm-title").await, "Discard 3 dead letters?");
    let says = b.text("#confirm-box").await;
    assert!(
        says.contains("Every dead letter of topic console.mail"),
        "{says}"
    );
    assert!(says.contains("cannot be undone"), "{says}");

    // Cancel first: nothing happens.
    b.click("#cancel").await;
    b.text("#filters").await;
    assert_eq!(b.count("#dead tbody tr").await, 3);
    b.click("#discard-topic").await;
    b.click("#confirm").await;
    assert_eq!(b.text("#flash").await, "3 dead letters discarded.");
    assert_eq!(b.text("#no-dead").await, "No dead letters here.");

    for id in mails {
        assert_eq!(status(&db, id).await, None);
    }
    for id in docs {
        assert_eq!(
            status(&db, id).await.as_deref(),
            Some("dead"),
            "other topics stay"
        );
    }
    b.close().await;
    db.drop_db().await;
}

#[tokio::test]
async fn a_script_in_a_payload_shows_as_text() {
    let db = pg().await;
    let evil = "<script>window.pwned=1;alert('pwned')</script><img src=x onerror=window.pwned=2>";
    let ids = dead_mails(&db, &[mail("<b>x</b>@example.com", evil)]).await;
    let addr = serve(&db, ConsoleConfig::new()).await;
    let Some(b) = Browser::start().await else {
        return;
    };
    for page in [format!("/messages/{}", ids[0]), "/dead".to_string()] {
        b.client
            .goto(&format!("http://{addr}{page}"))
            .await
            .unwrap();
        b.text("main h1").await;
        assert!(
            b.client.get_alert_text().await.is_err(),
            "no alert opened on {page}"
        );
        let pwned = b
            .client
            .execute("return typeof window.pwned", vec![])
            .await
            .unwrap();
        assert_eq!(pwned, "undefined", "nothing ran on {page}");
        assert_eq!(b.count("main script, main img, main b").await, 0, "{page}");
    }
    // The literal text is on the page.
    b.client
        .goto(&format!("http://{addr}/messages/{}", ids[0]))
        .await
        .unwrap();
    let payload = b.text("#payload").await;
    assert!(payload.contains(evil), "{payload}");
    assert!(payload.contains("<b>x</b>@example.com"), "{payload}");
    let error = b.text("#last-error").await;
    assert!(error.contains(evil), "{error}");
    b.close().await;
    db.drop_db().await;
}

#[tokio::test]
async fn read_only_shows_no_buttons() {
    let db = pg().await;
    let ids = dead_mails(&db, &[mail("a@example.com", "x")]).await;
    Store::from(&db.pool)
        .declare_retention(&[("console.log", LOG_WINDOW)])
        .await
        .unwrap();
    let addr = serve(&db, ConsoleConfig::new().read_only(true)).await;
    let Some(b) = Browser::start().await else {
        return;
    };
    for page in [
        "/".to_string(),
        "/dead".to_string(),
        format!("/messages/{}", ids[0]),
        "/workers".to_string(),
        "/events".to_string(),
        "/events?topic=console.log".to_string(),
    ] {
        b.client
            .goto(&format!("http://{addr}{page}"))
            .await
            .unwrap();
        assert_eq!(b.text("#read-only").await, "read-only", "{page}");
        // Only the filter's own button (a GET) is left.
        assert_eq!(b.count("button:not(#filter)").await, 0, "{page}");
        let text = b.text("main").await;
        assert!(
            !text.contains("Retry") && !text.contains("Discard"),
            "{page}: {text}"
        );
        assert_eq!(b.count("form[method=post]").await, 0, "{page}");
        assert_eq!(b.count("input[type=checkbox]").await, 0, "{page}");
    }
    b.client.goto(&format!("http://{addr}/dead")).await.unwrap();
    assert_eq!(
        b.count("#dead tbody tr").await,
        1,
        "the list is still there"
    );
    b.close().await;
    db.drop_db().await;
}

/// The overview and the dead-letter pages, deep ones included, of a database holding 2,000,000
/// done messages (as the per-minute counts that stay of them) and 100,000 dead letters: no
/// sequential scan of either table, and the time of each page printed (release builds answer in
/// a few milliseconds; the bound is 200 ms).
#[tokio::test]
async fn big_tables_are_read_through_their_indexes() {
    let db = pg().await;
    sqlx::raw_sql(
        "INSERT INTO outbox_done_counts (topic, minute, worker, done) \
         SELECT 'console.mail', date_trunc('minute', now()) - (i % 1440) * interval '1 minute', \
                gen_random_uuid(), 10 \
         FROM generate_series(1, 200000) AS i; \
         INSERT INTO outbox_dead (id, topic, payload, attempts, last_error, created_at, dead_at) \
         SELECT gen_random_uuid(), CASE WHEN i % 10 = 0 THEN 'console.index' ELSE 'console.mail' END, \
                '{\"to\": \"x@example.com\", \"note\": \"\"}', 8, 'mailbox full', \
                now() - interval '3 days', now() - interval '2 days' + i * interval '1 ms' \
         FROM generate_series(1, 100000) AS i;",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::raw_sql("VACUUM ANALYZE outbox_messages, outbox_dead, outbox_done_counts")
        .execute(&db.pool)
        .await
        .unwrap();
    // The console on one connection, whose statistics the test flushes to count its scans.
    let one = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&db.url)
        .await
        .unwrap();
    let scans = async || {
        db.seq_scans(&one, &["outbox_dead", "outbox_done_counts"])
            .await
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = console::router(&one, ConsoleConfig::new());
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });

    let before = scans().await;
    let mut timings = Vec::new();
    let mut get = async |path: &str| -> String {
        let started = std::time::Instant::now();
        let a = http(addr, "GET", path, &[], "").await;
        timings.push((path.to_owned(), started.elapsed()));
        assert_eq!(a.status, 200, "{path}: {}", a.body);
        a.body
    };
    let overview = get("/").await;
    assert!(overview.contains("100,000"), "the dead count is shown");
    let mut page = get("/dead").await;
    for _ in 0..3 {
        let at = page.find("id=\"next\"").expect("an Older link");
        let href = page[..at].rfind("href=\"").unwrap() + 6;
        let next = page[href..]
            .split('"')
            .next()
            .unwrap()
            .replace("&amp;", "&");
        page = get(&next).await;
    }
    get("/dead?topic=console.index").await;
    get("/dead?older_than=1d").await;
    get("/workers").await;
    let after = scans().await;
    for (path, took) in &timings {
        eprintln!("  {took:>10.1?}  GET {path}");
    }
    assert_eq!(
        after, before,
        "(outbox_dead, outbox_done_counts) sequential scans before and after the pages"
    );
    one.close().await;
    db.drop_db().await;
}

// ---------------------------------------------------------------------------------------------
// StayHub's data, for the README's screenshots

/// StayHub's `booking.created` (see the stayhub example).
#[outbox_event(topic = "booking.created")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct BookingCreated {
    booking_id: Uuid,
    property_id: i64,
    guest_email: String,
    check_in: String,
    check_out: String,
}

/// StayHub's `property.changed`.
#[outbox_event(topic = "property.changed")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct PropertyChanged {
    property_id: i64,
    version: i64,
    name: String,
    city: String,
    nightly_price: i64,
}

/// StayHub's confirmation email, whose provider refuses one address for good.
struct ConfirmationEmail;

#[outbox::async_trait]
impl Handler for ConfirmationEmail {
    type Event = BookingCreated;
    const NAME: &'static str = "confirmation-email";
    async fn handle(&self, b: BookingCreated, _: &Context) -> Result<(), HandlerError> {
        if b.guest_email.starts_with("frank") || b.guest_email.starts_with("grace") {
            // A slow provider: these two are in flight while the screenshot is taken.
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
        if b.guest_email.starts_with("erin") {
            return Err(HandlerError::permanent(format!(
                "the mail provider answered 550: mailbox {} does not exist",
                b.guest_email
            )));
        }
        Ok(())
    }
}

/// StayHub's guest record: always succeeds, so a message whose email died shows it done.
struct GuestRecord;

#[outbox::async_trait]
impl Handler for GuestRecord {
    type Event = BookingCreated;
    const NAME: &'static str = "guest-record";
    async fn handle(&self, _: BookingCreated, _: &Context) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// StayHub's property index.
struct PropertyIndexer;

#[outbox::async_trait]
impl Handler for PropertyIndexer {
    type Event = PropertyChanged;
    const NAME: &'static str = "property-index";
    async fn handle(&self, _: PropertyChanged, _: &Context) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// The console on StayHub's data: bookings and property edits handled, one confirmation email
/// dead (its mailbox does not exist), bookings still to handle and one scheduled; the
/// overview and that dead letter as the README shows them.
#[tokio::test]
async fn stayhub_in_the_console() {
    let db = pg().await;
    let booking = |n: u128, guest: &str, check_in: &str, check_out: &str| BookingCreated {
        booking_id: Uuid::from_u128(0x0193_0000_0000_7000_8000_0000_0000_0000 + n),
        property_id: 1 + (n % 3) as i64,
        guest_email: format!("{guest}@example.com"),
        check_in: check_in.into(),
        check_out: check_out.into(),
    };
    let mut tx = db.pool.begin().await.unwrap();
    let bookings = [
        booking(1, "alice", "2027-06-01", "2027-06-04"),
        booking(2, "bob", "2027-07-10", "2027-07-14"),
        booking(3, "dave", "2027-06-04", "2027-06-06"),
        booking(4, "erin", "2027-08-02", "2027-08-09"),
    ];
    let ids = enqueue_many(&mut *tx, &bookings).await.unwrap();
    let erin = ids[3];
    enqueue_many(
        &mut *tx,
        &[
            PropertyChanged {
                property_id: 2,
                version: 2,
                name: "Old Town Flat".into(),
                city: "Porto".into(),
                nightly_price: 95,
            },
            PropertyChanged {
                property_id: 3,
                version: 2,
                name: "Garden Studio".into(),
                city: "Braga".into(),
                nightly_price: 75,
            },
        ],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let worker = Worker::builder(&db.pool)
        .handler(ConfirmationEmail)
        .handler(GuestRecord)
        .handler(PropertyIndexer)
        .config(outbox::WorkerConfig::default().shutdown_timeout(Duration::from_secs(1)))
        .build()
        .unwrap();
    worker.run_once().await.unwrap();
    // Bookings made since, not handled yet, and a reminder due tomorrow.
    let mut tx = db.pool.begin().await.unwrap();
    enqueue_many(
        &mut *tx,
        &[
            booking(5, "frank", "2027-09-01", "2027-09-03"),
            booking(6, "grace", "2027-09-12", "2027-09-19"),
        ],
    )
    .await
    .unwrap();
    enqueue_with(
        &mut *tx,
        &booking(7, "heidi", "2027-10-01", "2027-10-05"),
        &EnqueueOptions::new().delay(Duration::from_secs(86_400)),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();

    // The hour before: the per-minute done counts earlier workers left (a morning rush).
    sqlx::raw_sql(
        "INSERT INTO outbox_done_counts (topic, minute, worker, done) \
         SELECT t, date_trunc('minute', now()) - m * interval '1 minute', gen_random_uuid(), \
                (CASE WHEN t = 'booking.created' THEN 40 ELSE 12 END) \
                  + ((m * 37) % 23) + (60 - m) * (CASE WHEN t = 'booking.created' THEN 2 ELSE 0 END) \
         FROM generate_series(1, 59) AS m, unnest(ARRAY['booking.created', 'property.changed']) AS t",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    // A worker at work on the new bookings (its mail provider is slow today).
    let (stop, running) = start(worker);
    wait_for_topic(&db, "the new bookings in flight", "booking.created", |t| {
        t.in_flight == 2 && t.live_workers == 1
    })
    .await;

    let addr = serve(&db, ConsoleConfig::new()).await;
    let Some(b) = Browser::start().await else {
        return;
    };
    b.client.goto(&format!("http://{addr}/")).await.unwrap();
    assert_eq!(
        b.text("tr[data-topic='booking.created'] td.in-flight")
            .await,
        "2"
    );
    assert_eq!(
        b.text("tr[data-topic='booking.created'] td.scheduled")
            .await,
        "1"
    );
    assert_eq!(
        b.text("tr[data-topic='booking.created'] td.dead").await,
        "1"
    );
    let chart = b.text("#throughput .label").await;
    assert!(chart.contains("peak"), "{chart}");
    b.screenshot("console-overview.png").await;
    b.client
        .goto(&format!("http://{addr}/messages/{erin}"))
        .await
        .unwrap();
    assert_eq!(b.text("#topic").await, "booking.created");
    assert!(b
        .text("#last-error")
        .await
        .contains("erin@example.com does not exist"));
    assert!(b.text("#handlers-done").await.starts_with("guest-record"));
    assert!(b.text("#idempotency-key").await.starts_with("none"));
    b.screenshot("console-dead-letter.png").await;
    b.close().await;
    let _ = stop.send(());
    let _ = running.await;
    db.drop_db().await;
}
