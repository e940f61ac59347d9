//! Child process of the admin tests: a service with the metrics recorder installed, an engine
//! on a ledger with the one target `sim`, and the admin endpoint on a free loopback port. It is
//! a process of its own because the metrics recorder is process-wide: here it sees this engine
//! only, so the test can assert exact values.
//!
//! Prints `admin ADDR`, then reads commands on stdin, one per line: `submit KEY` (prints
//! `submitted KEY EVENTS`). When stdin closes it shuts the endpoint and the engine down, prints
//! `stopped`, and exits.
//!
//! Usage: `admin_child LEDGER_DIR TARGET_JSON TOKEN`

use std::time::Duration;

use sendledger::admin::{install_recorder, Admin};
use sendledger_tests::engine::{request, source, start};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, dir, target, token] = &args[..] else {
        panic!("usage: admin_child LEDGER_DIR TARGET_JSON TOKEN");
    };
    let metrics = install_recorder().expect("recorder installs");
    let engine = start(
        std::path::Path::new(dir),
        serde_json::from_str(target).expect("TARGET_JSON"),
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let listen = ([127, 0, 0, 1], 0).into();
    let admin = runtime
        .block_on(Admin::start(
            listen,
            Some(token.clone()),
            engine.clone(),
            metrics,
        ))
        .expect("admin endpoint starts");
    println!("admin {}", admin.local_addr());
    for (offset, line) in std::io::stdin().lines().enumerate() {
        let line = line.expect("stdin");
        let key = line
            .strip_prefix("submit ")
            .expect("a `submit KEY` command");
        let reply = runtime
            .block_on(engine.submit(request(key), source(offset as i64)))
            .expect("submitted");
        println!("submitted {key} {}", reply.events.join(","));
    }
    runtime.block_on(async {
        admin.shutdown().await;
        engine.shutdown(Duration::from_secs(5)).await;
    });
    println!("stopped");
}
