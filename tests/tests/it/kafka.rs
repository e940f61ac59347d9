//! The whole pipeline over the Kafka protocol, in local mode: requests produced to the
//! requests topic, the ingest feeding a real engine (RocksDB in a temporary directory) that
//! calls the simulated remote over real sockets, and the publisher writing results and events
//! back to Kafka. Every test checks the records at the remote, the events in the ledger and the
//! records on the topics.
//!
//! - `embedded`: on librdkafka's embedded mock cluster, in this process;
//! - `broker`: against Apache Kafka (one broker);
//! - `security`: Kafka over TLS and SASL;
//! - `schema`: the JSON Schemas of the Kafka payloads against the service;
//! - `access`: requests bound to their tenant (signatures, allowed targets).
//!
//! The harness they share (brokers, relays, producing, reading back, the assertions) is
//! `sendledger_tests::kafka`. Kafka mode, where the events topic is the log of record, is
//! tested in `log` and `cluster`.

mod access;
mod breaker;
mod broker;
mod embedded;
mod schema;
mod security;
