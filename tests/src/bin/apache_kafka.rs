//! Apache Kafka for the scripts (benchmarks, soaks by hand): `apache_kafka single` starts one
//! combined broker and controller, `apache_kafka cluster` three (the harness's
//! `sendledger_tests::broker`), prints `ready bootstrap=HOST:PORT,...` once they answer, and
//! keeps them until its standard input closes (the script that started it ended), then stops
//! them. Needs `SENDLEDGER_KAFKA_LIBS`, which `scripts/prereqs`'s `ensure_kafka` sets.

use std::io::Read;
use std::process::ExitCode;

use sendledger_tests::broker::Broker;

fn main() -> ExitCode {
    let broker = match std::env::args().nth(1).as_deref() {
        Some("single") => Broker::single(),
        Some("cluster") => Broker::cluster(),
        _ => {
            eprintln!("usage: apache_kafka single|cluster (the brokers stop when stdin closes)");
            return ExitCode::from(2);
        }
    };
    println!("ready bootstrap={}", broker.bootstrap());
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    drop(broker);
    ExitCode::SUCCESS
}
