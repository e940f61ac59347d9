//! The archive reader on files built frame by frame: a chain read across files, and what it
//! passes over (a write cut short, a checkpoint written again) versus what it reports (a
//! changed frame, a missing file, a broken chain).

use super::*;
use crate::retention::{batch_digest, encode_removed, Digest};
use sendledger_core::TaskId;

/// One write: its removals of tasks `tasks` (one event each) and its checkpoint after `prev`.
fn write(seq: u64, prev: Digest, tasks: &[u8]) -> (Vec<u8>, Digest) {
    let removed: Vec<Vec<u8>> = tasks
        .iter()
        .map(|t| {
            encode_removed(&Removed {
                task: TaskId([*t; 16]),
                forgotten: false,
                retained: vec![2, *t],
                events: vec![(u64::from(*t), vec![*t; 3])],
            })
        })
        .collect();
    let mut checkpoint = Checkpoint {
        seq,
        at: 1_000 + seq,
        removed: tasks.len() as u64,
        forgotten: 0,
        events: tasks.len() as u64,
        batch: batch_digest(removed.iter().map(|r| &r[..])),
        prev,
        head: [0; 32],
    };
    checkpoint.head = checkpoint.head_of();
    let mut bytes = Vec::new();
    for frame in removed.iter().chain([&encode_checkpoint(&checkpoint)]) {
        bytes.extend_from_slice(&(frame.len() as u32).to_be_bytes());
        bytes.extend_from_slice(frame);
    }
    (bytes, checkpoint.head)
}

fn file(dir: &Path, name: &str, writes: &[&[u8]]) {
    let mut bytes = MAGIC.to_vec();
    for w in writes {
        bytes.extend_from_slice(w);
    }
    std::fs::write(dir.join(name), bytes).unwrap();
}

fn tasks(archive: &Archive) -> Vec<u8> {
    archive.removed.iter().map(|(_, r)| r.task.0[0]).collect()
}

#[test]
fn a_chain_across_files_reads_in_order_and_passes_over_what_the_ledger_never_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let (w1, h1) = write(1, [0; 32], &[1, 2]);
    let (w2, h2) = write(2, h1, &[3]);
    // Checkpoint 3 archived, then the process stopped before the ledger recorded it; after
    // the restart (a new file) the ledger's next write is checkpoint 3 again.
    let (abandoned, _) = write(3, h2, &[4]);
    let (w3, h3) = write(3, h2, &[5]);
    // A write cut short at the end of the last file.
    let (w4, _) = write(4, h3, &[6]);
    file(dir.path(), "2026-12-05.0001.archive", &[&w1]);
    file(dir.path(), "2026-12-06.0001.archive", &[&w2, &abandoned]);
    file(
        dir.path(),
        "2026-12-06.0002.archive",
        &[&w3, &w4[..w4.len() - 5]],
    );
    std::fs::write(dir.path().join("README"), "not an archive file").unwrap();
    let archive = read_archive(dir.path()).unwrap();
    assert_eq!(archive.findings, Vec::new());
    assert_eq!(archive.files.len(), 3);
    let seqs: Vec<u64> = archive.checkpoints.iter().map(|c| c.seq).collect();
    assert_eq!(seqs, [1, 2, 3]);
    assert_eq!(archive.checkpoints[2].head, h3);
    assert_eq!(tasks(&archive), [1, 2, 3, 5]);
    assert_eq!(archive.notes.len(), 2, "{:#?}", archive.notes);
    assert!(archive.notes[0].contains("checkpoint 3 written again"));
    assert!(archive.notes[1].contains("cut short"));
}

#[test]
fn a_changed_frame_a_missing_file_and_a_foreign_chain_are_reported() {
    let (w1, h1) = write(1, [0; 32], &[1, 2]);
    let (w2, h2) = write(2, h1, &[3]);
    let (w3, _) = write(3, h2, &[4]);
    let findings = |files: &[(&str, &[&[u8]])]| {
        let dir = tempfile::tempdir().unwrap();
        for (name, writes) in files {
            file(dir.path(), name, writes);
        }
        let archive = read_archive(dir.path()).unwrap();
        (archive.findings.into_iter())
            .map(|f| {
                assert_eq!(f.rule, "archive-intact");
                f.detail
            })
            .collect::<Vec<_>>()
    };
    // An archived event's byte changed: its checkpoint no longer matches.
    let mut changed = w1.clone();
    let at = changed.len() / 3;
    changed[at] ^= 1;
    let found = findings(&[("2026-12-06.0001.archive", &[&changed, &w2])]);
    assert!(
        found
            .iter()
            .any(|f| f.contains("checkpoint 1 does not match") || f.contains("does not decode")),
        "{found:?}"
    );
    // The middle file deleted.
    let found = findings(&[
        ("2026-12-06.0001.archive", &[&w1]),
        ("2026-12-06.0003.archive", &[&w3]),
    ]);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("checkpoints 2 to 2 are missing"));
    // A checkpoint that follows another chain.
    let (foreign, _) = write(2, [9; 32], &[3]);
    let found = findings(&[("2026-12-06.0001.archive", &[&w1, &foreign])]);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("does not follow checkpoint 1"));
    // A checkpoint's own field changed (its removal count): it matches neither its removals
    // nor its head.
    let mut recounted = w2.clone();
    let checkpoint_at = recounted.len() - 32 * 3 - 8 * 3;
    recounted[checkpoint_at] ^= 1;
    let found = findings(&[("2026-12-06.0001.archive", &[&w1, &recounted])]);
    assert!(found.len() >= 2, "{found:?}");
    // Not an archive.
    let found = findings(&[("2026-12-06.0001.archive", &[])]);
    assert_eq!(found, Vec::<String>::new());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("2026-12-06.0001.archive"), b"garbage!").unwrap();
    let archive = read_archive(dir.path()).unwrap();
    assert!(archive.findings[0].detail.contains("not an archive file"));
}
