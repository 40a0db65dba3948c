//! Which PostgreSQL the tests use, and a throwaway server when none runs.
//!
//! 1. `DATABASE_URL`, when set, always wins.
//! 2. Else the local test server, `postgres://postgres@127.0.0.1:5432/test`, when something
//!    listens on that port.
//! 3. Else, when PostgreSQL is installed (`initdb` and `pg_ctl`, found in
//!    `OUTBOX_TEST_PG_BIN`, then `pg_config --bindir`, then `PATH`), one server per test
//!    binary is started in a temporary directory on a free loopback port, with trust
//!    authentication and fsync off, and stopped (its directory removed) when the test process
//!    ends, by a small watcher process.
//! 4. Else the local test server's URL, so the tests fail as before: "cannot connect to
//!    PostgreSQL at ...; start it or set DATABASE_URL".
//!
//! `OUTBOX_TEST_THROWAWAY_PG=1` skips step 2, so CI exercises step 3 beside a running server.
//!
//! `initdb` refuses to run as root. As root, the server is therefore initialised and run as
//! the `postgres` OS user (through `runuser`, the directory handed to that user), which the
//! PostgreSQL packages create; without such a user the tests fail and say so.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// The local test server.
pub(crate) const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// Set to `1` to use a throwaway server even when the local test server runs.
const FORCE_ENV: &str = "OUTBOX_TEST_THROWAWAY_PG";

/// The URL of the PostgreSQL the tests use (see the module docs).
///
/// # Panics
///
/// When PostgreSQL is installed but a throwaway server cannot be started; the message says why.
pub(crate) fn url() -> String {
    if let Ok(url) = std::env::var("DATABASE_URL") {
        return url;
    }
    let forced = std::env::var(FORCE_ENV).is_ok_and(|v| v == "1");
    if !forced && listening("127.0.0.1:5432") {
        return DEFAULT_URL.to_string();
    }
    static SERVER: OnceLock<Result<String, String>> = OnceLock::new();
    match SERVER.get_or_init(start) {
        Ok(url) => url.clone(),
        Err(why) => panic!(
            "no PostgreSQL at {DEFAULT_URL} and no throwaway server either: {why}; \
             start PostgreSQL or set DATABASE_URL"
        ),
    }
}

fn listening(addr: &str) -> bool {
    addr.parse::<SocketAddr>()
        .is_ok_and(|a| TcpStream::connect_timeout(&a, Duration::from_millis(300)).is_ok())
}

/// Starts a server; without PostgreSQL binaries, gives the default URL back.
fn start() -> Result<String, String> {
    let Some(bin) = bindir() else {
        eprintln!("no initdb found to start a throwaway PostgreSQL: using {DEFAULT_URL}");
        return Ok(DEFAULT_URL.to_string());
    };
    let dir = std::env::temp_dir().join(format!(
        "outbox-test-pg-{}-{}",
        std::process::id(),
        uuid::Uuid::now_v7().simple()
    ));
    std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let data = dir.join("data");
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port: {e}"))?
        .port();
    let as_user = if is_root() {
        if run(Command::new("id").arg("postgres")).is_err() {
            return Err(
                "running as root, where initdb refuses to run, and there is no \
                        `postgres` user to run it as"
                    .into(),
            );
        }
        run(Command::new("chown").args(["-R", "postgres"]).arg(&dir))?;
        Some("postgres")
    } else {
        None
    };
    let pg = |tool: &str| command(as_user, &bin.join(tool));
    run(pg("initdb").arg("-D").arg(&data).args([
        "-U",
        "postgres",
        "-A",
        "trust",
        "-E",
        "UTF8",
        "--no-sync",
    ]))?;
    let options = format!("-p {port} -h 127.0.0.1 -k {} -F", dir.display());
    run(pg("pg_ctl")
        .arg("-D")
        .arg(&data)
        .arg("-l")
        .arg(dir.join("log"))
        .args(["-w", "-t", "60", "-o", &options, "start"]))?;
    watch(as_user, &bin, &dir, &data);
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    eprintln!("started a throwaway PostgreSQL for this test binary at {url}");
    Ok(url)
}

/// Stops the server and removes its directory once this process has ended.
fn watch(as_user: Option<&str>, bin: &Path, dir: &Path, data: &Path) {
    let stop = match as_user {
        Some(user) => format!("runuser -u {user} -- "),
        None => String::new(),
    };
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 1; done; \
         {stop}'{pg_ctl}' -D '{data}' -m immediate stop >/dev/null 2>&1; rm -rf '{dir}'",
        pid = std::process::id(),
        pg_ctl = bin.join("pg_ctl").display(),
        data = data.display(),
        dir = dir.display(),
    );
    let _ = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
}

fn command(as_user: Option<&str>, program: &Path) -> Command {
    match as_user {
        Some(user) => {
            let mut c = Command::new("runuser");
            c.args(["-u", user, "--"]).arg(program);
            c
        }
        None => Command::new(program),
    }
}

fn run(c: &mut Command) -> Result<(), String> {
    let out = c.output().map_err(|e| format!("cannot run {c:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{c:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}

/// Where `initdb` and `pg_ctl` are.
fn bindir() -> Option<PathBuf> {
    let has_tools = |d: &Path| d.join("initdb").is_file() && d.join("pg_ctl").is_file();
    if let Some(d) = std::env::var_os("OUTBOX_TEST_PG_BIN").map(PathBuf::from) {
        return has_tools(&d).then_some(d);
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let d = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && has_tools(&d) {
            return Some(d);
        }
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).find(|d| has_tools(d))
}
