//! A task whose history in the ledger a restore replaced: what it held from where the two
//! histories part, kept as evidence until the task's review is recorded.

use sendledger_core::{Event, TaskId};

use crate::envelope::{decode_event, encode_event};
use crate::error::{Error, Result};

/// A task whose log holds two different histories from one event on: two owners each wrote
/// one. The task is rebuilt from the later; `replaced` is what the other held from there on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diverged {
    pub task_id: TaskId,
    pub task_seq: u32,
    /// The replaced events, in sequence order (an event replaced from the ledger keeps its
    /// LSN; one replaced within the same restore has LSN 0).
    pub replaced: Vec<Event>,
}

impl Diverged {
    /// The stored form of a review owed (see [`crate::keys::META_REVIEWS_OWED`]): `task_seq`,
    /// then each replaced event as `lsn ‖ length ‖ envelope`, integers big-endian.
    // format: do not change
    pub fn encode(&self) -> Vec<u8> {
        let mut out = self.task_seq.to_be_bytes().to_vec();
        for e in &self.replaced {
            let envelope = encode_event(e);
            out.extend_from_slice(&e.lsn.to_be_bytes());
            out.extend_from_slice(&(envelope.len() as u32).to_be_bytes());
            out.extend_from_slice(&envelope);
        }
        out
    }

    pub fn decode(task_id: TaskId, bytes: &[u8]) -> Result<Diverged> {
        let bad = || Error::BadValue {
            what: "review owed",
        };
        let (seq, mut rest) = bytes.split_first_chunk::<4>().ok_or_else(bad)?;
        let mut replaced = Vec::new();
        while !rest.is_empty() {
            let (lsn, after) = rest.split_first_chunk::<8>().ok_or_else(bad)?;
            let (len, after) = after.split_first_chunk::<4>().ok_or_else(bad)?;
            let len = u32::from_be_bytes(*len) as usize;
            let envelope = after.get(..len).ok_or_else(bad)?;
            replaced.push(decode_event(u64::from_be_bytes(*lsn), envelope)?);
            rest = &after[len..];
        }
        Ok(Diverged {
            task_id,
            task_seq: u32::from_be_bytes(*seq),
            replaced,
        })
    }
}
