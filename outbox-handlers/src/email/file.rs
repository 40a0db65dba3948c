//! [`FileTransport`]: one JSON file per email, for development and demos.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use outbox::HandlerError;
use serde::Serialize;

use super::{Email, EmailTransport};
use crate::config::ConfigError;

/// The longest file-name stem taken from a key; longer keys are cut and get a hash.
const MAX_STEM: usize = 120;

/// Writes each email as a JSON file in a directory instead of sending it.
///
/// The file is named from the idempotency key, sanitized to a safe file name
/// (see [`file_name`](Self::file_name)), and written atomically: a temporary file in the same
/// directory, then a rename. A redelivered message rewrites the same file, so the directory holds
/// one file per email however often it was delivered, and a reader never sees half a file.
///
/// ```
/// use outbox_handlers::email::{Email, EmailTransport, FileTransport};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = std::env::temp_dir().join(format!("outbox-mail-doc-{}", std::process::id()));
/// let transport = FileTransport::new(&dir)?.from("demo@stayhub.example");
/// let email = Email::new("guest@example.com", "Hello", "Hi there");
/// transport.send(&email, "booking-42:welcome").await.map_err(|e| e.to_string())?;
/// transport.send(&email, "booking-42:welcome").await.map_err(|e| e.to_string())?; // a redelivery
/// assert_eq!(std::fs::read_dir(&dir)?.count(), 1);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct FileTransport {
    dir: PathBuf,
    from: Option<String>,
}

#[derive(Serialize)]
struct Record<'a> {
    idempotency_key: &'a str,
    from: Option<&'a str>,
    to: &'a [String],
    subject: &'a str,
    text: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    html: Option<&'a str>,
}

impl FileTransport {
    /// A transport writing into `dir`, which is created if it does not exist.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Invalid`] for `email.dir` when the directory cannot be created or is a
    /// file.
    pub fn new(dir: impl Into<PathBuf>) -> Result<Self, ConfigError> {
        let dir = dir.into();
        if dir.as_os_str().is_empty() {
            return Err(ConfigError::invalid(
                "email.dir",
                "the directory is empty",
                "",
            ));
        }
        fs::create_dir_all(&dir).map_err(|e| {
            ConfigError::invalid(
                "email.dir",
                format!("cannot create the directory: {e}"),
                &dir.display().to_string(),
            )
        })?;
        Ok(FileTransport { dir, from: None })
    }

    /// Sets the default sender, written for emails that do not set one.
    pub fn from(mut self, from: impl Into<String>) -> Self {
        self.from = Some(from.into());
        self
    }

    /// The directory emails are written to.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of the file for an idempotency key.
    pub fn path_for(&self, idempotency_key: &str) -> PathBuf {
        self.dir.join(Self::file_name(idempotency_key))
    }

    /// The file name for an idempotency key: the key with every character other than ASCII
    /// letters, digits, `-`, `_` and `.` replaced by `_` (and a leading `.` too), plus `.json`.
    /// When that changed the key or cut it (at 120 characters), a hash of the whole key is added,
    /// so two keys never share a file.
    ///
    /// ```
    /// use outbox_handlers::email::FileTransport;
    ///
    /// assert_eq!(FileTransport::file_name("booking-42.welcome"), "booking-42.welcome.json");
    /// let name = FileTransport::file_name("0190a3c4-1111-7000-8000-000000000000:email");
    /// assert!(name.starts_with("0190a3c4-1111-7000-8000-000000000000_email-"));
    /// assert_ne!(FileTransport::file_name("a:b"), FileTransport::file_name("a/b"));
    /// assert!(!FileTransport::file_name("../../etc/passwd").contains('/'));
    /// ```
    pub fn file_name(idempotency_key: &str) -> String {
        let mut stem: String = idempotency_key
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        if stem.starts_with('.') {
            stem.replace_range(0..1, "_");
        }
        let exact = stem == idempotency_key && !stem.is_empty() && stem.len() <= MAX_STEM;
        stem.truncate(MAX_STEM); // ASCII only: any index is a char boundary
        if !exact {
            if !stem.is_empty() {
                stem.push('-');
            }
            stem.push_str(&format!("{:016x}", fnv1a(idempotency_key.as_bytes())));
        }
        stem.push_str(".json");
        stem
    }
}

#[async_trait]
impl EmailTransport for FileTransport {
    async fn send(&self, email: &Email, idempotency_key: &str) -> Result<(), HandlerError> {
        let record = Record {
            idempotency_key,
            from: email.from.as_deref().or(self.from.as_deref()),
            to: &email.to,
            subject: &email.subject,
            text: &email.text,
            html: email.html.as_deref(),
        };
        let mut bytes = serde_json::to_vec_pretty(&record).map_err(HandlerError::permanent)?;
        bytes.push(b'\n');
        let dir = self.dir.clone();
        let name = Self::file_name(idempotency_key);
        let path = tokio::task::spawn_blocking(move || write_atomic(&dir, &name, &bytes))
            .await
            .map_err(|e| HandlerError::retry(format!("the file writer task failed: {e}")))?
            .map_err(|e| {
                HandlerError::retry(FileError {
                    dir: self.dir.clone(),
                    source: e,
                })
            })?;
        tracing::debug!(idempotency_key, path = %path.display(), "email written to a file");
        Ok(())
    }
}

/// An email file could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot write the email file in `{}`", dir.display())]
struct FileError {
    dir: PathBuf,
    #[source]
    source: std::io::Error,
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Writes `bytes` to `dir/name` through a temporary file in `dir` and a rename.
fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<PathBuf> {
    fs::create_dir_all(dir)?;
    let target = dir.join(name);
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let temp = dir.join(format!(".{name}.{}.{n}.tmp", std::process::id()));
    let written = (|| {
        let mut file = fs::File::create_new(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&temp, &target)
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&temp);
        return Err(e);
    }
    #[cfg(unix)]
    if let Ok(d) = fs::File::open(dir) {
        // Make the rename itself durable; best effort.
        let _ = d.sync_all();
    }
    Ok(target)
}

/// FNV-1a, 64 bits: a hash of the idempotency key that is the same on every build and
/// platform, so a retry finds the file its first attempt wrote.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h: u64, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_are_safe_and_distinct() {
        assert_eq!(FileTransport::file_name("abc"), "abc.json");
        for key in [
            "",
            ".",
            "..",
            "../x",
            "a/b",
            "a\\b",
            "ключ",
            "a b",
            &"x".repeat(300),
        ] {
            let name = FileTransport::file_name(key);
            assert!(!name.starts_with('.'), "{key:?} -> {name}");
            assert!(name.len() <= MAX_STEM + 1 + 16 + 5, "{key:?} -> {name}");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')),
                "{key:?} -> {name}"
            );
        }
        assert_ne!(
            FileTransport::file_name("a:b"),
            FileTransport::file_name("a_b")
        );
        assert_ne!(
            FileTransport::file_name(&format!("{}1", "x".repeat(200))),
            FileTransport::file_name(&format!("{}2", "x".repeat(200)))
        );
    }

    #[test]
    fn a_rewrite_replaces_the_file_and_leaves_no_temp_file() {
        let dir = std::env::temp_dir().join(format!(
            "outbox-handlers-file-{}-{}",
            std::process::id(),
            uuid::Uuid::now_v7().simple()
        ));
        let p = write_atomic(&dir, "k.json", b"one").unwrap();
        write_atomic(&dir, "k.json", b"two").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
        fs::remove_dir_all(&dir).unwrap();
    }
}
