//! Retention: removing the history of a settled task and keeping a [`Retained`] of it
//! (`docs/operating/retention.md`).
//!
//! A task is removed by the writer of its events (its actor), through the journal, in one
//! batch: its log entries, its per-task index, its identity and its task-index entry go, its
//! [`Retained`] is written to the `retained` column family, and the ledger's [`PrunedTotals`]
//! count what went (the audit accounts for every LSN missing from the log with them). Its
//! summary stays, so start-up and reads know the task. Reads of its events give the
//! [`Retained`] as one `Pruned` event at `task_seq` 0, then any events recorded after it.
//!
//! What may be removed ([`crate::Ledger::prune_plan`]): a task settled with a terminal result
//! ([`Retained::of`]), that entered its terminal phase before the cutoff, whose every event is
//! published (at or below each named cursor). Never a task in progress, in review or with an
//! unpublished result.

use sendledger_core::event::Millis;
use sendledger_core::{Retained, TaskId};
use sha2::{Digest as _, Sha256};

use crate::error::{Error, Result};
use crate::keys::*;
use crate::task_index::IndexEntry;

/// The envelope version of a `retained` value written before format 6: bincode of
/// [`Retained`].
// format: do not change
const RETAINED_V1: u8 = 1;
/// Format 6: the [`removed_digest`] of the events removed (32 bytes), then bincode of
/// [`Retained`].
// format: do not change
const RETAINED_V2: u8 = 2;
/// Request versions: as [`RETAINED_V2`], with [`Retained::request_version`] at the end of the
/// bincode.
// format: do not change
const RETAINED_V3: u8 = 3;

pub(crate) fn encode_retained(retained: &Retained, digest: &Digest) -> Vec<u8> {
    let mut out = Vec::with_capacity(160);
    out.push(RETAINED_V3);
    out.extend_from_slice(digest);
    bincode::serialize_into(&mut out, retained).expect("bincode into Vec is infallible");
    out
}

/// A `retained` value: what was kept, and the digest of the events removed (none in a value
/// written before format 6).
pub(crate) fn decode_retained(bytes: &[u8]) -> Result<(Retained, Option<Digest>)> {
    let bad = || Error::BadValue { what: "retained" };
    let (version, digest, rest) = match bytes.split_first() {
        Some((&RETAINED_V1, rest)) => (RETAINED_V1, None, rest),
        Some((&version @ (RETAINED_V2 | RETAINED_V3), rest)) if rest.len() >= 32 => {
            let (digest, rest) = rest.split_at(32);
            (version, Some(digest.try_into().expect("32 bytes")), rest)
        }
        _ => return Err(bad()),
    };
    let retained = match version {
        RETAINED_V3 => bincode::deserialize(rest),
        // Written before request versions: the same fields without the last, which bincode
        // writes as four bytes (a u32, little-endian); those entries are of version 0.
        _ => bincode::deserialize(&[rest, &[0; 4]].concat()),
    };
    Ok((retained.map_err(|_| bad())?, digest))
}

/// A SHA-256 digest.
pub type Digest = [u8; 32];

/// The digest of the events removed from a task: of what an earlier removal of it removed
/// (`previous`, zeros for the first), then of each event removed now, by LSN and stored bytes.
/// So the digest kept with a task covers every event ever removed from it, and an archive's
/// copies of them can be checked against it.
// format: do not change
pub fn removed_digest(previous: Option<&Digest>, events: &[(u64, Vec<u8>)]) -> Digest {
    let mut h = Sha256::new();
    h.update(b"sendledger removed events v1");
    h.update(previous.unwrap_or(&[0; 32]));
    for (lsn, bytes) in events {
        h.update(lsn.to_be_bytes());
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    }
    h.finalize().into()
}

/// What one `retained` entry adds to [`Chain::kept_sum`].
// format: do not change
pub(crate) fn leaf(task: TaskId, value: &[u8]) -> Digest {
    let mut h = Sha256::new();
    h.update(b"sendledger retained v1");
    h.update(task.0);
    h.update(value);
    h.finalize().into()
}

