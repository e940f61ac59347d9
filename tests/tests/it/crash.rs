//! The ledger survives SIGKILL at random moments: acknowledged appends are never lost, LSNs stay
//! contiguous, and no partial write is ever visible.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use sendledger_store::{Ledger, LedgerOptions};
use sendledger_tests::{crash_body, crash_task};

const CYCLES: usize = 30;
const THREADS: u32 = 8;

#[test]
fn acknowledged_appends_survive_sigkill() {
    let seed = crate::seed(0x5eed_1ed9);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let mut acked: BTreeMap<u64, (u32, u32)> = BTreeMap::new();
    let mut acks_per_cycle = Vec::new();

    for cycle in 0..CYCLES {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ledger_writer"))
            .arg(dir.path())
            .arg(THREADS.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut acks = Vec::new();
            for line in stdout.lines() {
                let line = line.unwrap();
                let mut parts = line.split(' ');
                match parts.next() {
                    Some("ready") => {}
                    Some("ack") => {
                        let mut n = || parts.next().unwrap().parse::<u64>().unwrap();
                        acks.push((n(), n() as u32, n() as u32));
                        if acks.len() == 1 {
                            // Appends are flowing: the kill lands in the middle of them.
                            ready_tx.send(()).unwrap();
                        }
                    }
                    other => panic!("unexpected output {other:?}"),
                }
            }
            acks
        });
        ready_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("writer did not start");
        let wait_ms = rng.random_range(5..250);
        std::thread::sleep(Duration::from_millis(wait_ms));
        // SIGKILL: no destructor, no flush, the journal is cut wherever it is.
        child.kill().unwrap();
        child.wait().unwrap();
        let acks = reader.join().unwrap();
        acks_per_cycle.push(acks.len());
        for (lsn, task, seq) in acks {
            assert!(
                acked.insert(lsn, (task, seq)).is_none(),
                "lsn {lsn} acknowledged twice"
            );
        }
        verify(dir.path(), &acked, cycle);
    }
    // The kills landed while appends were going on, not before the first one.
    assert!(
        acks_per_cycle.iter().filter(|n| **n > 0).count() >= CYCLES / 2,
        "{acks_per_cycle:?}"
    );
    eprintln!("acknowledged appends per cycle: {acks_per_cycle:?}");
}

fn verify(dir: &std::path::Path, acked: &BTreeMap<u64, (u32, u32)>, cycle: usize) {
    let ledger = Ledger::open(dir, LedgerOptions::default()).unwrap();
    let last = ledger.last_lsn();
    let mut per_task: BTreeMap<u32, u32> = BTreeMap::new();
    let tasks: BTreeMap<_, _> = (0..THREADS).map(|t| (crash_task(t), t)).collect();
    let mut expected_lsn = 1;
    for event in ledger.log_from(1) {
        let event = event.unwrap_or_else(|e| panic!("cycle {cycle}: undecodable event: {e}"));
        assert_eq!(event.lsn, expected_lsn, "cycle {cycle}: LSN gap");
        expected_lsn += 1;
        let task = tasks[&event.task_id];
        let seq = per_task.entry(task).or_default();
        assert_eq!(
            event.task_seq, *seq,
            "cycle {cycle}: task {task} sequence gap at lsn {}",
            event.lsn
        );
        assert_eq!(
            event.body,
            crash_body(task, *seq),
            "cycle {cycle}: damaged event at lsn {}",
            event.lsn
        );
        *seq += 1;
    }
    assert_eq!(
        expected_lsn - 1,
        last,
        "cycle {cycle}: last_lsn disagrees with the log"
    );
    for (task, count) in &per_task {
        // Appends carry two events each: an odd count would be half an append.
        assert_eq!(
            count % 2,
            0,
            "cycle {cycle}: task {task} has a partial append"
        );
        assert_eq!(
            ledger.task_events(crash_task(*task)).unwrap().len() as u32,
            *count,
            "index disagrees with log"
        );
    }
    for (lsn, (task, seq)) in acked {
        assert!(
            *lsn <= last,
            "cycle {cycle}: acknowledged lsn {lsn} lost (last is {last})"
        );
        let event = &ledger.read_log(*lsn, 1).unwrap()[0];
        assert_eq!(
            (event.task_id, event.task_seq),
            (crash_task(*task), *seq),
            "cycle {cycle}: lsn {lsn}"
        );
    }
}
