//! The compact values the ledger keeps beside its log: a partition's processed offsets, and a
//! task's summary (phase and number of events) for start-up.

use sendledger_core::Phase;

use crate::error::{Error, Result};

/// The processed offsets of one requests-topic partition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Processed {
    /// Every offset up to and including this one is processed.
    pub watermark: Option<i64>,
    /// Processed offsets above the watermark (out of order, not yet folded into it).
    pub above: std::collections::BTreeSet<i64>,
}

impl Processed {
    pub fn contains(&self, offset: i64) -> bool {
        self.watermark.is_some_and(|w| offset <= w) || self.above.contains(&offset)
    }

    /// The highest offset below which everything is processed, counting the markers.
    pub fn contiguous(&self) -> Option<i64> {
        let mut w = self.watermark;
        for &o in &self.above {
            if o == w.map_or(0, |w| w + 1) {
                w = Some(o);
            } else if w.is_some_and(|w| o <= w) {
                continue;
            } else {
                break;
            }
        }
        w
    }
}

/// The compact summary of a task kept for start-up: its phase and number of events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskSummary {
    pub phase: Phase,
    pub next_seq: u32,
}

// format: do not change (phase codes are on disk)
pub(crate) const PHASES: [Phase; 11] = [
    Phase::New,
    Phase::Accepted,
    Phase::Sending,
    Phase::RetryWait,
    Phase::Unknown,
    Phase::ManualReview,
    Phase::Succeeded,
    Phase::Rejected,
    Phase::Failed,
    Phase::Compensating,
    Phase::Compensated,
];

/// A phase's code on disk.
pub(crate) fn phase_code(phase: Phase) -> u8 {
    PHASES.iter().position(|p| *p == phase).unwrap_or(0) as u8
}

pub(crate) fn phase_of_code(code: u8) -> Option<Phase> {
    PHASES.get(code as usize).copied()
}

impl TaskSummary {
    pub(crate) fn encode(&self) -> [u8; 6] {
        let code = phase_code(self.phase);
        let seq = self.next_seq.to_be_bytes();
        [1, code, seq[0], seq[1], seq[2], seq[3]]
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<TaskSummary> {
        match bytes {
            [1, code, seq @ ..] if seq.len() == 4 => Ok(TaskSummary {
                phase: *PHASES
                    .get(*code as usize)
                    .ok_or(Error::BadValue { what: "tasks" })?,
                next_seq: u32::from_be_bytes(
                    seq.try_into()
                        .map_err(|_| Error::BadValue { what: "tasks" })?,
                ),
            }),
            _ => Err(Error::BadValue { what: "tasks" }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_summary_codes_are_stable() {
        let s = TaskSummary {
            phase: Phase::ManualReview,
            next_seq: 258,
        };
        assert_eq!(s.encode(), [1, 5, 0, 0, 1, 2]);
        assert_eq!(TaskSummary::decode(&s.encode()).unwrap(), s);
        assert!(TaskSummary::decode(&[1, 99, 0, 0, 0, 0]).is_err());
    }
}
