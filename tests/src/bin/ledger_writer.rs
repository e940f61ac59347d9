//! Child process of the ledger crash test: appends from many threads until it is killed,
//! printing `ack <lsn> <task> <seq>` for every append the ledger acknowledged.
//!
//! Usage: `ledger_writer DIR THREADS`

use std::io::Write;
use std::sync::Mutex;

use sendledger_store::{Append, Ledger, LedgerOptions};
use sendledger_tests::{crash_event, crash_task};

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args.next().expect("usage: ledger_writer DIR THREADS");
    let threads: u32 = args.next().and_then(|t| t.parse().ok()).expect("THREADS");
    let ledger = Ledger::open(&dir, LedgerOptions::default()).expect("open ledger");
    let out = Mutex::new(std::io::stdout());
    writeln!(out.lock().unwrap(), "ready {}", ledger.last_lsn()).unwrap();
    std::thread::scope(|s| {
        for task in 0..threads {
            let (ledger, out) = (&ledger, &out);
            s.spawn(move || {
                let mut seq = ledger
                    .task_events(crash_task(task))
                    .expect("read task")
                    .len() as u32;
                loop {
                    // Two events per append, so atomicity of a multi-event append is tested too.
                    let events = vec![crash_event(task, seq, 1), crash_event(task, seq + 1, 1)];
                    let lsns = ledger
                        .append_blocking(Append {
                            events,
                            ..Append::default()
                        })
                        .expect("append");
                    let mut out = out.lock().unwrap();
                    for (i, lsn) in lsns.enumerate() {
                        writeln!(out, "ack {lsn} {task} {}", seq + i as u32).unwrap();
                    }
                    out.flush().unwrap();
                    seq += 2;
                }
            });
        }
    });
}
