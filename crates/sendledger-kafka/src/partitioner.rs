//! Where a producer puts a keyed record: the partitioners of Kafka's clients, computed the way
//! they compute them, so that kafka mode can check that a request arrived on the partition its
//! key belongs to (a request on another partition would have a second owner, who does not know
//! its task, and could run it again).
//!
//! - [`Partitioner::Murmur2`]: the Java client's default (`Utils.murmur2`, the sign bit
//!   cleared, modulo the partition count), and librdkafka's `murmur2` and `murmur2_random`.
//! - [`Partitioner::Consistent`]: librdkafka's default, `consistent_random` (and
//!   `consistent`): CRC-32 of the key, modulo the partition count.
//! - [`Partitioner::Fnv1a`]: librdkafka's `fnv1a` and `fnv1a_random` (Sarama's hash
//!   partitioner): 32-bit FNV-1a, its absolute value as a signed number, modulo the count.
//!
//! The `_random` variants differ from the others only for a record without a key, which kafka
//! mode refuses anyway. Each function is checked against librdkafka's own partitioners in the
//! tests below (records produced to the embedded cluster land where [`Partitioner::partition`]
//! says), and murmur2 against the Java client's published values.

use serde::{Deserialize, Serialize};

/// The partitioner the producers of the requests topic use (`kafka.partitioner`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Partitioner {
    /// Kafka's Java client's default, librdkafka's `murmur2_random`.
    #[default]
    #[serde(alias = "murmur2_random")]
    Murmur2,
    /// librdkafka's default, `consistent_random` (CRC-32).
    #[serde(alias = "consistent_random")]
    Consistent,
    /// librdkafka's `fnv1a_random` (FNV-1a, as Sarama's hash partitioner).
    #[serde(alias = "fnv1a_random")]
    Fnv1a,
}

impl Partitioner {
    /// The partition of `partitions` a record keyed `key` goes to.
    pub fn partition(self, key: &[u8], partitions: i32) -> i32 {
        assert!(partitions > 0, "a topic has at least one partition");
        let hash = match self {
            Partitioner::Murmur2 => murmur2(key) & 0x7fff_ffff,
            Partitioner::Consistent => crc32fast::hash(key),
            Partitioner::Fnv1a => fnv1a(key),
        };
        let partition = (hash % partitions as u32) as i32;
        debug_assert!((0..partitions).contains(&partition));
        partition
    }

    /// librdkafka's name of this partitioner (its `partitioner` property), for the producers
    /// sendledger creates.
    pub fn librdkafka_name(self) -> &'static str {
        match self {
            Partitioner::Murmur2 => "murmur2_random",
            Partitioner::Consistent => "consistent_random",
            Partitioner::Fnv1a => "fnv1a_random",
        }
    }

    /// The configuration's name of this partitioner.
    pub fn name(self) -> &'static str {
        match self {
            Partitioner::Murmur2 => "murmur2",
            Partitioner::Consistent => "consistent",
            Partitioner::Fnv1a => "fnv1a",
        }
    }
}

/// MurmurHash2 as Kafka's clients compute it: seed `0x9747b28c`, the key read in little-endian
/// 32-bit words.
fn murmur2(data: &[u8]) -> u32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h = SEED ^ data.len() as u32;
    let mut words = data.chunks_exact(4);
    for word in &mut words {
        let mut k = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M) ^ k;
    }
    let tail = words.remainder();
    if !tail.is_empty() {
        for (i, byte) in tail.iter().enumerate().rev() {
            h ^= u32::from(*byte) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^ (h >> 15)
}

/// 32-bit FNV-1a, then the absolute value of the hash read as a signed number (librdkafka's
/// `rd_fnv1a`, after Sarama).
fn fnv1a(data: &[u8]) -> u32 {
    const OFFSET: u32 = 0x811c_9dc5;
    const PRIME: u32 = 0x0100_0193;
    let h = data
        .iter()
        .fold(OFFSET, |h, b| (h ^ u32::from(*b)).wrapping_mul(PRIME));
    (h as i32).wrapping_abs() as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::EmbeddedCluster;
    use rdkafka::producer::{FutureProducer, FutureRecord};
    use rdkafka::ClientConfig;
    use std::time::Duration;

    /// The Java client's `Utils.murmur2` of these keys, as librdkafka's unit test lists them.
    #[test]
    fn murmur2_is_the_java_clients() {
        let java: [(&str, u32); 6] = [
            ("kafka", 0xd067_cf64),
            ("giberish123456789", 0x8f55_2b0c),
            ("1234", 0x9fc9_7b14),
            ("234", 0xe7c0_09ca),
            ("PreAmbleWillBeRemoved,ThePrePartThatIs", 0x7842_4f1c),
            ("", 0x106e_08d9),
        ];
        for (key, hash) in java {
            assert_eq!(murmur2(key.as_bytes()), hash, "{key:?}");
        }
    }

    /// Records produced by librdkafka with each partitioner land where `partition` says, for
    /// keys of every length from 1 to 40 bytes, on topics of 1, 7 and 64 partitions.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_partitioner_places_keys_where_librdkafka_does() {
        let counts = [1, 7, 64];
        let topics: Vec<(String, i32)> = counts.iter().map(|n| (format!("p{n}"), *n)).collect();
        let cluster = EmbeddedCluster::start(1, &topics).unwrap();
        let keys: Vec<String> = (1..=40)
            .map(|len| {
                (0..len)
                    .map(|i| char::from(b'!' + ((i * 31 + len * 7) % 90) as u8))
                    .collect()
            })
            .chain(["acme/payment.create/k-1".into(), "t/o/%2F".into()])
            .collect();
        for partitioner in [
            Partitioner::Murmur2,
            Partitioner::Consistent,
            Partitioner::Fnv1a,
        ] {
            let producer: FutureProducer = ClientConfig::new()
                .set("bootstrap.servers", cluster.bootstrap_servers())
                .set("partitioner", partitioner.librdkafka_name())
                .create()
                .unwrap();
            for (topic, n) in &topics {
                for key in &keys {
                    let record = FutureRecord::to(topic).key(key.as_str()).payload("x");
                    let delivery = producer
                        .send(record, Duration::from_secs(10))
                        .await
                        .map_err(|(e, _)| e)
                        .unwrap();
                    assert_eq!(
                        partitioner.partition(key.as_bytes(), *n),
                        delivery.partition,
                        "{partitioner:?} of {key:?} over {n} partitions"
                    );
                }
            }
        }
    }
}
