//! The listening socket, and the outage that takes it away.
//!
//! While the remote is offline nothing listens on its port, so the kernel refuses every
//! connection outright (`ECONNREFUSED`), the way a stopped server is seen; the connections it
//! had, keep-alive ones waiting in a client's pool included, are closed, so no request reaches
//! it by any path. Back online, it listens on the same port again: tokio binds with
//! `SO_REUSEADDR` on Unix, so the port is free to bind right away even while closed connections
//! of the previous socket linger in `TIME_WAIT`.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Mutex};
use tokio::task::JoinHandle;
use tracing::warn;

use crate::error::{Error, Result};

/// Serves one accepted connection until it ends.
pub(crate) type Serve =
    Arc<dyn Fn(TcpStream) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// What the accept loops and the connections share.
struct Inner {
    serve: Serve,
    /// Set for good when the simulator stops.
    stop: watch::Receiver<bool>,
    /// Set while the remote is offline.
    offline: watch::Sender<bool>,
    /// Connections accepted and not yet closed.
    open: watch::Sender<usize>,
}

/// The remote's port: listening while online, closed while offline.
pub(crate) struct Listener {
    addr: SocketAddr,
    inner: Arc<Inner>,
    /// The accept loop, which owns the listening socket; `None` while offline. An async mutex
    /// makes concurrent switches take turns.
    accept: Mutex<Option<JoinHandle<()>>>,
}

impl Listener {
    /// Starts accepting on `listener`, serving each connection with `serve` until it ends,
    /// `stop` is set or the remote goes offline.
    pub(crate) fn start(
        listener: TcpListener,
        addr: SocketAddr,
        stop: watch::Receiver<bool>,
        serve: Serve,
    ) -> Listener {
        let inner = Arc::new(Inner {
            serve,
            stop,
            offline: watch::Sender::new(false),
            open: watch::Sender::new(0),
        });
        let accept = tokio::spawn(accept_loop(listener, inner.clone()));
        Listener {
            addr,
            inner,
            accept: Mutex::new(Some(accept)),
        }
    }

    /// Takes the remote offline or brings it back. Going offline returns once the listening
    /// socket and every connection are closed; coming back, once the port listens again (an
    /// error if it cannot be bound, and the remote stays offline).
    pub(crate) async fn set_offline(&self, offline: bool) -> Result<()> {
        let mut accept = self.accept.lock().await;
        if offline {
            self.inner.offline.send_replace(true);
            if let Some(loop_) = accept.take() {
                let _ = loop_.await;
            }
            let mut open = self.inner.open.subscribe();
            let _ = open.wait_for(|n| *n == 0).await;
        } else if accept.is_none() {
            let listener = TcpListener::bind(self.addr)
                .await
                .map_err(|source| Error::Bind {
                    addr: self.addr,
                    source,
                })?;
            self.inner.offline.send_replace(false);
            *accept = Some(tokio::spawn(accept_loop(listener, self.inner.clone())));
        }
        Ok(())
    }

    /// Waits for the accept loop to end (after `stop` was set).
    pub(crate) async fn stopped(&self) {
        if let Some(loop_) = self.accept.lock().await.take() {
            let _ = loop_.await;
        }
    }
}

