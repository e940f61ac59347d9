//! Child process of the engine kill tests: starts an engine on a ledger, submits tasks
//! `<prefix>-0 .. <prefix>-<count-1>` (again after a restart, as Kafka would redeliver), waits
//! until every one is settled, prints `settled`, and exits. The parent SIGKILLs it at random
//! moments in between.
//!
//! Usage: `engine_child LEDGER_DIR TARGET_JSON PREFIX COUNT SEED`. `TARGET_JSON` is the one
//! target `sim` the tasks go to, or `{"targets": {...}, "sagas": {...}, "target": NAME}`:
//! several targets, sagas, and the target or saga the tasks name.

use std::sync::Arc;
use std::time::Duration;

use sendledger_actors::{Engine, EngineConfig};
use sendledger_node::wiring::HttpRemote;
use sendledger_tests::engine::{child_targets, request, settled, source};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, dir, target, prefix, count, seed] = &args[..] else {
        panic!("usage: engine_child LEDGER_DIR TARGET_JSON PREFIX COUNT SEED");
    };
    let count: i64 = count.parse().expect("COUNT");
    let (targets, name) = child_targets(target);
    let mut config = EngineConfig::new(dir);
    config.seed = seed.parse().expect("SEED");
    config.timer_tick = Duration::from_millis(5);
    let remote = Arc::new(HttpRemote::new(targets));
    let engine =
        tokio::task::block_in_place(|| Engine::start(config, remote)).expect("engine starts");
    println!("started");

    let mut submits = tokio::task::JoinSet::new();
    for i in 0..count {
        let engine: Engine = engine.clone();
        let key = format!("{prefix}-{i}");
        let mut request = request(&key);
        request.target.clone_from(&name);
        submits.spawn(async move { engine.submit(request, source(i)).await.map(|_| ()) });
        while submits.len() >= 256 {
            submits.join_next().await.unwrap().unwrap().expect("submit");
        }
    }
    while let Some(r) = submits.join_next().await {
        r.unwrap().expect("submit");
    }
    println!("submitted");

    loop {
        let mut open = 0;
        for i in 0..count {
            let task = sendledger_tests::engine::task_id(&format!("{prefix}-{i}"));
            if !settled(&engine.state(task).await.expect("state")) {
                open += 1;
            }
        }
        if open == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("settled");
    engine.shutdown(Duration::from_secs(5)).await;
}
