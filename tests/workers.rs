//! `outbox workers`, `Store::workers` and the console's workers page: who each live worker is
//! (name, host, process id) and what it serves (topics, the versions it knows, its handlers'
//! names), read from a real worker process on every backend.

use std::process::Stdio;
use std::time::Duration;

use outbox_tests::{console_page, wait_until};
use tokio::process::Command;

/// The host name a worker records: `HOSTNAME` when this environment sets it (the worker
/// processes inherit it), else the kernel's.
fn this_host() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.trim().is_empty())
        .unwrap_or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname").expect("a Linux host name")
        })
        .trim()
        .to_string()
}

/// `outbox workers` with `args`, on `url`: exit code and stdout.
fn ops(url: &str, args: &[&str]) -> (i32, String) {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_ops"))
        .args(args)
        .env("DATABASE_URL", url)
        .output()
        .expect("run the outbox command line");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
    )
}

outbox_tests::all_backends! {
    async fn a_live_worker_process_is_listed_with_its_host_pid_topics_versions_and_handlers(db, store, pool) {
        let _ = &pool;
        let (code, out) = ops(&db.url, &["workers"]);
        assert_eq!((code, out.trim()), (0, "no live worker"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_test-worker"))
            .arg("--database-url")
            .arg(&db.url)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn test-worker");
        let pid = child.id().expect("the worker runs");
        wait_until(Duration::from_secs(30), "the worker's heartbeat", async || {
            store.workers().await.unwrap().iter().any(|w| w.live)
        })
        .await;

        let workers = store.workers().await.unwrap();
        let w = &workers[0];
        assert_eq!((w.host.clone(), w.pid), (Some(this_host()), Some(pid)), "{w:?}");
        assert_eq!(w.name, format!("{}:{pid}", this_host()));
        let serves: Vec<(String, Option<i32>, Vec<String>)> = w
            .serves()
            .map(|(t, v, h)| (t.to_string(), v, h.to_vec()))
            .collect();
        assert_eq!(serves, [("test.work".to_string(), Some(1), vec!["record".to_string()])]);

        let (code, out) = ops(&db.url, &["workers", "--json"]);
        assert_eq!(code, 0, "{out}");
        let json: serde_json::Value = serde_json::from_str(&out).unwrap();
        let listed = &json[0];
        assert_eq!(listed["pid"], pid, "{out}");
        assert_eq!(listed["host"], this_host(), "{out}");
        assert_eq!(listed["live"], true, "{out}");
        assert_eq!(
            listed["topics"],
            serde_json::json!([{"topic": "test.work", "version": 1, "handlers": ["record"]}]),
            "{out}"
        );
        let (code, out) = ops(&db.url, &["workers"]);
        assert_eq!(code, 0);
        assert!(out.contains(&format!("host={}  pid={pid}", this_host())), "{out}");
        assert!(out.contains("  test.work  v1  record"), "{out}");

        let page = console_page(store.clone()).await;
        let body = page("/workers").await;
        assert!(body.contains(&format!("<td class=\"n\">{pid}</td>")), "{body}");
        assert!(body.contains("test.work v1: record"), "{body}");

        child.kill().await.unwrap();
        let (code, out) = ops(&db.url, &["workers", "--all", "--json"]);
        assert_eq!(code, 0);
        assert_eq!(serde_json::from_str::<serde_json::Value>(&out).unwrap()[0]["pid"], pid);
    }
}
