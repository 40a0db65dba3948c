use outbox::{outbox_event, Event};
use serde::{Deserialize, Serialize};

#[outbox_event]
#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum PaymentChanged {
    Authorized { payment_id: i64, amount_cents: u64 },
    Captured { payment_id: i64 },
    Refunded(i64),
    Voided,
}

// The attribute also works below `#[derive]`.
#[derive(Serialize, Deserialize)]
#[outbox_event(topic = "payment.state")]
enum PaymentState {
    Open,
    Closed,
}

fn main() {
    assert_eq!(PaymentChanged::TOPIC, "payment.changed");
    assert_eq!(PaymentState::TOPIC, "payment.state");
    let _ = [
        PaymentChanged::Authorized {
            payment_id: 1,
            amount_cents: 100,
        },
        PaymentChanged::Captured { payment_id: 1 },
        PaymentChanged::Refunded(1),
        PaymentChanged::Voided,
    ];
    let _ = [PaymentState::Open, PaymentState::Closed];
}