/// `a + b` modulo 2^256, both big-endian.
pub(crate) fn add(a: &Digest, b: &Digest) -> Digest {
    let mut out = [0u8; 32];
    let mut carry = 0u16;
    for i in (0..32).rev() {
        let sum = a[i] as u16 + b[i] as u16 + carry;
        out[i] = sum as u8;
        carry = sum >> 8;
    }
    out
}

/// `a - b` modulo 2^256, both big-endian.
pub(crate) fn sub(a: &Digest, b: &Digest) -> Digest {
    let mut negated = [0u8; 32];
    for (n, x) in negated.iter_mut().zip(b) {
        *n = !x;
    }
    let mut one = [0u8; 32];
    one[31] = 1;
    add(a, &add(&negated, &one))
}

/// The ledger's record of its removals, checked by the audit (`docs/operating/retention.md`,
/// "Audit across retention"): every write that removes or forgets tasks is a checkpoint, and
/// the checkpoints form a hash chain; `kept_sum` is the sum of the [`leaf`] of every
/// `retained` entry, so a kept entry changed, added or deleted without a checkpoint shows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Chain {
    /// Checkpoints written (the last one's sequence number).
    pub seq: u64,
    /// The last checkpoint's [`Checkpoint::head`].
    pub head: Digest,
    pub kept_sum: Digest,
}

impl Chain {
    // format: do not change
    pub(crate) fn encode(&self) -> [u8; 72] {
        let mut v = [0u8; 72];
        v[..8].copy_from_slice(&self.seq.to_be_bytes());
        v[8..40].copy_from_slice(&self.head);
        v[40..].copy_from_slice(&self.kept_sum);
        v
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Chain> {
        let bad = || Error::BadValue {
            what: "prune-chain",
        };
        if bytes.len() != 72 {
            return Err(bad());
        }
        Ok(Chain {
            seq: decode_u64(&bytes[..8]).ok_or_else(bad)?,
            head: bytes[8..40].try_into().expect("32 bytes"),
            kept_sum: bytes[40..].try_into().expect("32 bytes"),
        })
    }
}

/// One write's removals, as the ledger's [`Chain`] and the archive record them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Checkpoint {
    pub seq: u64,
    /// When it was written (ms since the epoch).
    pub at: Millis,
    /// Tasks removed and forgotten, and the events that went with them.
    pub removed: u64,
    pub forgotten: u64,
    pub events: u64,
    /// The digest of the write's removals as the archive has them ([`batch_digest`]).
    pub batch: Digest,
    /// The previous checkpoint's head (zeros before the first).
    pub prev: Digest,
    /// The digest of all the above: the chain's head after this checkpoint.
    pub head: Digest,
}

impl Checkpoint {
    /// The head of a checkpoint with these fields.
    // format: do not change
    pub fn head_of(&self) -> Digest {
        let mut h = Sha256::new();
        h.update(b"sendledger prune checkpoint v1");
        h.update(self.prev);
        for n in [self.seq, self.at, self.removed, self.forgotten, self.events] {
            h.update(n.to_be_bytes());
        }
        h.update(self.batch);
        h.finalize().into()
    }
}

/// One task removed or forgotten by a write, as the archive keeps it: everything the ledger
/// deleted of it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Removed {
    pub task: TaskId,
    /// Its identity was forgotten (the `retained` entry deleted), rather than its history
    /// removed (the entry written).
    pub forgotten: bool,
    /// The `retained` value written (a removal) or deleted (forgetting).
    pub retained: Vec<u8>,
    /// The events deleted: LSN and stored bytes (envelopes), in task order.
    pub events: Vec<(u64, Vec<u8>)>,
}

/// The kind byte of an encoded [`Removed`] (an archive frame).
// format: do not change
pub(crate) const REMOVED: u8 = 1;

/// A [`Removed`] as the archive holds it and [`batch_digest`] covers it: [`REMOVED`], then
/// bincode.
pub(crate) fn encode_removed(removed: &Removed) -> Vec<u8> {
    let mut out = vec![REMOVED];
    bincode::serialize_into(&mut out, removed).expect("bincode into Vec is infallible");
    out
}

/// The digest of a write's removals, each as encoded in the archive.
// format: do not change
pub fn batch_digest<'a>(encoded: impl IntoIterator<Item = &'a [u8]>) -> Digest {
    let mut h = Sha256::new();
    h.update(b"sendledger prune batch v1");
    for bytes in encoded {
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    }
    h.finalize().into()
}

