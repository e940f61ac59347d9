//! The CPU that one task's Kafka I/O costs on its own, with none of the service's work: consume
//! its request from an embedded (librdkafka mock) cluster, produce its three event records and
//! its result with seven headers each through an idempotent producer (`linger.ms` 5, as the
//! publisher's), and wait for every acknowledgement. What `sendledger-bench kafka` measures adds this to
//! the engine's work; this is the least it can add.
//!
//!     cargo run --release -p sendledger-kafka --example kafka_io_floor -- [tasks]
//!
//! Prints the CPU time per task of two rounds of `tasks` tasks in one process (the second with
//! the process's memory already touched), each round's requests produced before it is timed.
// One `unsafe` call: `getrusage`, for the process's CPU time.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PARTITIONS: i32 = 4;

/// Counts acknowledged records; any failed delivery ends the run.
#[derive(Default)]
struct Acks(AtomicU64);

impl ClientContext for Acks {}

impl ProducerContext for Acks {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            panic!("a record was not delivered: {e}");
        }
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

fn cpu_secs() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

fn producer(bootstrap: &str) -> BaseProducer<Acks> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("message.timeout.ms", "0")
        .set("linger.ms", "5")
        .create_with_context(Acks::default())
        .expect("a producer")
}

/// Hands `record` to `producer`, serving its queue while it is full.
fn send(producer: &BaseProducer<Acks>, mut record: BaseRecord<'_, str, [u8]>) {
    while let Err((_, r)) = producer.send(record) {
        record = r;
        producer.poll(Duration::from_millis(1));
    }
}

fn main() {
    let tasks: u64 = match std::env::args().nth(1).map(|a| a.parse()) {
        None => 20_000,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("usage: kafka_io_floor [tasks, a positive number]");
            std::process::exit(2);
        }
    };
    let cluster = MockCluster::new(1).expect("an embedded cluster");
    for topic in ["requests", "events", "results"] {
        cluster.create_topic(topic, PARTITIONS, 1).expect("a topic");
    }
    let bootstrap = cluster.bootstrap_servers();
    let seed = producer(&bootstrap);
    let publisher = producer(&bootstrap);
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "kafka-io-floor")
        .set("enable.auto.commit", "false")
        // As the service's consumers of the embedded cluster are configured.
        .set("fetch.wait.max.ms", "10")
        .set("queued.max.messages.kbytes", "16384")
        .set("fetch.queue.backoff.ms", "20")
        .create()
        .expect("a consumer");
    let mut assignment = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        assignment
            .add_partition_offset("requests", p, Offset::Beginning)
            .expect("a partition");
    }
    consumer.assign(&assignment).expect("an assignment");
    // Sizes of the benchmark's records: an event about 420 bytes, a result about 330.
    let (event, result) = (vec![b'e'; 420], vec![b'r'; 330]);
    let mut consumed = 0;
    for round in 1..=2u64 {
        // Nothing is fetched before the round is timed.
        consumer.pause(&assignment).expect("paused");
        for i in (round - 1) * tasks..round * tasks {
            let key = format!("bench/payment.create/ord-{i}");
            let value = format!(
                r#"{{"tenant":"bench","operation":"payment.create","request_key":"ord-{i}","target":"payments","payload":{{"amount":1250,"currency":"EUR","customer":"c-8812","order":{i}}}}}"#
            );
            send(
                &seed,
                BaseRecord::to("requests")
                    .key(key.as_str())
                    .payload(value.as_bytes()),
            );
        }
        seed.flush(Duration::from_secs(30))
            .expect("requests produced");
        let (cpu, wall) = (cpu_secs(), Instant::now());
        consumer.resume(&assignment).expect("resumed");
        while consumed < round * tasks {
            publisher.poll(Duration::ZERO);
            let Some(message) = consumer.poll(Duration::from_millis(1)) else {
                continue;
            };
            let message = message.expect("a request");
            let key = std::str::from_utf8(message.key().unwrap_or_default()).expect("a key");
            consumed += 1;
            for (seq, topic, payload) in [
                (0, "events", &event),
                (1, "events", &event),
                (2, "events", &event),
                (3, "results", &result),
            ] {
                let id = format!("0123456789abcdef0123456789abcdef:{seq}");
                let headers = [
                    ("sendledger-event-id", id.as_str()),
                    ("ce_specversion", "1.0"),
                    ("ce_id", &id),
                    ("ce_source", "/sendledger/sendledger/events"),
                    ("ce_type", "sendledger.event.SendIntended"),
                    ("ce_time", "2026-12-03T16:40:00.123Z"),
                    ("content-type", "application/json"),
                ]
                .into_iter()
                .fold(OwnedHeaders::new_with_capacity(7), |h, (key, value)| {
                    h.insert(Header {
                        key,
                        value: Some(value),
                    })
                });
                let record = BaseRecord::to(topic)
                    .key(key)
                    .payload(payload.as_slice())
                    .headers(headers);
                send(&publisher, record);
            }
        }
        while publisher.context().0.load(Ordering::Relaxed) < 4 * round * tasks {
            publisher.poll(Duration::from_millis(1));
        }
        let (cpu, wall) = (cpu_secs() - cpu, wall.elapsed().as_secs_f64());
        println!(
            "{{\"round\":{round},\"tasks\":{tasks},\"records\":{},\"tasks_per_sec\":{:.0},\"cpu_us_per_task\":{:.1}}}",
            4 * tasks,
            tasks as f64 / wall,
            cpu * 1e6 / tasks as f64
        );
    }
}
