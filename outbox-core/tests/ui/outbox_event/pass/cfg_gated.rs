use outbox::{outbox_event, Event};
use serde::{Deserialize, Serialize};

// A `#[cfg]` below the attribute gates the generated impl and registration too.
#[outbox_event]
#[cfg(any())]
#[derive(Serialize, Deserialize)]
struct NeverCompiled {
    field: TypeThatDoesNotExist,
}

#[outbox_event]
#[cfg(all())]
#[derive(Serialize, Deserialize)]
struct AlwaysCompiled;

fn main() {
    assert_eq!(AlwaysCompiled::TOPIC, "always.compiled");
    let _ = AlwaysCompiled;
}
