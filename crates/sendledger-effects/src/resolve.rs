//! Name lookups of new connections, each on a thread of its own.
//!
//! A lookup (`getaddrinfo`) blocks, and one whose name servers do not answer holds its thread
//! until the resolver gives up (glibc: 5 s per attempt and server, by default). Tokio runs it
//! on the calling runtime's blocking pool, which the task actors' ledger reads share, bounded
//! to a few threads per actor thread: during a DNS outage, lookups of one target's name would
//! have held up every task on that thread, whatever its target, and queued behind each other.
//! Here a lookup runs on a thread started for it, and concurrent lookups of one address share
//! it: the threads looking names up are at most the distinct addresses being looked up at
//! once. Nothing is cached: each new connection looks its name up again, as before.
//!
//! An address that is an IP address and a port is not looked up.

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// How a name is looked up: the system's resolver, or a stand-in in tests.
type LookupFn = Arc<dyn Fn(&str) -> io::Result<Vec<SocketAddr>> + Send + Sync>;

/// A lookup's outcome, shared by its waiters (an `io::Error` cannot be cloned).
type Shared = Result<Vec<SocketAddr>, (io::ErrorKind, Option<i32>, String)>;

/// Addresses being looked up, and who waits for each.
type InFlight = Arc<Mutex<HashMap<String, Vec<oneshot::Sender<Shared>>>>>;

/// Looks `host:port` addresses up; see the module documentation.
#[derive(Clone)]
pub(crate) struct Resolver {
    lookup: LookupFn,
    in_flight: InFlight,
}

impl Default for Resolver {
    fn default() -> Resolver {
        Resolver::with(Arc::new(|address: &str| {
            address.to_socket_addrs().map(Iterator::collect)
        }))
    }
}

impl Resolver {
    fn with(lookup: LookupFn) -> Resolver {
        Resolver {
            lookup,
            in_flight: Arc::default(),
        }
    }

    /// The socket addresses of `address` (`host:port`), in the resolver's order.
    pub(crate) async fn lookup(&self, address: &str) -> io::Result<Vec<SocketAddr>> {
        if let Ok(addr) = address.parse::<SocketAddr>() {
            return Ok(vec![addr]);
        }
        let (tx, rx) = oneshot::channel();
        let first = {
            let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
            let waiting = in_flight.entry(address.to_string()).or_default();
            waiting.push(tx);
            waiting.len() == 1
        };
        if first {
            // Answers the waiters with the lookup's outcome, or with an error when dropped
            // without one: no waiter is left behind.
            let mut answer = Answer {
                in_flight: self.in_flight.clone(),
                name: address.to_string(),
                answered: false,
            };
            let lookup = self.lookup.clone();
            let spawned = std::thread::Builder::new()
                .name("sendledger-dns".into())
                .spawn(move || {
                    let outcome = lookup(&answer.name);
                    answer.send(outcome.map_err(|e| (e.kind(), e.raw_os_error(), e.to_string())));
                });
            if let Err(e) = spawned {
                tracing::warn!(address, error = %e, "cannot start a thread for a name lookup");
            }
        }
        match rx.await {
            Ok(Ok(addrs)) if addrs.is_empty() => Err(io::Error::new(
                io::ErrorKind::NotFound,
                "the name lookup returned no address",
            )),
            Ok(Ok(addrs)) => Ok(addrs),
            Ok(Err((_, Some(code), _))) => Err(io::Error::from_raw_os_error(code)),
            Ok(Err((kind, None, message))) => Err(io::Error::new(kind, message)),
            Err(_) => Err(io::Error::other("the name lookup ended without an answer")),
        }
    }
}

/// A lookup under way: it hands its outcome to everyone waiting for the name, or, dropped
/// without one (its thread could not start, or the lookup panicked), an error.
struct Answer {
    in_flight: InFlight,
    name: String,
    answered: bool,
}

