//! Any payload serde can serialize is stored on every backend: no string content can make
//! `enqueue` fail, and so abort the caller's business transaction.

use std::sync::{Arc, Mutex};

use outbox::{enqueue, outbox_event, Context, Handler, HandlerError, Worker};
use serde::{Deserialize, Serialize};

#[outbox_event(topic = "payload.text")]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Note {
    text: String,
}

struct Keep(Arc<Mutex<Vec<String>>>);

#[outbox::async_trait]
impl Handler for Keep {
    type Event = Note;
    const NAME: &'static str = "keep";
    async fn handle(&self, e: Note, _: &Context) -> Result<(), HandlerError> {
        self.0.lock().unwrap().push(e.text);
        Ok(())
    }
}

/// NUL, a lone control character, an escaped quote, non-BMP text and a JSON-looking string.
fn texts() -> Vec<String> {
    vec![
        "before\u{0}after".into(),
        "\u{1}\u{1f}\u{7f}".into(),
        "quote \" backslash \\ ".into(),
        "emoji \u{1F600} and \u{10FFFF}".into(),
        "{\"not\": \"json\"}\u{0}".into(),
    ]
}

outbox_tests::all_backends! {
    async fn every_string_is_stored_and_delivered(db, store, pool) {
        let mut tx = pool.begin().await.unwrap();
        for text in texts() {
            enqueue(&mut *tx, &Note { text })
                .await
                .expect("enqueue never fails on content");
        }
        sqlx::query("SELECT 1")
            .execute(&mut *tx)
            .await
            .expect("the transaction is still usable");
        tx.commit().await.unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let worker = Worker::builder(store)
            .handler(Keep(seen.clone()))
            .build()
            .unwrap();
        let report = worker.run_once().await.unwrap();
        assert_eq!(report.done, texts().len());
        let mut got = seen.lock().unwrap().clone();
        let mut want = texts();
        got.sort();
        want.sort();
        assert_eq!(got, want, "delivered byte for byte");
        let _ = &db;
    }
}
