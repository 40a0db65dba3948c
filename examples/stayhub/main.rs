//! StayHub: a small booking service on the transactional outbox, end to end.
//!
//! Run with `cargo run -p outbox-examples --example stayhub` (SQLite, nothing to install), or
//! with `DATABASE_URL=postgres://...` for PostgreSQL. Set `SEARCH_URL` to an Elasticsearch or
//! OpenSearch server to index there; otherwise the demo starts a stand-in index of its own.
//!
//! What it shows:
//! - a booking and its `booking.created` event commit together; a double booking is refused by
//!   the database and its event is rolled back with it, so no one is emailed about it;
//! - a worker writes confirmation emails into `notifications/` (one file per booking, named by
//!   the idempotency key, so a redelivery rewrites the same file) and keeps a search index of
//!   properties; one email fails once on purpose and succeeds on its retry;
//! - where the outbox does not reach: a property edit updates the index inline after the
//!   commit, and only when that fails enqueues `property.changed` in a second transaction;
//! - with `NATS_URL` set (e.g. `127.0.0.1:4222`, JetStream enabled), `booking.created` is also
//!   relayed to the JetStream stream `STAYHUB` (subject `stayhub.booking.created`), where the
//!   `stayhub_consumer` example consumes it through an inbox, as another service would;
//! - with `--features opentelemetry`, each booking runs in a traced request span whose trace
//!   the worker continues: the trace id is printed beside the booking and beside its email.

mod db;
mod events;
mod search_standin;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::NaiveDate;
use outbox::{
    Context, Handler, HandlerError, ReplayState, RetryPolicy, Start, Worker, WorkerConfig,
};
use outbox_handlers::async_nats::{self, jetstream};
use outbox_handlers::email::{Email, EmailHandler, EmailMapping, FileTransport};
use outbox_handlers::relay::nats::NatsPublisher;
use outbox_handlers::search::{Applied, IndexOp, SearchClient, SearchHandler, SearchMapping};
use tracing::Instrument;

use db::{Booked, Db, NewBooking, Property};
use events::{BookingCreated, PropertyChanged};

/// Attempts of StayHub's handlers after a message's first: the retries. (A done message is
/// deleted from the outbox, its attempts with it, so the handlers count them.)
static RETRIES: AtomicUsize = AtomicUsize::new(0);

fn count_retry(ctx: &Context) {
    if ctx.attempt() > 1 {
        RETRIES.fetch_add(1, Ordering::Relaxed);
    }
}

/// The booking confirmation. It fails once on purpose for Alice, to show a retry.
struct ConfirmationEmail;

impl EmailMapping for ConfirmationEmail {
    type Event = BookingCreated;
    const NAME: &'static str = "confirmation-email";

    fn email(&self, e: &BookingCreated, ctx: &Context) -> Result<Email, HandlerError> {
        count_retry(ctx);
        if e.guest_email.starts_with("alice") && ctx.attempt() == 1 {
            return Err(HandlerError::retry(
                "the mail provider is briefly unavailable (failed on purpose by the demo)",
            ));
        }
        // The email's trace is the booking request's (feature `opentelemetry`).
        if let Some(trace_id) = ctx.trace_context().and_then(|t| t.trace_id()) {
            println!("  emailed    {:<22} trace {trace_id}", e.guest_email);
        }
        let text = format!(
            "Your stay at property {} from {} to {} is confirmed.\nBooking {}",
            e.property_id, e.check_in, e.check_out, e.booking_id
        );
        Ok(Email::new(&e.guest_email, "Your StayHub booking", text))
    }
}

/// Keeps the `properties` index up to date from `property.changed`.
/// Nights booked per property: derived data that a later release adds. It starts at the
/// beginning of `booking.created`'s event log, so it counts the bookings made before it existed.
#[derive(Clone, Default)]
struct NightsPerProperty(Arc<Mutex<BTreeMap<i64, i64>>>);

#[outbox::async_trait]
impl Handler for NightsPerProperty {
    type Event = BookingCreated;
    const NAME: &'static str = "nights-per-property";
    const START: Start = Start::Beginning;

    async fn handle(&self, b: BookingCreated, _ctx: &Context) -> Result<(), HandlerError> {
        let nights = (b.check_out - b.check_in).num_days();
        let mut all = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *all.entry(b.property_id).or_default() += nights;
        Ok(())
    }
}

