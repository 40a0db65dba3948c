use outbox::outbox_event;

#[outbox_event]
#[derive(serde::Serialize, serde::Deserialize)]
struct GuestRenamed<'a> {
    new_name: &'a str,
}

fn main() {}
