//! How fast a target may be sent to: at most `max_in_flight` requests at once, and optionally
//! at most `rate_limit` requests per second (a token bucket with one second of burst). A
//! target's attempts and lookups share its limiter, unless `lookup.limits` gives lookups one of
//! their own.
//!
//! A task takes its slot *before* it records the intent of an attempt, so waiting for room at
//! a busy remote never turns into an attempt that times out (an unknown outcome of our own
//! making), and an intent is never recorded long before its request leaves. A lookup holds its
//! slot for all its pages and takes a turn of the rate for each page (`target/lookup.rs`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sendledger_core::decide::AttemptOutcome;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::breaker::Ticket;
use crate::conn::Opened;

/// The limits of one target's requests (or of its lookups alone).
#[derive(Debug)]
pub struct Limiter {
    slots: Arc<Semaphore>,
    rate: Option<Mutex<Bucket>>,
}

/// The generic cell rate algorithm: `tat` is when the bucket is next empty.
#[derive(Debug)]
struct Bucket {
    interval: Duration,
    burst: Duration,
    tat: Instant,
}

/// Room for one attempt, its admission by the target's breaker and the connection opened for
/// it: hand it to [`crate::Target::execute_reserved`], which reports the attempt's outcome to
/// the breaker; dropping it frees the room (an attempt never sent counts neither way).
pub struct SendSlot {
    _permit: OwnedSemaphorePermit,
    pub(crate) ticket: Option<Ticket>,
    /// The connection opened for the attempt before its intent (see [`crate::Target::reserve`]).
    pub(crate) conn: Option<Opened>,
    /// Where and within which timeouts the attempt goes (see [`crate::Target::reserve`]).
    pub(crate) endpoint: Option<crate::conn::Endpoint>,
}

impl SendSlot {
    /// Frees the room and tells the target's breaker what the attempt proved.
    pub(crate) fn finish(self, outcome: &AttemptOutcome) {
        if let Some(ticket) = self.ticket {
            ticket.finish_outcome(outcome);
        }
    }
}

impl std::fmt::Debug for SendSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendSlot")
            .field("breaker", &self.ticket.is_some())
            .finish()
    }
}

impl Limiter {
    /// `max_in_flight` at least 1; `rate_limit` in requests per second, positive and finite.
    pub fn new(max_in_flight: usize, rate_limit: Option<f64>) -> Limiter {
        Limiter {
            slots: Arc::new(Semaphore::new(max_in_flight.max(1))),
            rate: rate_limit.map(|rate| {
                let interval = Duration::from_secs_f64(1.0 / rate);
                Mutex::new(Bucket {
                    interval,
                    // One second's worth of attempts may go at once.
                    burst: interval.mul_f64((rate - 1.0).max(0.0)),
                    tat: Instant::now(),
                })
            }),
        }
    }

    /// Waits for room for one attempt: a free slot, then the rate's turn.
    pub async fn acquire(&self) -> SendSlot {
        let permit = self.slot().await;
        self.turn(None).await;
        SendSlot {
            _permit: permit,
            ticket: None,
            conn: None,
            endpoint: None,
        }
    }

    /// Waits for a free slot, held until the permit is dropped.
    pub(crate) async fn slot(&self) -> OwnedSemaphorePermit {
        self.slots
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed")
    }

    /// Waits for the rate's turn of one request. With `by`, a turn that comes later is not
    /// taken and `false` is returned at once; otherwise `true` once the turn has come.
    pub(crate) async fn turn(&self, by: Option<Instant>) -> bool {
        let Some(bucket) = &self.rate else {
            return true;
        };
        let wait = {
            let mut b = bucket.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            let tat = b.tat.max(now);
            let wait = tat.saturating_duration_since(now).saturating_sub(b.burst);
            if by.is_some_and(|by| now + wait > by) {
                return false;
            }
            b.tat = tat + b.interval;
            wait
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn slots_bound_attempts_in_flight() {
        let limiter = Arc::new(Limiter::new(2, None));
        let a = limiter.acquire().await;
        let _b = limiter.acquire().await;
        let third = tokio::spawn({
            let limiter = limiter.clone();
            async move { limiter.acquire().await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!third.is_finished(), "a third attempt waits");
        drop(a);
        third.await.unwrap();
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn the_rate_allows_a_second_of_burst_then_spaces_attempts() {
        let limiter = Limiter::new(1_000, Some(10.0));
        let start = tokio::time::Instant::now();
        let mut slots = Vec::new();
        for _ in 0..10 {
            slots.push(limiter.acquire().await);
        }
        assert!(
            start.elapsed() < Duration::from_millis(1),
            "the burst goes at once"
        );
        for _ in 0..10 {
            slots.push(limiter.acquire().await);
        }
        // Ten more at 10/s take about a second.
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(990) && took <= Duration::from_millis(1_100),
            "{took:?}"
        );
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_turn_later_than_its_bound_is_not_taken() {
        let limiter = Limiter::new(1, Some(1.0));
        let now = Instant::now();
        assert!(limiter.turn(Some(now)).await, "the first turn is now");
        // The next turn is a second away: not within 500 ms, and refusing it takes nothing.
        assert!(!limiter.turn(Some(now + Duration::from_millis(500))).await);
        assert_eq!(Instant::now(), now, "refused at once");
        assert!(limiter.turn(Some(now + Duration::from_secs(1))).await);
        assert_eq!(Instant::now(), now + Duration::from_secs(1));
        // Without a bound a turn is always taken.
        assert!(limiter.turn(None).await);
        assert_eq!(Instant::now(), now + Duration::from_secs(2));
    }
}
