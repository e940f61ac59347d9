//! How a ledger is opened: its durability and the memory RocksDB may keep for it.

use rocksdb::{
    BlockBasedIndexType, BlockBasedOptions, Cache, LruCacheOptions, Options, WriteBufferManager,
};

/// Whether an acknowledged append survives a power loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// Each write batch is fsynced before any append in it is acknowledged.
    #[default]
    Sync,
    /// No fsync: acknowledged appends survive a process crash but may be lost on power loss
    /// or an OS crash. Unsafe for production; used to measure the cost of durability.
    Buffered,
}

#[derive(Debug, Clone, Default)]
pub struct LedgerOptions {
    pub durability: Durability,
    pub memory: Memory,
    /// Kafka mode: events are recorded only once a [`Replicator`] made them durable in the
    /// log of record (installed with [`Ledger::install_replicator`]; until then appends of
    /// events are refused as not replicated).
    pub replicated: bool,
    /// Where retention archives what it removes before removing it (`crate::archive`).
    pub archive: Option<std::path::PathBuf>,
}

/// The memory RocksDB may keep for one ledger, shared by every column family: one block cache
/// of `bytes` (index and filter blocks included), with the memtables (write buffers) charged to
/// it and flushed once they pass half of it. Reads beyond it come from the OS page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    pub bytes: usize,
}

impl Default for Memory {
    fn default() -> Self {
        Memory {
            bytes: 64 * 1024 * 1024,
        }
    }
}

impl Memory {
    /// The smallest budget accepted: below it RocksDB would flush tiny memtables constantly.
    pub const MIN_BYTES: usize = 4 * 1024 * 1024;

    /// The budget in effect: `bytes`, and at least [`Memory::MIN_BYTES`].
    pub fn budget(self) -> usize {
        self.bytes.max(Self::MIN_BYTES)
    }

    /// Shards of the block cache: as many as leave each at least 8 MiB, at most 64.
    pub(crate) fn cache_shard_bits(bytes: usize) -> i32 {
        (bytes / (8 << 20)).max(1).ilog2().min(6) as i32
    }

    /// RocksDB options sharing one cache and one write budget, and those of each family.
    pub(crate) fn rocksdb_options(self) -> (Options, Options, Cache, WriteBufferManager) {
        let bytes = self.budget();
        // RocksDB splits an LRU cache into shards by key hash, 64 of them by default for this
        // size: a 64 MiB cache held 1 MiB a shard, less than one unpartitioned filter block of
        // a large table file, so such blocks were read again at nearly every lookup. Shards of
        // at least 8 MiB (and the partitioned blocks below) keep them cached.
        let mut lru = LruCacheOptions::default();
        lru.set_capacity(bytes);
        lru.set_num_shard_bits(Self::cache_shard_bits(bytes));
        let cache = Cache::new_lru_cache_opts(&lru);
        let buffers = WriteBufferManager::new_write_buffer_manager_with_cache(
            bytes / 2,
            false,
            cache.clone(),
        );
        let mut db = Options::default();
        db.set_write_buffer_manager(&buffers);
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&cache);
        // Index and filter blocks count against the cache too, instead of growing with the data.
        table.set_cache_index_and_filter_blocks(true);
        table.set_pin_l0_filter_and_index_blocks_in_cache(true);
        // Most point reads miss: a new request's identity, a restored task's summary. A
        // filter (about 10 bits a key) answers those without reading a block of each file,
        // and one in the memtable without searching it.
        table.set_bloom_filter(10.0, false);
        // A table file's index and filter are cut into blocks of about 4 KiB, with a small
        // top-level index kept in the cache: a lookup reads the parts it needs instead of the
        // whole index and filter of a 64 MiB file (megabytes, read and checksummed again each
        // time they were evicted).
        table.set_index_type(BlockBasedIndexType::TwoLevelIndexSearch);
        table.set_partition_filters(true);
        table.set_metadata_block_size(4096);
        table.set_pin_top_level_index_and_filter(true);
        table.set_cache_index_and_filter_blocks_with_high_priority(true);
        let mut family = Options::default();
        family.set_block_based_table_factory(&table);
        family.set_write_buffer_size(bytes / 8);
        family.set_memtable_prefix_bloom_ratio(0.02);
        family.set_memtable_whole_key_filtering(true);
        (db, family, cache, buffers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_shards_hold_at_least_8_mib() {
        let mib = 1 << 20;
        for (bytes, bits) in [(4 * mib, 0), (16 * mib, 1), (64 * mib, 3), (1 << 30, 6)] {
            assert_eq!(Memory::cache_shard_bits(bytes), bits, "{bytes}");
        }
    }
}
