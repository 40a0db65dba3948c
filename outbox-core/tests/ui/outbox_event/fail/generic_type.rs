use outbox::outbox_event;

#[outbox_event]
#[derive(serde::Serialize, serde::Deserialize)]
struct EntityCreated<T> {
    entity: T,
}

fn main() {}
