//! Reading an archive back: its chain of checkpoints and the histories it holds.

use std::path::{Path, PathBuf};

use sendledger_core::audit::{Finding, Integrity};
use sendledger_core::{Event, TaskId};

use super::{decode_frame, parse_name, Frame, MAGIC};
use crate::envelope::decode_event;
use crate::error::{Error, Result};
use crate::retention::{batch_digest, Checkpoint, Removed};

/// What an archive holds, as its checkpoints vouch for it.
#[derive(Debug, Default)]
pub struct Archive {
    pub files: Vec<PathBuf>,
    /// The chain, in order: each checkpoint follows the one before it.
    pub checkpoints: Vec<Checkpoint>,
    /// Every removal a checkpoint of the chain covers, in the order they were written, with
    /// its checkpoint's sequence number.
    pub removed: Vec<(u64, Removed)>,
    /// Damage: a frame that does not decode, a checkpoint that does not match what it covers,
    /// a break in the chain.
    pub findings: Vec<Finding>,
    /// What was passed over, and why (writes cut short by a crash, checkpoints written again).
    pub notes: Vec<String>,
}

pub(crate) fn damage(task: Option<TaskId>, detail: String) -> Finding {
    Finding::integrity(Integrity::ArchiveIntact, task, Vec::new(), detail)
}

/// Reads every archive file of `dir`, in order of day and number.
pub fn read_archive(dir: &Path) -> Result<Archive> {
    let io = |source| Error::Dir {
        path: dir.to_path_buf(),
        source,
    };
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        if let Some(order) = name.as_deref().and_then(parse_name) {
            names.push((order, path));
        }
    }
    names.sort();
    let mut archive = Archive::default();
    for (_, path) in names {
        let bytes = std::fs::read(&path).map_err(|source| Error::Dir {
            path: path.clone(),
            source,
        })?;
        archive.read_file(&path, &bytes);
        archive.files.push(path);
    }
    Ok(archive)
}

impl Archive {
    fn read_file(&mut self, path: &Path, bytes: &[u8]) {
        let name = path.display();
        let Some(mut rest) = bytes.strip_prefix(&MAGIC[..]) else {
            self.findings.push(damage(
                None,
                format!("{name} is not an archive file of this format"),
            ));
            return;
        };
        // Removals read since the last checkpoint: (their bytes, decoded).
        let mut pending: Vec<(&[u8], Removed)> = Vec::new();
        while !rest.is_empty() {
            let len = rest
                .get(..4)
                .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")) as usize);
            let Some(frame) = len.and_then(|len| rest.get(4..4 + len)) else {
                self.notes.push(format!(
                    "{name}: a write cut short at its end (the process stopped while archiving), passed over: the ledger never recorded its removals"
                ));
                return;
            };
            rest = &rest[4 + frame.len()..];
            match decode_frame(frame) {
                Some(Frame::Removed(removed)) => pending.push((frame, removed)),
                Some(Frame::Checkpoint(checkpoint)) => {
                    self.checkpoint(&name.to_string(), checkpoint, std::mem::take(&mut pending))
                }
                None => {
                    self.findings.push(damage(
                        None,
                        format!(
                            "{name}: a frame does not decode; the rest of the file is not read"
                        ),
                    ));
                    return;
                }
            }
        }
        if !pending.is_empty() {
            self.notes.push(format!(
                "{name}: {} removals without their checkpoint at its end (the process stopped while archiving), passed over: the ledger never recorded them",
                pending.len()
            ));
        }
    }

    fn checkpoint(&mut self, file: &str, c: Checkpoint, covered: Vec<(&[u8], Removed)>) {
        let seq = c.seq;
        let batch = batch_digest(covered.iter().map(|(bytes, _)| *bytes));
        let removed = covered.iter().filter(|(_, r)| !r.forgotten).count() as u64;
        let forgotten = covered.len() as u64 - removed;
        let events: u64 = covered.iter().map(|(_, r)| r.events.len() as u64).sum();
        if batch != c.batch || (removed, forgotten, events) != (c.removed, c.forgotten, c.events) {
            self.findings.push(damage(
                None,
                format!("{file}: checkpoint {seq} does not match the removals before it (changed, added or deleted since they were archived)"),
            ));
        }
        if c.head_of() != c.head {
            self.findings.push(damage(
                None,
                format!("{file}: checkpoint {seq} was changed since it was written (its head does not match its fields)"),
            ));
        }
        if let Some(last) = self.checkpoints.last() {
            if seq <= last.seq {
                // The process stopped after archiving checkpoint `seq` and before the ledger
                // recorded it; the ledger's next write made it again.
                self.notes.push(format!(
                    "{file}: checkpoint {seq} written again; the one written before it (never recorded by the ledger) is passed over"
                ));
                self.checkpoints.retain(|k| k.seq < seq);
                self.removed.retain(|(k, _)| *k < seq);
            }
        }
        match self.checkpoints.last() {
            Some(last) if last.seq + 1 != seq => self.findings.push(damage(
                None,
                format!("{file}: checkpoints {} to {} are missing", last.seq + 1, seq - 1),
            )),
            Some(last) if last.head != c.prev => self.findings.push(damage(
                None,
                format!("{file}: checkpoint {seq} does not follow checkpoint {} (the chain is broken)", last.seq),
            )),
            None if seq != 1 => self.notes.push(format!(
                "the archive starts at checkpoint {seq}: what retention removed before it is not in the archive"
            )),
            _ => {}
        }
        self.removed
            .extend(covered.into_iter().map(|(_, removed)| (seq, removed)));
        self.checkpoints.push(c);
    }

    /// Whether the archive holds every checkpoint from the first.
    pub fn complete(&self) -> bool {
        self.checkpoints.first().is_none_or(|c| c.seq == 1)
    }
}

/// The events of `task` the archive at `dir` holds, in task order (those of its removals that
/// a checkpoint covers).
pub fn archived_history(dir: &Path, task: TaskId) -> Result<Vec<Event>> {
    let archive = read_archive(dir)?;
    let mut events = Vec::new();
    for (_, removed) in archive.removed.iter().filter(|(_, r)| r.task == task) {
        for (lsn, bytes) in &removed.events {
            events.push(decode_event(*lsn, bytes)?);
        }
    }
    Ok(events)
}
