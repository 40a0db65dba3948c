use outbox_core::outbox_event;

#[outbox_event]
#[derive(serde::Serialize, serde::Deserialize)]
struct EntityCreated<T> {
    entity: T,
}

fn main() {}
