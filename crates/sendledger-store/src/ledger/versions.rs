//! Reads of what the ledger knows of an identity's versions (`docs/rules.md`, Task versions).

use sendledger_core::{Identity, PayloadHash, TaskId};

use super::Ledger;
use crate::error::{Error, Result};
use crate::keys::*;

/// The latest version of an identity the ledger knows, its task and its payload hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Latest {
    pub version: u32,
    pub task_id: TaskId,
    pub payload_hash: PayloadHash,
}

impl Ledger {
    /// The identity's latest version, when the ledger knows one: its latest version above 0
    /// (kept until that version is forgotten), or else its request without a version, from the
    /// `identity` family or from what retention kept of the task once it removed its history.
    pub fn latest_version(&self, identity: &Identity) -> Result<Option<Latest>> {
        if let Some(latest) = self.latest_version_above_0(identity)? {
            return Ok(Some(latest));
        }
        let task_id = identity.task_id();
        let Some(v) = self
            .db()
            .get_cf(self.cf(CF_IDENTITY), identity_key(identity))?
        else {
            return Ok(self
                .retained(task_id)?
                .filter(|r| r.identity == *identity)
                .map(|r| Latest {
                    version: 0,
                    task_id,
                    payload_hash: r.payload_hash,
                }));
        };
        if v.len() != 48 {
            return Err(Error::BadValue { what: "identity" });
        }
        Ok(Some(Latest {
            version: 0,
            task_id: TaskId(v[..16].try_into().unwrap_or_default()),
            payload_hash: PayloadHash(v[16..].try_into().unwrap_or_default()),
        }))
    }

    /// The identity's latest version above 0, when one was accepted (and not forgotten): one
    /// point read, which misses for an identity whose requests name no version.
    pub fn latest_version_above_0(&self, identity: &Identity) -> Result<Option<Latest>> {
        let Some(v) = self
            .db()
            .get_cf(self.cf(CF_IDENTITY), version_key(identity))?
        else {
            return Ok(None);
        };
        let (version, task_id, payload_hash) =
            decode_version_value(&v).ok_or(Error::BadValue { what: "identity" })?;
        Ok(Some(Latest {
            version,
            task_id,
            payload_hash,
        }))
    }

    /// Whether `task` is settled as far as a later version of its request is concerned: its
    /// summary is terminal, or retention removed its history (only a settled task's is), or
    /// the ledger does not know it (forgotten).
    pub fn settled(&self, task: TaskId) -> Result<bool> {
        match self.task_summary(task)? {
            Some(summary) => Ok(summary.phase.is_terminal()),
            None => Ok(true),
        }
    }
}
