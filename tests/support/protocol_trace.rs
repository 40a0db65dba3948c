//! Records the worker protocol's events (`tracing` target `outbox::protocol`, see
//! `outbox-core/src/worker/protocol.rs`) as JSON lines in the file named by
//! [`ENV`], for the check of a run against the protocol's model (`tests/model`).

use std::fmt;
use std::fs::File;
use std::io::Write;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// The environment variable naming the file to write.
pub const ENV: &str = "OUTBOX_PROTOCOL_TRACE";
/// The target of the protocol events.
pub const TARGET: &str = "outbox::protocol";

/// Writes each protocol event as one line: `t` (microseconds since the Unix epoch) and the
/// event's fields. Each line goes to the file in one write, so a process killed mid-run leaves
/// whole lines (and at most a last one cut short).
struct Recorder {
    file: Mutex<File>,
}

#[derive(Default)]
struct Fields(serde_json::Map<String, serde_json::Value>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
}

impl<S: tracing::Subscriber> Layer<S> for Recorder {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut fields = Fields::default();
        let micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        fields.0.insert("t".into(), micros.into());
        event.record(&mut fields);
        let mut line = serde_json::Value::Object(fields.0).to_string();
        line.push('\n');
        let mut file = self
            .file
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let _ = file.write_all(line.as_bytes());
    }
}

/// When [`ENV`] names a file: installs the global subscriber, the usual log to stderr
/// (`RUST_LOG`, default `default_log`) plus the recorder of the protocol events, and returns
/// true. A later `outbox::cli::init_logging` then leaves it in place.
///
/// # Panics
///
/// When the file cannot be created.
pub fn install(default_log: &str) -> bool {
    let Some(path) = std::env::var_os(ENV) else {
        return false;
    };
    let file = File::options()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("cannot open the protocol trace {path:?}: {e}"));
    let log = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_log));
    let recorder = Recorder {
        file: Mutex::new(file),
    }
    .with_filter(EnvFilter::new(format!("{TARGET}=debug")));
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(log),
        )
        .with(recorder)
        .init();
    true
}
