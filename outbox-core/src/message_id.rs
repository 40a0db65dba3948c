//! Message ids: UUID v7 that strictly increase in the order a process makes them, and whose
//! time and counter fit a positive `i64` ([`message_sequence`]).
//!
//! `uuid::Uuid::now_v7` is monotonic within a process too, but its counter is 42 bits wide and
//! starts each millisecond at a random value below 2^41: with the 48-bit millisecond timestamp
//! that is 90 bits of order, which no 63-bit number (an Elasticsearch external version, a
//! PostgreSQL `bigint`) can hold without two ids of one millisecond colliding. The ids made
//! here use a 20-bit counter that starts each millisecond at a random value below 2^19 and
//! counts up by one (at least 524,288 ids per millisecond before it borrows the next
//! millisecond, as `now_v7` does when its counter runs out), followed by 54 random bits. The
//! layout is the RFC 9562 one ("fixed bit-length dedicated counter"), so they are ordinary
//! UUID v7 that sort by creation.

use std::sync::{Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use uuid::{Timestamp, Uuid};

/// Bits of the per-millisecond counter after the 48-bit timestamp.
const COUNTER_BITS: u8 = 20;
const COUNTER_LIMIT: u64 = 1 << COUNTER_BITS;
/// A new millisecond's counter starts below this, leaving at least as many values to count up.
const SEED_LIMIT: u64 = 1 << (COUNTER_BITS - 1);

/// The millisecond and counter of the last id made by this process.
static LAST: Mutex<(u64, u64)> = Mutex::new((0, 0));

/// A new message id: a UUID v7, strictly greater than every id this process made before, even
/// within one millisecond or when the clock steps back.
///
/// [`enqueue`](crate::enqueue) uses it; use it for ids of your own that must order the same way.
///
/// ```
/// let a = outbox::new_message_id();
/// let b = outbox::new_message_id();
/// assert!(a < b);
/// assert_eq!(a.get_version_num(), 7);
/// assert!(outbox::message_sequence(a) < outbox::message_sequence(b));
/// ```
pub fn new_message_id() -> Uuid {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    let (ms, counter) = {
        let mut last = LAST.lock().unwrap_or_else(PoisonError::into_inner);
        let (last_ms, last_counter) = *last;
        let next = if now > last_ms {
            (now, rand::random::<u64>() % SEED_LIMIT)
        } else if last_counter + 1 < COUNTER_LIMIT {
            (last_ms, last_counter + 1)
        } else {
            (last_ms + 1, rand::random::<u64>() % SEED_LIMIT)
        };
        *last = next;
        next
    };
    Uuid::new_v7(Timestamp::from_unix_time(
        ms / 1000,
        u32::try_from(ms % 1000).unwrap_or(0) * 1_000_000,
        u128::from(counter),
        COUNTER_BITS,
    ))
}

/// The position of a UUID v7 in the order ids are made: its 48-bit millisecond timestamp
/// followed by the next 20 bits of its counter, as one number below 2^63 (until the year 2248).
///
/// For ids made by [`new_message_id`] (every id [`enqueue`](crate::enqueue) gives) in one
/// process, it strictly increases in the order they were made, within one millisecond too. For
/// other UUID v7 (such as `Uuid::now_v7`'s) it grows with their timestamp and never goes
/// backwards for ids made in order, but may repeat within a millisecond.
///
/// It fits a positive `i64`, as an Elasticsearch external version must:
///
/// ```
/// let v = outbox::message_sequence(outbox::new_message_id());
/// assert!(i64::try_from(v).is_ok());
/// ```
pub fn message_sequence(id: Uuid) -> u64 {
    let v = id.as_u128();
    let ms = v >> 80;
    let rand_a = (v >> 64) & 0xfff;
    let rand_b_top = (v >> 54) & 0xff;
    let counter = (rand_a << 8) | rand_b_top;
    let sequence = (ms << COUNTER_BITS) | counter;
    u64::try_from(sequence.min(i64::MAX as u128)).unwrap_or(i64::MAX as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_counter_is_where_uuid_puts_it_and_sequences_follow_the_ids() {
        let ids: Vec<Uuid> = (0..10_000).map(|_| new_message_id()).collect();
        for pair in ids.windows(2) {
            assert!(pair[0] < pair[1], "ids increase");
            assert!(
                message_sequence(pair[0]) < message_sequence(pair[1]),
                "sequences increase: {} then {}",
                pair[0],
                pair[1]
            );
        }
        for id in &ids {
            assert_eq!(id.get_version_num(), 7);
            assert_eq!(id.get_variant(), uuid::Variant::RFC4122);
            let (secs, nanos) = id.get_timestamp().unwrap().to_unix();
            let ms = secs * 1000 + u64::from(nanos / 1_000_000);
            assert_eq!(message_sequence(*id) >> COUNTER_BITS, ms);
        }
    }

    #[test]
    fn now_v7_ids_never_go_backwards() {
        let ids: Vec<Uuid> = (0..1000).map(|_| Uuid::now_v7()).collect();
        for pair in ids.windows(2) {
            assert!(message_sequence(pair[0]) <= message_sequence(pair[1]));
        }
    }
}