/// What retention removed from a ledger so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrunedTotals {
    /// Log entries removed: every LSN missing from the log is one of them.
    pub events: u64,
    /// Tasks whose history was removed (a task removed twice counts twice).
    pub tasks: u64,
    /// The highest LSN removed: the log's last LSN is never below it, even when the newest
    /// entries were removed.
    pub last_lsn: u64,
    /// Removed tasks whose identity was then forgotten too (`storage.identity_retention`).
    pub forgotten: u64,
}

impl PrunedTotals {
    // format: do not change
    pub(crate) fn encode(&self) -> [u8; 32] {
        let mut v = [0u8; 32];
        v[..8].copy_from_slice(&self.events.to_be_bytes());
        v[8..16].copy_from_slice(&self.tasks.to_be_bytes());
        v[16..24].copy_from_slice(&self.last_lsn.to_be_bytes());
        v[24..].copy_from_slice(&self.forgotten.to_be_bytes());
        v
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<PrunedTotals> {
        let field = |i: usize| {
            bytes
                .get(i * 8..i * 8 + 8)
                .and_then(decode_u64)
                .ok_or(Error::BadValue { what: "pruned" })
        };
        if bytes.len() != 32 {
            return Err(Error::BadValue { what: "pruned" });
        }
        Ok(PrunedTotals {
            events: field(0)?,
            tasks: field(1)?,
            last_lsn: field(2)?,
            forgotten: field(3)?,
        })
    }
}

/// The removal of one settled task's history, as [`crate::Ledger::prune_plan`] plans it and the
/// journal carries it out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prune {
    pub task: TaskId,
    pub retained: Retained,
    /// The events removed: LSN and stored bytes.
    pub events: Vec<(u64, Vec<u8>)>,
    /// The sequence number each of `events` is indexed under.
    pub seqs: Vec<u32>,
    /// The [`removed_digest`] of every event removed from the task, these included.
    pub digest: Digest,
    /// The `retained` value this removal replaces (of an earlier removal of the task), if any.
    pub replaces: Option<Vec<u8>>,
    /// The task's task-index entry, removed with them.
    pub index: Option<IndexEntry>,
}

/// The forgetting of a removed task's identity: what retention kept of it and whatever was
/// recorded after it go, as if the task had never been (`storage.identity_retention`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forget {
    pub task: TaskId,
    /// When it settled: its `retained_by_time` key.
    pub settled_at: Millis,
    /// Its `retained` value, deleted.
    pub retained: Vec<u8>,
    /// The events recorded after its history was removed: LSN and stored bytes.
    pub events: Vec<(u64, Vec<u8>)>,
    /// The sequence number each of `events` is indexed under.
    pub seqs: Vec<u32>,
    /// Its task-index entry, listing those events for retention, removed with them.
    pub index: Option<IndexEntry>,
    /// Of a version above 0: its identity, whose latest-version entry goes too when it names
    /// this task.
    pub version_of: Option<sendledger_core::Identity>,
}

/// What one write removes and forgets, planned from the ledger's records before the write: the
/// records after it, the `retained` values to write, and the archive's frames.
pub(crate) struct Removal {
    pub totals: PrunedTotals,
    pub chain: Chain,
    pub checkpoint: Checkpoint,
    /// Each removal's and forgetting's [`Removed`], encoded, in the write's order.
    pub removed: Vec<Vec<u8>>,
    /// The `retained` value each removal writes, in order.
    pub values: Vec<Vec<u8>>,
}

