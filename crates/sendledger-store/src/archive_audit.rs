//! The audit of retention's archive (`sendledger audit --archive`): its frames and chain of
//! checkpoints ([`crate::archive`]), each removed history against the rules as the live
//! ledger's are, each against the digest kept with it, and the chain's end and every kept
//! entry against the ledger the histories were removed from.

use std::collections::BTreeMap;
use std::path::Path;

use sendledger_core::audit::{AuditReport, Finding, Integrity, TaskAudit};
use sendledger_core::{CheckConfig, TaskId};

use crate::archive::read::damage;
use crate::archive::{read_archive, Archive};
use crate::envelope::decode_event;
use crate::error::{Error, Result};
use crate::keys::CF_RETAINED;
use crate::ledger::Ledger;
use crate::retention::{decode_retained, prune_chain, removed_digest, Chain, Digest};

/// One task's removals in an archive.
#[derive(Default)]
struct Trail {
    events: Vec<(u64, Vec<u8>)>,
    /// The digest its removals add up to.
    digest: Option<Digest>,
    /// The `retained` value last written, or `None` once forgotten.
    kept: Option<Vec<u8>>,
}

/// Audits the archive at `dir`: its frames and chain of checkpoints; each removed history
/// against the rules, as the live ledger's are; each history against the digest kept with it;
/// and, with the `ledger` it was removed from, the chain's head and every kept entry against
/// the ledger's.
pub fn audit_archive(
    dir: &Path,
    ledger: Option<&Ledger>,
    config: CheckConfig,
) -> Result<AuditReport> {
    let archive = read_archive(dir)?;
    let mut report = AuditReport {
        source: format!("archive {}", dir.display()),
        ..AuditReport::default()
    };
    report.violations.extend(archive.findings.iter().cloned());
    report.skipped_checks.extend(archive.notes.iter().cloned());
    let complete = archive.complete();
    let chain = ledger.map(|l| prune_chain(l.db())).transpose()?;
    // A last checkpoint archived while the ledger did not record it: its removals did not
    // happen (the ledger still holds those tasks as they were).
    let unrecorded = chain.and_then(|chain| {
        (archive.checkpoints.last())
            .filter(|c| c.seq == chain.seq + 1 && c.prev == chain.head)
            .map(|c| c.seq)
    });
    let mut trails: BTreeMap<TaskId, Trail> = BTreeMap::new();
    for (seq, r) in archive
        .removed
        .iter()
        .filter(|(s, _)| Some(*s) != unrecorded)
    {
        let trail = trails.entry(r.task).or_default();
        report.events += r.events.len() as u64;
        report.last_lsn = (r.events.iter().map(|(l, _)| *l))
            .chain([report.last_lsn])
            .max()
            .unwrap_or(0);
        trail.events.extend(r.events.iter().cloned());
        if r.forgotten {
            if trail.kept.as_ref().is_some_and(|k| *k != r.retained) {
                report.violations.push(damage(Some(r.task), format!("checkpoint {seq} forgot a kept entry other than the one the archive recorded writing")));
            }
            trail.kept = None;
            continue;
        }
        let digest = removed_digest(trail.digest.as_ref(), &r.events);
        trail.digest = Some(digest);
        match decode_retained(&r.retained) {
            Ok((_, Some(kept))) if kept == digest => {}
            Ok(_) if !complete => report.skipped_checks.push(format!(
                "the digest of task {}'s removed events: some were removed before the archive starts",
                r.task
            )),
            Ok(_) => report.violations.push(damage(
                Some(r.task),
                format!("checkpoint {seq}: the task's archived events do not match the digest kept with them"),
            )),
            Err(_) => report.violations.push(damage(
                Some(r.task),
                format!("checkpoint {seq}: the kept entry does not decode"),
            )),
        }
        trail.kept = Some(r.retained.clone());
    }
    for (task, trail) in &trails {
        check_history(*task, &trail.events, complete, config, &mut report);
    }
    if let (Some(ledger), Some(chain)) = (ledger, chain) {
        against_ledger(&archive, &trails, ledger, chain, &mut report)?;
    }
    Ok(report)
}

/// Checks a removed history against the rules (when it starts at the task's first event).
fn check_history(
    task: TaskId,
    events: &[(u64, Vec<u8>)],
    complete: bool,
    config: CheckConfig,
    report: &mut AuditReport,
) {
    let mut decoded = Vec::with_capacity(events.len());
    for (lsn, bytes) in events {
        match decode_event(*lsn, bytes) {
            Ok(event) => decoded.push(event),
            Err(e) => report.violations.push(Finding::integrity(
                Integrity::EventDecodable,
                Some(task),
                vec![*lsn],
                format!("an archived event does not decode: {e}"),
            )),
        }
    }
    if decoded.first().is_some_and(|e| e.task_seq != 0) && !complete {
        report.skipped_checks.push(format!(
            "the rules for task {task}: its first events were removed before the archive starts"
        ));
        return;
    }
    let mut audit = TaskAudit::new(task, config);
    for event in &decoded {
        audit.push(event, report);
    }
    audit.finish(report);
}

/// Checks the archive against the ledger its removals came from: the same chain head, and
/// each entry the ledger keeps written by the archive's last removal of that task.
fn against_ledger(
    archive: &Archive,
    trails: &BTreeMap<TaskId, Trail>,
    ledger: &Ledger,
    chain: Chain,
    report: &mut AuditReport,
) -> Result<()> {
    let last = archive.checkpoints.last();
    match last {
        None if chain.seq == 0 => {}
        Some(last) if last.seq == chain.seq && last.head == chain.head => {}
        Some(last) if last.seq == chain.seq + 1 && last.prev == chain.head => {
            report.skipped_checks.push(format!(
                "checkpoint {}: archived, then the process stopped before the ledger recorded it",
                last.seq
            ))
        }
        _ => report.violations.push(damage(
            None,
            format!(
                "the archive ends at checkpoint {}, the ledger's record of its removals at checkpoint {}{}",
                last.map_or(0, |c| c.seq),
                chain.seq,
                if last.is_some_and(|c| c.seq == chain.seq) { " with another head" } else { "" }
            ),
        )),
    }
    let Some(cf) = ledger.db().cf_handle(CF_RETAINED) else {
        return Ok(());
    };
    for item in ledger.db().iterator_cf(cf, rocksdb::IteratorMode::Start) {
        let (k, v) = item?;
        let task = TaskId(
            k[..]
                .try_into()
                .map_err(|_| Error::BadValue { what: "retained" })?,
        );
        // An entry written before format 6 (no digest) predates the checkpoints: no archive
        // holds its removal.
        let predates = matches!(decode_retained(&v), Ok((_, None)));
        match trails.get(&task).and_then(|t| t.kept.as_ref()) {
            Some(kept) if *kept == *v => {}
            None if !archive.complete() || predates => {}
            _ => report.violations.push(Finding::integrity(
                Integrity::RetainedIntact,
                Some(task),
                Vec::new(),
                "what the ledger keeps of the removed task is not what the archive recorded writing",
            )),
        }
    }
    Ok(())
}