impl Answer {
    fn send(&mut self, outcome: Shared) {
        let waiting = (self.in_flight.lock().unwrap_or_else(|p| p.into_inner()))
            .remove(&self.name)
            .unwrap_or_default();
        for tx in waiting {
            let _ = tx.send(outcome.clone());
        }
        self.answered = true;
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if !self.answered {
            self.send(Err((
                io::ErrorKind::Other,
                None,
                "the name lookup gave no answer (its thread could not start, or failed)".into(),
            )));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Condvar, Mutex};
    use std::time::Duration;

    /// A lookup that hangs until released, counting its calls.
    #[derive(Default)]
    struct Hanging {
        calls: AtomicUsize,
        released: Mutex<bool>,
        wake: Condvar,
    }

    impl Hanging {
        fn resolver(self: &Arc<Self>) -> Resolver {
            let hanging = self.clone();
            Resolver::with(Arc::new(move |_: &str| {
                hanging.calls.fetch_add(1, Ordering::SeqCst);
                let mut released = hanging.released.lock().unwrap();
                while !*released {
                    released = hanging.wake.wait(released).unwrap();
                }
                Ok(vec!["192.0.2.7:443".parse().unwrap()])
            }))
        }

        fn release(&self) {
            *self.released.lock().unwrap() = true;
            self.wake.notify_all();
        }
    }

    /// Lookups that hang leave the runtime's blocking pool to other work (the task actors'
    /// ledger reads): here it has one thread, and three names hang.
    #[test]
    fn hanging_lookups_do_not_hold_the_runtimes_blocking_threads() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .max_blocking_threads(1)
            .build()
            .unwrap();
        let hanging = Arc::new(Hanging::default());
        let resolver = hanging.resolver();
        runtime.block_on(async {
            let lookups: Vec<_> = ["a.example:443", "b.example:443", "c.example:443"]
                .into_iter()
                .map(|name| {
                    let resolver = resolver.clone();
                    tokio::spawn(async move { resolver.lookup(name).await })
                })
                .collect();
            let started = std::time::Instant::now();
            while hanging.calls.load(Ordering::SeqCst) < 3 {
                assert!(
                    started.elapsed() < Duration::from_secs(5),
                    "the lookups of three names did not run at once"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let read = tokio::task::spawn_blocking(|| 7);
            let read = tokio::time::timeout(Duration::from_secs(5), read).await;
            assert_eq!(
                read.expect("blocking work waited for the lookups").unwrap(),
                7
            );
            hanging.release();
            for lookup in lookups {
                let addrs = lookup.await.unwrap().unwrap();
                assert_eq!(addrs, vec!["192.0.2.7:443".parse().unwrap()]);
            }
        });
    }

    /// Concurrent lookups of one address share one; the next is made again (no cache); an IP
    /// address is never looked up.
    #[tokio::test]
    async fn concurrent_lookups_of_one_address_share_one_and_nothing_is_cached() {
        let hanging = Arc::new(Hanging::default());
        let resolver = hanging.resolver();
        let lookups: Vec<_> = (0..20)
            .map(|_| {
                let resolver = resolver.clone();
                tokio::spawn(async move { resolver.lookup("remote.example:443").await })
            })
            .collect();
        while resolver
            .in_flight
            .lock()
            .unwrap()
            .get("remote.example:443")
            .map(Vec::len)
            != Some(20)
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        hanging.release();
        for lookup in lookups {
            assert_eq!(lookup.await.unwrap().unwrap().len(), 1);
        }
        assert_eq!(hanging.calls.load(Ordering::SeqCst), 1);
        resolver.lookup("remote.example:443").await.unwrap();
        assert_eq!(hanging.calls.load(Ordering::SeqCst), 2);
        let ip = resolver.lookup("127.0.0.1:8080").await.unwrap();
        assert_eq!(ip, vec!["127.0.0.1:8080".parse().unwrap()]);
        assert_eq!(hanging.calls.load(Ordering::SeqCst), 2);
    }

    /// A failed lookup reaches every waiter as an error naming it; an address without a port
    /// is an error of the system's resolver.
    #[tokio::test]
    async fn a_failed_lookup_is_an_error_for_every_waiter() {
        let failing = Resolver::with(Arc::new(|_: &str| Err(io::Error::other("no such name"))));
        let (a, b) = tokio::join!(failing.lookup("x.example:1"), failing.lookup("x.example:1"));
        for e in [a.unwrap_err(), b.unwrap_err()] {
            assert!(e.to_string().contains("no such name"), "{e}");
        }
        assert!(Resolver::default().lookup("no-port").await.is_err());
    }

    /// A lookup that panics answers its waiters with an error and leaves nothing behind: the
    /// next lookup of the name is made again.
    #[tokio::test]
    async fn a_lookup_that_panics_answers_its_waiters_and_the_next_one_runs() {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let resolver = Resolver::with(Arc::new(move |_: &str| {
            if counted.fetch_add(1, Ordering::SeqCst) == 0 {
                panic!("a resolver bug");
            }
            Ok(vec!["192.0.2.9:80".parse().unwrap()])
        }));
        let e = resolver.lookup("y.example:80").await.unwrap_err();
        assert!(
            e.to_string().contains("the name lookup gave no answer"),
            "{e}"
        );
        let addrs = resolver.lookup("y.example:80").await.unwrap();
        assert_eq!(addrs, vec!["192.0.2.9:80".parse().unwrap()]);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }
}
