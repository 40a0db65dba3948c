//! A Prometheus `/metrics` endpoint and a `/health` endpoint for a worker: served on an address
//! of their own ([`serve`]), or mounted in your axum app ([`router`]).
//!
//! ```no_run
//! # async fn run(worker: outbox::Worker) -> Result<(), Box<dyn std::error::Error>> {
//! use outbox::observe;
//!
//! let prometheus = observe::install_prometheus()?;
//! let server = observe::serve("127.0.0.1:9464".parse()?, prometheus, worker.health()).await?;
//! println!("metrics and health on http://{}", server.local_addr());
//! # Ok(()) }
//! ```

use std::net::SocketAddr;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusBuilder;

pub use crate::health::Health;
/// Why [`install_prometheus`] failed: another global recorder is installed.
pub use metrics_exporter_prometheus::BuildError;
/// The handle [`install_prometheus`] returns and [`serve`] and [`router`] render, re-exported
/// so that an application can keep it (in its own state, say) without depending on
/// `metrics-exporter-prometheus` itself; `render()` gives the metrics page as text.
pub use metrics_exporter_prometheus::PrometheusHandle;

/// The address metrics and health bind to unless configured otherwise: loopback only.
pub const DEFAULT_ADDR: &str = "127.0.0.1:9464";

/// Installs a Prometheus recorder as the global `metrics` recorder and describes every outbox
/// metric.
///
/// # Errors
///
/// When a global recorder is already installed.
pub fn install_prometheus() -> Result<PrometheusHandle, BuildError> {
    let handle = PrometheusBuilder::new().install_recorder()?;
    crate::metrics::describe();
    Ok(handle)
}

/// A running metrics and health server.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    /// The address it listens on (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the server.
    pub fn shutdown(self) {
        self.task.abort();
    }
}

#[derive(Clone)]
struct AppState {
    prometheus: PrometheusHandle,
    health: Health,
}

/// Serves `GET /metrics` (Prometheus text) and `GET /health` (200 `ok`, or 503 with the reason)
/// on `addr`, in a background task.
///
/// # Errors
///
/// When the address cannot be bound.
///
/// # Cancellation safety
///
/// Cancellation safe: dropping the future before it returns binds nothing.
pub async fn serve(
    addr: SocketAddr,
    prometheus: PrometheusHandle,
    health: Health,
) -> std::io::Result<Server> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let app = router(prometheus, health);
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics server stopped");
        }
    });
    Ok(Server { addr, task })
}

/// `GET /metrics` and `GET /health`, as [`serve`] answers them, as a router to mount in your
/// own axum app (beside your routes, or nested under a prefix) instead of a server of its own.
/// It is an axum 0.8 `Router`: your app needs the same axum version.
///
/// ```no_run
/// # async fn run(worker: outbox::Worker) -> Result<(), Box<dyn std::error::Error>> {
/// use outbox::observe;
///
/// let prometheus = observe::install_prometheus()?;
/// let app = axum::Router::new()
///     .route("/", axum::routing::get(|| async { "my service" }))
///     .nest("/outbox", observe::router(prometheus, worker.health())); // /outbox/metrics, /outbox/health
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
/// axum::serve(listener, app).await?;
/// # Ok(()) }
/// ```
pub fn router(prometheus: PrometheusHandle, health: Health) -> Router {
    Router::new()
        .route("/metrics", get(metrics_page))
        .route("/health", get(health_page))
        .with_state(AppState { prometheus, health })
}

async fn metrics_page(State(s): State<AppState>) -> String {
    s.prometheus.render()
}

/// `ok` (200) or `unhealthy: ...` (503), then one line per pause in force, with its age: a
/// pause is not unhealthy, but an operator looking at a quiet worker should see it.
async fn health_page(State(s): State<AppState>) -> (StatusCode, String) {
    let (status, mut body) = match s.health.check() {
        Ok(()) => (StatusCode::OK, "ok\n".to_string()),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("unhealthy: {reason}\n"),
        ),
    };
    for (target, age) in s.health.pauses() {
        body.push_str(&format!("paused: {target} for {}s\n", age.as_secs()));
    }
    (status, body)
}
