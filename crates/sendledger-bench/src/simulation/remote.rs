//! The simulation's third-party API: records created by business key, responses that get
//! lost, and lookups that see a record only some time after it was created (eventual
//! consistency).

use std::collections::BTreeMap;

/// A record the remote created.
#[derive(Debug, Clone)]
pub struct Record {
    pub id: String,
    /// When lookups start to see it.
    pub visible_at: u64,
}

/// The remote: its records by business key (the task's request key).
#[derive(Debug, Default)]
pub struct Remote {
    records: BTreeMap<String, Vec<Record>>,
    created: u64,
}

impl Remote {
    /// Creates a record for `key` at `now`, seen by lookups from `now + lag`.
    pub fn create(&mut self, key: &str, now: u64, lag: u64) -> String {
        self.created += 1;
        let id = format!("rec-{}", self.created);
        self.records
            .entry(key.to_string())
            .or_default()
            .push(Record {
                id: id.clone(),
                visible_at: now + lag,
            });
        id
    }

    /// The ids a lookup for `key` asked at `now` finds.
    pub fn lookup(&self, key: &str, now: u64) -> Vec<String> {
        (self.records.get(key).into_iter().flatten())
            .filter(|r| r.visible_at <= now)
            .map(|r| r.id.clone())
            .collect()
    }

    /// Every record, by key.
    pub fn records(&self) -> &BTreeMap<String, Vec<Record>> {
        &self.records
    }
}