struct PropertyIndexer;

impl SearchMapping for PropertyIndexer {
    type Event = PropertyChanged;
    const NAME: &'static str = "property-index";

    fn index_op(&self, e: &PropertyChanged, ctx: &Context) -> Result<IndexOp, HandlerError> {
        count_retry(ctx);
        Ok(IndexOp::Upsert {
            id: e.property_id.to_string(),
            version: u64::try_from(e.version).map_err(HandlerError::permanent)?,
            document: serde_json::json!({ "name": e.name, "city": e.city, "nightly_price": e.nightly_price }),
        })
    }
}

fn upsert(p: &Property) -> IndexOp {
    IndexOp::Upsert {
        id: p.id.to_string(),
        version: u64::try_from(p.version).unwrap_or(0),
        document: serde_json::json!({ "name": p.name, "city": p.city, "nightly_price": p.nightly_price }),
    }
}

fn date(y: i32, m: u32, d: u32) -> anyhow::Result<NaiveDate> {
    NaiveDate::from_ymd_opt(y, m, d).ok_or_else(|| anyhow::anyhow!("bad date {y}-{m}-{d}"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_tracing();

    let db = Db::open().await?;
    outbox::migrate(db.store()).await?;
    db.reset().await?;
    println!("StayHub on {}", db.describe());

    let notifications = PathBuf::from("notifications");
    if notifications.exists() {
        std::fs::remove_dir_all(&notifications)?;
    }
    let (search_url, search_name) = match std::env::var("SEARCH_URL") {
        Ok(url) => (url.clone(), format!("the search server at {url}")),
        Err(_) => {
            let addr = search_standin::start().await?;
            (format!("http://{addr}"), format!("a stand-in index started by the demo at http://{addr} (not Elasticsearch; set SEARCH_URL for a real one)"))
        }
    };
    let index = SearchClient::builder()
        .base_url(&search_url)
        .index("properties")
        .timeout(Duration::from_secs(2))
        .build()?;

    // Properties, indexed inline as they are created.
    let mut indexed = 0;
    let mut properties = Vec::new();
    for (name, city, price) in [
        ("Harbour Loft", "Lisbon", 120),
        ("Old Town Flat", "Porto", 90),
        ("Garden Studio", "Braga", 70),
    ] {
        let p = db.add_property(name, city, price).await?;
        let applied = index
            .apply("properties", &upsert(&p))
            .await
            .map_err(|e| anyhow::anyhow!("indexing {}: {e}", p.name))?;
        if applied == Applied::Written {
            indexed += 1;
        }
        properties.push(p);
    }

    // With NATS_URL, booking.created also goes to JetStream for other services.
    let nats = match std::env::var("NATS_URL") {
        Ok(url) => Some(relay_to(&url).await?),
        Err(_) => None,
    };

    // The worker, inside this process here; a real service runs it as its own binary too.
    let mut worker = Worker::builder(db.store());
    if let Some(nats) = &nats {
        worker = worker.handler(nats.relay::<BookingCreated>());
    }
    let worker = worker
        .handler(EmailHandler::new(
            FileTransport::new(&notifications)?.from("bookings@stayhub.example"),
            ConfirmationEmail,
        ))
        .handler(SearchHandler::new(index.clone(), PropertyIndexer)?)
        .config(
            WorkerConfig::default()
                .poll_interval(Duration::from_millis(50))
                .handler_timeout(Duration::from_secs(5))
                .lease(Duration::from_secs(30))
                .retry(
                    RetryPolicy::default()
                        .base(Duration::from_millis(300))
                        .max_delay(Duration::from_secs(2)),
                ),
        )
        .build()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn({
        let worker = worker.clone();
        async move {
            worker
                .run_until(async {
                    let _ = stopped.await;
                })
                .await
        }
    });

    // Bookings. Bob and Carol race for the same nights; the database lets one win.
    let (mut made, mut rejected) = (0, 0);
    let mut report = |who: &str, (b, trace): (Booked, Option<String>)| match b {
        Booked::Confirmed(id) => {
            made += 1;
            let trace = trace.map(|t| format!("; trace {t}")).unwrap_or_default();
            println!("  booked     {who:<22} booking {id}; its event committed with it{trace}");
        }
        Booked::Rejected => {
            rejected += 1;
            println!("  rejected   {who:<22} double booking refused by the database; its event rolled back with it");
        }
    };
    println!("\nbookings:");
    let alice = NewBooking {
        property_id: properties[0].id,
        guest_email: "alice@example.com",
        check_in: date(2027, 6, 1)?,
        check_out: date(2027, 6, 4)?,
    };
    report("alice (Harbour Loft)", book(&db, &alice).await?);
    let bob = NewBooking {
        property_id: properties[1].id,
        guest_email: "bob@example.com",
        check_in: date(2027, 7, 10)?,
        check_out: date(2027, 7, 14)?,
    };
    let carol = NewBooking {
        property_id: properties[1].id,
        guest_email: "carol@example.com",
        check_in: date(2027, 7, 12)?,
        check_out: date(2027, 7, 15)?,
    };
    let (b, c) = tokio::join!(book(&db, &bob), book(&db, &carol));
    report("bob (Old Town Flat)", b?);
    report("carol (Old Town Flat)", c?);
    let dave = NewBooking {
        property_id: properties[0].id,
        guest_email: "dave@example.com",
        check_in: date(2027, 6, 4)?,
        check_out: date(2027, 6, 6)?,
    };
    report("dave (Harbour Loft)", book(&db, &dave).await?);

    // Property edits: the index is updated inline after the commit. The second edit meets a
    // (simulated) search outage, so it falls back to the outbox in a second transaction.
    println!("\nproperty edits:");
    let outage = SearchClient::builder()
        .base_url("http://127.0.0.1:9")
        .index("properties")
        .timeout(Duration::from_secs(1))
        .build()?;
    for (property, price, client, note) in [
        (&properties[2], 75, &index, ""),
        (&properties[1], 95, &outage, " (simulated outage)"),
    ] {
        let p = db.set_price(property.id, price).await?;
        match client.apply("properties", &upsert(&p)).await {
            Ok(_) => {
                indexed += 1;
                println!(
                    "  {:<22} price {price}: index updated inline after the commit",
                    p.name
                );
            }
            Err(e) => {
                let event = PropertyChanged {
                    property_id: p.id,
                    version: p.version,
                    name: p.name.clone(),
                    city: p.city.clone(),
                    nightly_price: p.nightly_price,
                };
                let id = db.enqueue_property_changed(&event).await?;
                println!("  {:<22} price {price}: inline update failed{note} ({e}); enqueued property.changed {id}", p.name);
            }
        }
    }

    // Wait for the worker to drain StayHub's messages.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stats = db.store().stats().await?;
        let ours =
            |t: &&outbox::TopicStats| t.topic == "booking.created" || t.topic == "property.changed";
        if stats.topics.iter().filter(ours).all(|t| t.pending() == 0) {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the worker did not drain the queue in 30 s: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop.send(());
    running.await??;
    let through_outbox = written_by_worker(&index, &properties[1]).await;

    // The next release adds a handler that starts at the beginning of the event log: its
    // first worker backfills it with the bookings made before it existed.
    println!("\nlater release:");
    let nights = NightsPerProperty::default();
    let late = Worker::builder(db.store())
        .handler(nights.clone())
        .config(WorkerConfig::default().poll_interval(Duration::from_millis(50)))
        .build()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let ended = Arc::new(Mutex::new(None));
    let store = db.store();
    late.run_until({
        let ended = ended.clone();
        async move {
            while Instant::now() < deadline {
                let replays = store.replays().await.unwrap_or_default();
                if let Some(r) = replays
                    .into_iter()
                    .find(|r| r.state != ReplayState::Running)
                {
                    *ended
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(r);
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    })
    .await?;
    let replay = ended
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take()
        .ok_or_else(|| anyhow::anyhow!("the backfill did not end in 30 s"))?;
    let counted = nights
        .0
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    println!(
        "  nights-per-property, deployed after the bookings, caught up on {} of them through its backfill replay {}",
        replay.delivered, replay.id
    );
    for p in &properties {
        if let Some(n) = counted.get(&p.id) {
            println!("    {:<22} {n} nights booked", p.name);
        }
    }

    // The summary.
    let stats = db.store().stats().await?;
    let (bookings, booking_events) = db.booking_counts().await?;
    let emails = count_files(&notifications)?;
    println!("\nsummary:");
    println!("  bookings         {made} made, {rejected} rejected; {bookings} booking rows and {booking_events} booking.created events (the rejected one left neither)");
    println!(
        "  emails           {emails} written to {}/ (one file per idempotency key)",
        notifications.display()
    );
    println!("  search index     {indexed} writes inline (3 new properties, 1 edit), {through_outbox} through the outbox (the edit whose inline update failed)");
    println!("                   on {search_name}");
    println!(
        "  retries          {} (the confirmation email that failed once on purpose)",
        RETRIES.load(Ordering::Relaxed)
    );
    match &nats {
        Some(_) => println!(
            "  relay            {made} booking.created published to JetStream stream {STREAM} \
             (subject stayhub.booking.created); consume them as another service would with\n\
             \x20                  DATABASE_URL=postgres://... cargo run -p outbox-examples --example stayhub_consumer"
        ),
        None => println!(
            "  relay            off: with NATS_URL=127.0.0.1:4222 (JetStream enabled) booking.created is also \
             published to JetStream"
        ),
    }
    println!("  dead letters     {}", stats.total.dead);
    println!("\nqueue:");
    outbox::cli::print_stats(&stats, None, false);
    Ok(())
}

/// Logs to stderr at `RUST_LOG` (errors only by default). With the `opentelemetry` feature, every
/// span is also recorded by an OpenTelemetry tracer, so that bookings have trace ids; add an
/// exporter to the provider to send them to a collector (see the README).
fn init_tracing() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| "error".into());
    let logs = tracing_subscriber::fmt::layer()
        .with_target(false)
        .with_filter(tracing_subscriber::EnvFilter::new(filter));
    #[cfg(feature = "opentelemetry")]
    let traces = {
        use opentelemetry::trace::TracerProvider as _;
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        Some(tracing_opentelemetry::layer().with_tracer(provider.tracer("stayhub")))
    };
    #[cfg(not(feature = "opentelemetry"))]
    let traces: Option<tracing_subscriber::layer::Identity> = None;
    tracing_subscriber::registry()
        .with(logs)
        .with(traces)
        .init();
}

/// Books `b` in the span of the request that asks for it, and returns the result with the
/// request's trace id (when traced).
async fn book(db: &Db, b: &NewBooking<'_>) -> anyhow::Result<(Booked, Option<String>)> {
    let request = tracing::info_span!("POST /bookings", otel.kind = "server");
    let trace_id = outbox::trace::TraceContext::of_span(&request)
        .and_then(|t| t.trace_id().map(str::to_string));
    let booked = db.book(b).instrument(request).await?;
    Ok((booked, trace_id))
}

/// 1 when the index holds the property at its latest version (written by the worker), else 0.
async fn written_by_worker(index: &SearchClient, p: &Property) -> usize {
    // Replaying the older version must be refused as stale if the worker wrote the newer one.
    match index.apply("properties", &upsert(p)).await {
        Ok(Applied::Stale) => 1,
        _ => 0,
    }
}

fn count_files(dir: &Path) -> std::io::Result<usize> {
    if !dir.exists() {
        return Ok(0);
    }
    Ok(std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .count())
}

/// The JetStream stream StayHub relays `booking.created` into.
const STREAM: &str = "STAYHUB";

/// Connects to NATS at `url` and makes sure the stream exists; the relay publishes to
/// `stayhub.{topic}`.
async fn relay_to(url: &str) -> anyhow::Result<NatsPublisher> {
    let client = async_nats::connect(url)
        .await
        .map_err(|e| anyhow::anyhow!("NATS_URL={url}: cannot connect ({e})"))?;
    let js = jetstream::new(client);
    js.get_or_create_stream(jetstream::stream::Config {
        name: STREAM.into(),
        subjects: vec!["stayhub.>".into()],
        ..Default::default()
    })
    .await
    .map_err(|e| {
        anyhow::anyhow!("NATS_URL={url}: cannot create stream {STREAM} (is JetStream on?): {e}")
    })?;
    Ok(NatsPublisher::builder(js).prefix("stayhub").build()?)
}