/// Accepts until the simulator stops or the remote goes offline; returning drops (closes) the
/// listening socket.
async fn accept_loop(listener: TcpListener, inner: Arc<Inner>) {
    let mut stop = inner.stop.clone();
    let mut offline = inner.offline.subscribe();
    loop {
        let accepted = tokio::select! {
            biased;
            _ = stop.wait_for(|stop| *stop) => return,
            _ = offline.wait_for(|offline| *offline) => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _peer)) => {
                let _ = stream.set_nodelay(true);
                // Counted before the task starts, so that going offline waits for it too.
                let open = Open::count(inner.clone());
                tokio::spawn(connection(stream, open));
            }
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                warn!(error = %e, "simulated remote: accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// One open connection in [`Inner::open`], counted until dropped (a panicking connection
/// task included).
struct Open(Arc<Inner>);

impl Open {
    fn count(inner: Arc<Inner>) -> Open {
        inner.open.send_modify(|n| *n += 1);
        Open(inner)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.send_modify(|n| *n -= 1);
    }
}

/// Serves one connection until it ends, the simulator stops or the remote goes offline, then
/// closes it (without an answer, hanging requests included).
async fn connection(stream: TcpStream, open: Open) {
    let inner = &open.0;
    let mut stop = inner.stop.clone();
    let mut offline = inner.offline.subscribe();
    // Biased: once the remote is offline, the connection is not polled again, so it cannot
    // answer anything more.
    tokio::select! {
        biased;
        _ = stop.wait_for(|stop| *stop) => {}
        _ = offline.wait_for(|offline| *offline) => {}
        () = (inner.serve)(stream) => {}
    }
}

#[cfg(test)]
mod tests {
    use std::io::ErrorKind;
    use std::time::Duration;

    use serde_json::json;
    use tokio::net::TcpStream;

    use crate::testing::{self, Client};
    use crate::{Faults, Sim, SimConfig};

    async fn refused(addr: std::net::SocketAddr) -> bool {
        match TcpStream::connect(addr).await {
            Ok(_) => false,
            Err(e) => e.kind() == ErrorKind::ConnectionRefused,
        }
    }

    #[tokio::test]
    async fn offline_refuses_connections_closes_open_ones_and_comes_back_on_the_same_port() {
        let sim = Sim::start(SimConfig::default()).await.unwrap();
        let addr = sim.addr();
        let create = sim.config().create_path.clone();
        let lookup = format!("{}?request_key=a", sim.config().lookup_path);
        // A kept-alive connection that served a create and sits idle, as in a client's pool.
        let mut pooled = Client::connect(addr).await.unwrap();
        let created = pooled.post(&create, &json!({"request_key": "a"})).await;
        assert_eq!(created.unwrap().status, 201);
        // And a create the remote never answers.
        sim.set_faults(Faults {
            hang: 1.0,
            ..Faults::default()
        })
        .unwrap();
        let hanging = {
            let create = create.clone();
            tokio::spawn(async move { testing::post(addr, &create, &json!({})).await })
        };
        while sim.stats().hung_uncommitted == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        sim.set_faults(Faults::default()).unwrap();

        sim.set_offline(true).await.unwrap();
        assert!(refused(addr).await, "connected while offline");
        let err = hanging.await.unwrap().unwrap_err();
        assert!(err.is_incomplete_message(), "{err:?}");
        assert!(pooled.get(&lookup).await.is_err(), "served while offline");
        let before = sim.stats();
        assert_eq!((before.requests, before.records), (2, 1));

        sim.set_offline(false).await.unwrap();
        assert_eq!(sim.addr(), addr);
        let found = testing::get(addr, &lookup).await;
        assert_eq!(found.status, 200);
        assert_eq!(found.body.as_array().unwrap().len(), 1, "{found:?}");
        let created = testing::post(addr, &create, &json!({"request_key": "b"})).await;
        assert_eq!(created.unwrap().status, 201);
        let after = sim.stats();
        assert_eq!((after.requests, after.records), (4, 2));
    }

    #[tokio::test]
    async fn the_port_is_closed_and_reopened_again_and_again() {
        let sim = Sim::start(SimConfig::default()).await.unwrap();
        let addr = sim.addr();
        let stats = sim.config().stats_path.clone();
        for _ in 0..20 {
            sim.set_offline(true).await.unwrap();
            // Switching to the state it is in changes nothing.
            sim.set_offline(true).await.unwrap();
            assert!(refused(addr).await, "connected while offline");
            sim.set_offline(false).await.unwrap();
            sim.set_offline(false).await.unwrap();
            assert_eq!(testing::get(addr, &stats).await.status, 200);
        }
        assert_eq!(sim.stats().requests, 20);
        // Stopping an offline remote ends at once.
        sim.set_offline(true).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), sim.shutdown())
            .await
            .unwrap();
    }
}
