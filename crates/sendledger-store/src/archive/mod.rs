//! The archive of what retention removes (`storage.archive`; the format is in
//! `docs/operating/retention.md`, "The archive").
//!
//! Before a write that removes or forgets tasks, the journal appends to the day's archive file
//! every event and `retained` value the write deletes, then the write's [`Checkpoint`], and
//! syncs the file. The checkpoints form the hash chain whose head the ledger keeps
//! ([`crate::retention::Chain`]), so the archive can be checked against the ledger and the
//! removed histories audited as the live ones are ([`crate::archive_audit`]).
//!
//! A file is `MAGIC`, then frames: a length (u32, big-endian) and that many bytes, a kind byte
//! then bincode ([`Removed`] or [`Checkpoint`]). A write that was cut short (the process died
//! while archiving) leaves frames without their checkpoint at a file's end: the ledger never
//! recorded their removal, which a later write makes again. Each process start, each day and
//! each failed write begin a new file, so a file never continues after a cut.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use sendledger_core::event::Millis;

use crate::retention::{Checkpoint, Removal, Removed, REMOVED};

pub(crate) mod read;
#[cfg(test)]
mod read_tests;

pub use read::{archived_history, read_archive, Archive};

/// The first bytes of an archive file: its name and format version.
// format: do not change
pub const MAGIC: &[u8; 8] = b"SLARCH\x00\x01";
/// The kind byte of a [`Checkpoint`] frame (a [`Removed`] frame's is
/// [`crate::retention::REMOVED`]).
// format: do not change
const CHECKPOINT: u8 = 2;

/// The archive's file name extension.
const EXTENSION: &str = "archive";

fn encode_checkpoint(checkpoint: &Checkpoint) -> Vec<u8> {
    let mut out = vec![CHECKPOINT];
    bincode::serialize_into(&mut out, checkpoint).expect("bincode into Vec is infallible");
    out
}

/// A frame of an archive file.
#[derive(Debug)]
enum Frame {
    Removed(Removed),
    Checkpoint(Checkpoint),
}

fn decode_frame(bytes: &[u8]) -> Option<Frame> {
    match bytes.split_first()? {
        (&REMOVED, rest) => bincode::deserialize(rest).ok().map(Frame::Removed),
        (&CHECKPOINT, rest) => bincode::deserialize(rest).ok().map(Frame::Checkpoint),
        _ => None,
    }
}

/// The UTC day of `at`, `YYYY-MM-DD`: the archive file it goes to.
fn day_of(at: Millis) -> String {
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_millis(at);
    humantime::format_rfc3339(time).to_string()[..10].to_string()
}

/// The day and number of an archive file named `YYYY-MM-DD.N.archive`.
fn parse_name(name: &str) -> Option<(String, u32)> {
    let stem = name.strip_suffix(EXTENSION)?.strip_suffix('.')?;
    let (day, n) = stem.split_once('.')?;
    (day.len() == 10).then_some(())?;
    Some((day.to_string(), n.parse().ok()?))
}

/// The journal's appends to the archive.
pub(crate) struct Writer {
    dir: PathBuf,
    /// The file being appended to, and its day.
    file: Option<(String, File)>,
}

impl Writer {
    pub(crate) fn new(dir: PathBuf) -> Writer {
        Writer { dir, file: None }
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Appends `removal`'s frames and its checkpoint, synced. After a failure the next append
    /// starts a new file.
    pub(crate) fn append(&mut self, removal: &Removal) -> std::io::Result<()> {
        let day = day_of(removal.checkpoint.at);
        let mut buf = Vec::new();
        let checkpoint = encode_checkpoint(&removal.checkpoint);
        for frame in removal.removed.iter().chain([&checkpoint]) {
            buf.extend_from_slice(&(frame.len() as u32).to_be_bytes());
            buf.extend_from_slice(frame);
        }
        let result = (|| {
            let file = match &mut self.file {
                Some((d, file)) if *d == day => file,
                _ => &mut self.file.insert((day.clone(), create(&self.dir, &day)?)).1,
            };
            file.write_all(&buf)?;
            file.sync_data()
        })();
        if result.is_err() {
            self.file = None;
        }
        result
    }
}

/// Creates the next file of `day` (`0700` directory, `0600` file), with its magic, synced.
fn create(dir: &Path, day: &str) -> std::io::Result<File> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let mut next = 1;
    for entry in std::fs::read_dir(dir)? {
        if let Some((d, n)) = parse_name(&entry?.file_name().to_string_lossy()) {
            if d == day {
                next = next.max(n + 1);
            }
        }
    }
    let path = dir.join(format!("{day}.{next:04}.{EXTENSION}"));
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    file.write_all(MAGIC)?;
    file.sync_all()?;
    File::open(dir)?.sync_all()?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The frames' bytes are in archive files: a change to their encoding fails here.
    #[test]
    fn frames_keep_their_encoding() {
        let hex = |b: &[u8]| b.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let removed = Removed {
            task: sendledger_core::TaskId([1; 16]),
            forgotten: false,
            retained: vec![2, 3],
            events: vec![(5, vec![9])],
        };
        let bytes = crate::retention::encode_removed(&removed);
        let le = |n: u64| hex(&n.to_le_bytes());
        let expected = format!(
            "01{}00{}0203{}{}{}09",
            "01".repeat(16),
            le(2),
            le(1),
            le(5),
            le(1)
        );
        assert_eq!(hex(&bytes), expected);
        assert!(matches!(decode_frame(&bytes), Some(Frame::Removed(r)) if r == removed));
        let checkpoint = Checkpoint {
            seq: 1,
            at: 2,
            removed: 3,
            forgotten: 4,
            events: 5,
            batch: [6; 32],
            prev: [7; 32],
            head: [8; 32],
        };
        let bytes = encode_checkpoint(&checkpoint);
        let expected = format!(
            "02{}{}{}{}{}{}{}{}",
            le(1),
            le(2),
            le(3),
            le(4),
            le(5),
            "06".repeat(32),
            "07".repeat(32),
            "08".repeat(32)
        );
        assert_eq!(hex(&bytes), expected);
        assert!(matches!(decode_frame(&bytes), Some(Frame::Checkpoint(c)) if c == checkpoint));
        assert_eq!(MAGIC, b"SLARCH\x00\x01");
    }

    #[test]
    fn files_are_named_by_day_and_number() {
        assert_eq!(day_of(0), "1970-01-01");
        assert_eq!(day_of(1_796_601_599_999), "2026-12-06");
        assert_eq!(
            parse_name("2026-12-06.0012.archive"),
            Some(("2026-12-06".into(), 12))
        );
        assert_eq!(parse_name("2026-12-06.archive"), None);
        assert_eq!(parse_name("notes.txt"), None);
    }
}
