use outbox::outbox_event;

// The topic derived from this name, `ünïcode`, is not ASCII.
#[outbox_event]
#[derive(serde::Serialize, serde::Deserialize)]
struct Ünïcode {
    id: i64,
}

fn main() {}