impl Removal {
    pub(crate) fn plan(
        db: &rocksdb::DB,
        prunes: &[&Prune],
        forgets: &[&Forget],
        at: Millis,
    ) -> Result<Removal> {
        let mut totals = pruned_totals(db)?;
        let mut chain = prune_chain(db)?;
        let mut removed = Vec::with_capacity(prunes.len() + forgets.len());
        let mut values = Vec::with_capacity(prunes.len());
        let mut events = 0u64;
        let mut count = |list: &[(u64, Vec<u8>)], totals: &mut PrunedTotals| {
            for (lsn, _) in list {
                totals.last_lsn = totals.last_lsn.max(*lsn);
            }
            totals.events += list.len() as u64;
            events += list.len() as u64;
        };
        for p in prunes {
            count(&p.events, &mut totals);
            let value = encode_retained(&p.retained, &p.digest);
            chain.kept_sum = add(&chain.kept_sum, &leaf(p.task, &value));
            if let Some(old) = &p.replaces {
                chain.kept_sum = sub(&chain.kept_sum, &leaf(p.task, old));
            }
            removed.push(Removed {
                task: p.task,
                forgotten: false,
                retained: value.clone(),
                events: p.events.clone(),
            });
            values.push(value);
        }
        for f in forgets {
            count(&f.events, &mut totals);
            chain.kept_sum = sub(&chain.kept_sum, &leaf(f.task, &f.retained));
            removed.push(Removed {
                task: f.task,
                forgotten: true,
                retained: f.retained.clone(),
                events: f.events.clone(),
            });
        }
        totals.tasks += prunes.len() as u64;
        totals.forgotten += forgets.len() as u64;
        let removed: Vec<Vec<u8>> = removed.iter().map(encode_removed).collect();
        let mut checkpoint = Checkpoint {
            seq: chain.seq + 1,
            at,
            removed: prunes.len() as u64,
            forgotten: forgets.len() as u64,
            events,
            batch: batch_digest(removed.iter().map(|r| &r[..])),
            prev: chain.head,
            head: [0; 32],
        };
        checkpoint.head = checkpoint.head_of();
        chain.seq = checkpoint.seq;
        chain.head = checkpoint.head;
        Ok(Removal {
            totals,
            chain,
            checkpoint,
            removed,
            values,
        })
    }
}

/// What retention kept of `task`, decoded.
pub(crate) fn retained(db: &rocksdb::DB, task: TaskId) -> Result<Option<Retained>> {
    Ok(retained_value(db, task)?
        .map(|v| decode_retained(&v))
        .transpose()?
        .map(|(retained, _)| retained))
}

/// What retention kept of `task`, as stored. A ledger of format 4 opened read-only has no
/// `retained` family: nothing was removed from it.
pub(crate) fn retained_value(db: &rocksdb::DB, task: TaskId) -> Result<Option<Vec<u8>>> {
    match db.cf_handle(CF_RETAINED) {
        Some(cf) => Ok(db.get_cf(cf, task.0)?),
        None => Ok(None),
    }
}

pub(crate) fn pruned_totals(db: &rocksdb::DB) -> Result<PrunedTotals> {
    let meta = db
        .cf_handle(CF_META)
        .expect("opened with every column family");
    match db.get_cf(meta, META_PRUNED)? {
        Some(v) => PrunedTotals::decode(&v),
        None => Ok(PrunedTotals::default()),
    }
}

/// The ledger's record of its removals (all zeros until the first).
pub(crate) fn prune_chain(db: &rocksdb::DB) -> Result<Chain> {
    let meta = db
        .cf_handle(CF_META)
        .expect("opened with every column family");
    match db.get_cf(meta, META_PRUNE_CHAIN)? {
        Some(v) => Chain::decode(&v),
        None => Ok(Chain::default()),
    }
}

