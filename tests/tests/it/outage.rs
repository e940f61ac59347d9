//! A remote that is down for a while in the middle of a stream of tasks, in four kinds
//! (connections refused; each POST dropped unanswered; each POST answered 503; each POST hung
//! until the request timeout). With the target's circuit breaker, tasks that arrive during the
//! outage wait before their intent instead of being sent into it; the few sent before the
//! breaker opened are proven not performed by `lookup.complete_after` and resent. Every task
//! succeeds once the remote is back, with exactly one record, none fails and (almost) none
//! needs a person. `tests/soak/outage.rs` runs the same for a minute, with and without the
//! breaker, and reports the numbers.

use std::time::Duration;

use sendledger_tests::outage::{run, Outage, OutageReport, OutageRun, Remote};

async fn outage(remote: Remote, kind: Outage) -> OutageReport {
    let report = run(&OutageRun {
        remote,
        kind,
        tasks: 240,
        submit_for: Duration::from_secs(12),
        outage_at: Duration::from_secs(3),
        outage_for: Duration::from_secs(6),
        breaker: true,
        settle_within: Duration::from_secs(30),
    })
    .await;
    eprintln!(
        "{remote:?} {kind:?}: {}",
        serde_json::to_string(&report).unwrap()
    );
    assert_eq!(report.duplicates, 0, "{report:?}");
    assert_eq!(report.wrong_remote_id, 0, "{report:?}");
    assert_eq!(
        report.unsettled, 0,
        "every task settles once the remote is back: {report:?}"
    );
    assert_eq!(report.failed, 0, "an outage fails no task: {report:?}");
    assert!(
        report.settled_after_return_ms <= 30_000,
        "every task submitted before the remote's return settled within 30 s of it: {report:?}"
    );
    assert!(
        report.manual_review <= 3,
        "a review only when a task was a probe more often than its resends allow: {report:?}"
    );
    assert!(report.breaker_opened >= 1, "{report:?}");
    assert!(
        report.tasks_that_waited >= 60,
        "tasks that arrived during the outage waited: {report:?}"
    );
    // About 120 tasks arrive during the outage; with the breaker open only those sent before
    // it opened, and its probes, reach the remote.
    assert!(
        report.posts_during_outage <= 40,
        "the breaker keeps tasks from being sent into the outage: {report:?}"
    );
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_with_refused_connections_becomes_a_delay() {
    let report = outage(Remote::Sim, Outage::Refused).await;
    assert_eq!(report.posts_during_outage, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_that_drops_each_post_becomes_a_delay() {
    outage(Remote::Sim, Outage::Dropped).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_that_answers_503_becomes_a_delay() {
    outage(Remote::Sim, Outage::Unavailable).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_that_hangs_each_post_becomes_a_delay() {
    outage(Remote::Sim, Outage::Hung).await;
}

// The same against a real HTTP server in a separate process: json-server (installed by
// `scripts/prereqs`) behind a fault proxy that refuses connections, or drops, answers 503 to,
// or hangs each POST (forwarding none of them) while GETs, the lookups, pass. Records and
// duplicates are counted from json-server's own store.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_server_behind_refused_connections_becomes_a_delay() {
    let report = outage(Remote::JsonServer, Outage::Refused).await;
    assert_eq!(report.posts_during_outage, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_server_with_each_post_dropped_becomes_a_delay() {
    outage(Remote::JsonServer, Outage::Dropped).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_server_with_each_post_answered_503_becomes_a_delay() {
    outage(Remote::JsonServer, Outage::Unavailable).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_server_with_each_post_hung_becomes_a_delay() {
    outage(Remote::JsonServer, Outage::Hung).await;
}

/// The fault proxy itself, against a server that records what reaches it: requests and answers
/// (a chunked one included) pass byte for byte on a kept-alive connection; in each POST kind of
/// outage a POST is read and not forwarded (closed, answered 503, or held) while a GET passes;
/// `Refused` refuses connections and closes the one kept alive; passing again, it forwards again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fault_proxy_forwards_exactly_and_keeps_posts_from_the_server_in_an_outage() {
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    use sendledger_tests::fault_proxy::{FaultProxy, Mode};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    // The answer, chunked, with a trailer: the proxy must forward it as it is.
    const ANSWER: &[u8] = b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n7\r\n{\"id\": \r\n2;ext=1\r\n42\r\n1\r\n}\r\n0\r\nx-trailer: t\r\n\r\n";
    let received: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = server.local_addr().unwrap();
    let seen = received.clone();
    tokio::spawn(async move {
        loop {
            let (mut conn, _) = server.accept().await.unwrap();
            let seen = seen.clone();
            tokio::spawn(async move {
                // One request per connection (the proxy opens one for each): everything up to
                // the end of its head and its Content-Length body.
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let n = conn.read(&mut chunk).await.unwrap();
                    assert!(n > 0, "the proxy closed mid-request");
                    buf.extend_from_slice(&chunk[..n]);
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    if buf.len() >= end + 4 + length {
                        break;
                    }
                }
                seen.lock().unwrap().push(buf);
                conn.write_all(ANSWER).await.unwrap();
            });
        }
    });
    let proxy = FaultProxy::start(upstream).await.unwrap();
    let post = b"POST /orders HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 17\r\n\r\n{\"reference\":\"r\"}";
    let get = b"GET /orders?reference=r HTTP/1.1\r\nhost: x\r\n\r\n";
    let deadline = || Instant::now() + std::time::Duration::from_secs(10);

    // Reads exactly `ANSWER`'s length from `conn`.
    async fn answer(conn: &mut TcpStream) -> Vec<u8> {
        let mut got = vec![0u8; ANSWER.len()];
        conn.read_exact(&mut got).await.unwrap();
        got
    }
    // Waits until the proxy has read `posts` POSTs in all.
    let posts_read = |posts: u64| {
        let until = deadline();
        let proxy = &proxy;
        async move {
            while proxy.counts().posts < posts {
                assert!(Instant::now() < until, "the proxy never read the POST");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    };

    // Pass: a POST then a GET on one kept-alive connection, both ways byte for byte.
    let mut kept = TcpStream::connect(proxy.addr()).await.unwrap();
    kept.write_all(post).await.unwrap();
    assert_eq!(answer(&mut kept).await, ANSWER);
    kept.write_all(get).await.unwrap();
    assert_eq!(answer(&mut kept).await, ANSWER);
    assert_eq!(*received.lock().unwrap(), vec![post.to_vec(), get.to_vec()]);

    // Each POST kind: the POST is read and never reaches the server; a GET still passes.
    for mode in [Mode::DropPosts, Mode::Answer503, Mode::HangPosts] {
        proxy.set_mode(mode).await.unwrap();
        let before = proxy.counts();
        let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
        conn.write_all(post).await.unwrap();
        posts_read(before.posts + 1).await;
        match mode {
            Mode::DropPosts => {
                let mut rest = Vec::new();
                conn.read_to_end(&mut rest).await.unwrap();
                assert!(rest.is_empty(), "{mode:?}: answered {rest:?}");
            }
            Mode::Answer503 => {
                let mut got = vec![0u8; 12];
                conn.read_exact(&mut got).await.unwrap();
                assert_eq!(got, b"HTTP/1.1 503");
            }
            _ => {
                let mut byte = [0u8; 1];
                assert!(
                    matches!(conn.try_read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
                    "a hung POST is held, unanswered"
                );
            }
        }
        let mut other = TcpStream::connect(proxy.addr()).await.unwrap();
        other.write_all(get).await.unwrap();
        assert_eq!(answer(&mut other).await, ANSWER, "{mode:?}: a GET passes");
        assert_eq!(proxy.counts().posts_forwarded, before.posts_forwarded);
        assert_eq!(received.lock().unwrap().len(), 3, "{mode:?}");
        received.lock().unwrap().pop();
    }

    // Refused: the kept-alive connection is closed and new ones are refused.
    proxy.set_mode(Mode::Refused).await.unwrap();
    let mut rest = Vec::new();
    let _ = kept.read_to_end(&mut rest).await;
    assert!(rest.is_empty());
    let refused = TcpStream::connect(proxy.addr()).await.unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);

    // Back: it listens and forwards again.
    proxy.set_mode(Mode::Pass).await.unwrap();
    let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
    conn.write_all(post).await.unwrap();
    assert_eq!(answer(&mut conn).await, ANSWER);
    assert_eq!(received.lock().unwrap().last().unwrap(), post);
}
