//! The remote's ground truth as counters: what it received, held and injected.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::store::Store;

/// The remote's ground truth, as counters. `duplicates` is what a dispatcher must keep at zero.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Connections accepted.
    pub connections: u64,
    /// HTTP requests received (all paths).
    pub requests: u64,
    /// Create requests received.
    pub posts: u64,
    /// Records held.
    pub records: u64,
    /// Distinct identity values among the records.
    pub identities: u64,
    /// Identities with more than one record.
    pub duplicates: u64,
    /// Creates answered with an earlier record because of a repeated idempotency key.
    pub replays: u64,
    /// Lookup requests answered (throttled ones included).
    pub lookups: u64,
    /// Lookup requests answered 429/503 with `Retry-After` (the `lookup_throttle` fault).
    #[serde(default)]
    pub lookups_throttled: u64,
    /// The most create and lookup requests being worked on at once (read whole or not,
    /// answered or not yet): what a client's limit on requests in flight keeps down.
    #[serde(default)]
    pub peak_in_flight: u64,
    /// Connections closed by the `refuse` fault.
    pub refused: u64,
    /// Creates committed, then the connection dropped.
    pub dropped: u64,
    /// Creates committed, then never answered.
    pub hung: u64,
    /// Creates read whole, then the connection dropped with nothing created (the `drop`
    /// fault).
    #[serde(default)]
    pub dropped_uncommitted: u64,
    /// Creates read whole, then never answered with nothing created (the `hang` fault).
    #[serde(default)]
    pub hung_uncommitted: u64,
    /// Creates answered 5xx (with or without a record).
    pub errors: u64,
    /// Creates answered 429/503 with `Retry-After`.
    pub throttled: u64,
    /// Creates answered by the `reject` fault.
    pub rejected: u64,
    /// Creates refused for a bad body or a missing required header.
    pub invalid: u64,
    /// TLS handshakes that failed (the client did not trust the certificate, presented no
    /// acceptable certificate of its own, or does not speak TLS).
    #[serde(default)]
    pub handshakes_failed: u64,
}

/// The counted part of [`Stats`]; the rest is read from the store.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) connections: AtomicU64,
    pub(crate) requests: AtomicU64,
    pub(crate) posts: AtomicU64,
    pub(crate) replays: AtomicU64,
    pub(crate) lookups: AtomicU64,
    pub(crate) lookups_throttled: AtomicU64,
    /// Create and lookup requests being worked on now, and the most at once.
    pub(crate) in_flight: AtomicU64,
    pub(crate) peak_in_flight: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) dropped: AtomicU64,
    pub(crate) hung: AtomicU64,
    pub(crate) dropped_uncommitted: AtomicU64,
    pub(crate) hung_uncommitted: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) throttled: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) invalid: AtomicU64,
    pub(crate) handshakes_failed: AtomicU64,
}

/// Adds one to a counter and returns its previous value (the request's sequence number).
pub(crate) fn bump(counter: &AtomicU64) -> u64 {
    counter.fetch_add(1, Ordering::Relaxed)
}

/// A create or lookup request being worked on: counted in `in_flight` (and its peak) until
/// dropped, whatever its ending (answered, dropped, or abandoned by the client).
pub(crate) struct InFlight<'a>(&'a Counters);

impl<'a> InFlight<'a> {
    pub(crate) fn start(counters: &'a Counters) -> InFlight<'a> {
        let now = counters.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        counters.peak_in_flight.fetch_max(now, Ordering::Relaxed);
        InFlight(counters)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Counters {
    pub(crate) fn snapshot(&self, store: &Store) -> Stats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            connections: get(&self.connections),
            requests: get(&self.requests),
            posts: get(&self.posts),
            records: store.records.len() as u64,
            identities: store.by_identity.len() as u64,
            duplicates: store.duplicates,
            replays: get(&self.replays),
            lookups: get(&self.lookups),
            lookups_throttled: get(&self.lookups_throttled),
            peak_in_flight: get(&self.peak_in_flight),
            refused: get(&self.refused),
            dropped: get(&self.dropped),
            hung: get(&self.hung),
            dropped_uncommitted: get(&self.dropped_uncommitted),
            hung_uncommitted: get(&self.hung_uncommitted),
            errors: get(&self.errors),
            throttled: get(&self.throttled),
            rejected: get(&self.rejected),
            invalid: get(&self.invalid),
            handshakes_failed: get(&self.handshakes_failed),
        }
    }
}