/// What retention keeps of a succeeded task with request key `key`, for the tests of its
/// encodings.
#[cfg(test)]
pub(crate) fn sample_retained(key: &str) -> Retained {
    use sendledger_core::event::Ended;
    use sendledger_core::{Identity, PayloadHash};
    Retained {
        identity: Identity {
            tenant: "t".into(),
            operation: "o".into(),
            request_key: key.into(),
        },
        target: "p".into(),
        payload_hash: PayloadHash([7; 32]),
        status: Ended::Succeeded,
        remote_id: Some("r".into()),
        remote_target: None,
        reason: None,
        http_status: None,
        attempts: 1,
        version: 1,
        result_seq: 2,
        result_lsn: 3,
        result_at: 4,
        events: 3,
        settled_at: 4,
        request_version: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_wrap_and_subtract() {
        let mut a = [0xff; 32];
        let mut one = [0; 32];
        one[31] = 1;
        assert_eq!(add(&a, &one), [0; 32]);
        assert_eq!(sub(&[0; 32], &one), a);
        a[3] = 7;
        let b = [0x5a; 32];
        assert_eq!(sub(&add(&a, &b), &b), a);
        assert_eq!(add(&a, &b), add(&b, &a));
    }

    /// The bytes of a `retained` value, of the `pruned` and `prune-chain` records and the
    /// digests are on disk (or in an archive): a change to any encoding fails here.
    #[test]
    fn retained_values_keep_their_encoding() {
        let retained = sample_retained("k");
        // Written before format 6, still read.
        let v1 =
            "0101000000000000007401000000000000006f01000000000000006b0100000000000000700707070707\
             070707070707070707070707070707070707070707070707070707000000000101000000000000007200\
             000001000000010000000200000003000000000000000400000000000000030000000400000000000000";
        let v1: Vec<u8> = (0..v1.len() / 2)
            .map(|i| u8::from_str_radix(&v1[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        assert_eq!(decode_retained(&v1).unwrap(), (retained.clone(), None));
        // Format 6, before request versions.
        let v2 = [&[RETAINED_V2][..], &[9; 32], &v1[1..]].concat();
        assert_eq!(
            decode_retained(&v2).unwrap(),
            (retained.clone(), Some([9; 32]))
        );
        let versioned = Retained {
            request_version: 0x0102_0304,
            ..retained.clone()
        };
        let bytes = encode_retained(&versioned, &[9; 32]);
        assert_eq!(bytes[0], RETAINED_V3);
        assert_eq!(bytes[1..33], [9; 32]);
        assert_eq!(bytes[33..bytes.len() - 4], v1[1..]);
        assert_eq!(bytes[bytes.len() - 4..], [4, 3, 2, 1]);
        assert_eq!(decode_retained(&bytes).unwrap(), (versioned, Some([9; 32])));
        assert!(decode_retained(&[4, 0]).is_err());
        assert!(decode_retained(&[3, 0]).is_err());
        assert!(decode_retained(&[2, 0]).is_err());
        // The digests and the chain's record.
        let hex = |b: &[u8]| b.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let events = vec![(3, vec![1, 2]), (5, vec![3])];
        assert_eq!(
            hex(&removed_digest(None, &events)),
            "2a6224c78cd710b3970d5308035ec1ec31a0e87bacd4f097d9468a77b849cb15"
        );
        assert_eq!(
            hex(&removed_digest(Some(&[1; 32]), &events)),
            "88093641e492cbcc1c94ba0fddf5a9c89ac23dcf54ede05e4685638c862a2105"
        );
        assert_eq!(
            hex(&leaf(TaskId([4; 16]), &[1, 2, 3])),
            "a433bf388a290d930154a172054d088a96907063f96f2983498fed9231e34291"
        );
        assert_eq!(
            hex(&batch_digest([&[1u8, 2][..], &[3][..]])),
            "6a8f779e86f20d0404fa6b5459b0e45966585f971af0c1bc11ad66a354027a1e"
        );
        let checkpoint = Checkpoint {
            seq: 2,
            at: 3,
            removed: 4,
            forgotten: 5,
            events: 6,
            batch: [7; 32],
            prev: [8; 32],
            head: [0; 32],
        };
        assert_eq!(
            hex(&checkpoint.head_of()),
            "69ac1464a917bf778f8452dd0848a0f04c5c1c3d64c1b1745062a8d6036b3ba1"
        );
        let chain = Chain {
            seq: 1,
            head: [2; 32],
            kept_sum: [3; 32],
        };
        assert_eq!(Chain::decode(&chain.encode()).unwrap(), chain);
        assert_eq!(hex(&chain.encode()[..9]), "000000000000000102");
        assert!(Chain::decode(&[0; 71]).is_err());
        let totals = PrunedTotals {
            events: 1,
            tasks: 2,
            last_lsn: 3,
            forgotten: 4,
        };
        assert_eq!(PrunedTotals::decode(&totals.encode()).unwrap(), totals);
        assert_eq!(
            (totals.encode()[7], totals.encode()[15], totals.encode()[31]),
            (1, 2, 4)
        );
        assert!(PrunedTotals::decode(&[0; 24]).is_err());
    }
}
