//! A TCP relay in front of Apache Kafka (which advertises the relay's address, so every
//! connection of a client goes through it) that a test can cut, as a network partition seen
//! from the client would, or that holds one transactional writer's commits, as a broker whose
//! commit of one partition's transaction hangs would.
//!
//! Holding reads the Kafka protocol's framing of what clients send: each request is a 4-byte
//! big-endian size, then its header, which starts with the API key (2 bytes). An `EndTxn`
//! request (API key 26) carries its `transactional.id` in its body; one of the held writer is
//! not forwarded, nor anything after it on its connection, until the hold ends.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::watch;

/// The Kafka protocol's API key of `EndTxn` (a transaction's commit or abort).
const END_TXN: i16 = 26;

pub struct Relay {
    pub port: u16,
    cut: Arc<AtomicBool>,
    generation: Arc<watch::Sender<u64>>,
    /// The `transactional.id` whose commits are held, if any.
    hold: Arc<watch::Sender<Option<String>>>,
    held: Arc<AtomicU64>,
}

impl Relay {
    /// Listens on `port` (the address the broker advertises) and relays to `target`.
    pub async fn start_on(port: u16, target: u16) -> Relay {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let generation = Arc::new(watch::channel(0u64).0);
        let hold = Arc::new(watch::channel(None::<String>).0);
        let held = Arc::new(AtomicU64::new(0));
        let (cut2, generation2, hold2, held2) =
            (cut.clone(), generation.clone(), hold.clone(), held.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if cut2.load(Ordering::SeqCst) {
                    continue; // dropped: closed at once
                }
                let mut cut_seen = generation2.subscribe();
                let (hold, held) = (hold2.subscribe(), held2.clone());
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else {
                        return;
                    };
                    let (mut from_client, mut to_client) = client.into_split();
                    let (mut from_server, to_server) = server.into_split();
                    tokio::select! {
                        _ = tokio::io::copy(&mut from_server, &mut to_client) => {}
                        _ = requests(&mut from_client, to_server, hold, &held) => {}
                        _ = cut_seen.changed() => {}
                    }
                });
            }
        });
        Relay {
            port,
            cut,
            generation,
            hold,
            held,
        }
    }

    /// Cuts the relay (every relayed connection closed, new ones refused), or mends it.
    pub fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::SeqCst);
        if cut {
            self.generation.send_modify(|g| *g += 1);
        }
    }

    /// Holds the commits (and aborts) of the writer with this `transactional.id`, or (`None`)
    /// forwards what was held and holds nothing more.
    pub fn hold_commits_of(&self, transactional_id: Option<&str>) {
        self.hold.send_replace(transactional_id.map(str::to_owned));
    }

    /// How many commits were held so far.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::SeqCst)
    }
}

/// Forwards a client's requests to the broker, one frame at a time, waiting at a commit of the
/// held writer until the hold ends.
async fn requests(
    from: &mut OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut hold: watch::Receiver<Option<String>>,
    held: &AtomicU64,
) -> std::io::Result<()> {
    let mut frame = Vec::new();
    loop {
        let size = from.read_u32().await?;
        frame.clear();
        frame.extend_from_slice(&size.to_be_bytes());
        frame.resize(4 + size as usize, 0);
        from.read_exact(&mut frame[4..]).await?;
        let holds = |id: &Option<String>| id.as_deref().is_some_and(|id| commits(&frame[4..], id));
        if holds(&hold.borrow_and_update()) {
            held.fetch_add(1, Ordering::SeqCst);
            while holds(&hold.borrow_and_update()) {
                if hold.changed().await.is_err() {
                    return Ok(());
                }
            }
        }
        to.write_all(&frame).await?;
    }
}

/// Whether a request (its header and body) is an `EndTxn` of the writer `transactional_id`.
fn commits(request: &[u8], transactional_id: &str) -> bool {
    if request.len() < 2 || i16::from_be_bytes([request[0], request[1]]) != END_TXN {
        return false;
    }
    let id = transactional_id.as_bytes();
    // The id as a whole string: not followed by more of a longer one (`events.1` in
    // `events.12`).
    request.windows(id.len()).enumerate().any(|(at, w)| {
        w == id
            && request
                .get(at + id.len())
                .is_none_or(|b| !b.is_ascii_alphanumeric())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_is_recognized_by_its_writer() {
        let end_txn = |id: &str| {
            let mut r = END_TXN.to_be_bytes().to_vec();
            r.extend_from_slice(&[0, 3, 0, 0, 0, 7, 0, 2, b'c', b'x', 0]);
            r.extend_from_slice(&(id.len() as i16).to_be_bytes());
            r.extend_from_slice(id.as_bytes());
            r.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1]);
            r
        };
        assert!(commits(&end_txn("g.events.1"), "g.events.1"));
        assert!(!commits(&end_txn("g.events.12"), "g.events.1"));
        assert!(!commits(&end_txn("g.events.2"), "g.events.1"));
        let mut produce = end_txn("g.events.1");
        produce[1] = 0;
        assert!(!commits(&produce, "g.events.1"));
    }
}
