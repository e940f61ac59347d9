//! Multi-step tasks (sagas), as folded from the log: the steps planned when the task was
//! accepted (`StepsPlanned`), what each step's call ended with, and its compensation.
//!
//! A task's attempts go to one call at a time, its *leg*: a forward step, or the compensation
//! of one. Every leg is driven by the same state machine as a one-step task (intent before the
//! first byte, unknown → lookup, review), with an attempt budget of its own; the fold moves to
//! the next leg when one ends (`docs/sagas.md`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::event::PlannedStep;
use crate::request::AcceptedRequest;

/// A multi-step task's steps and where it is in them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Saga {
    pub steps: Vec<Step>,
    /// The call the task's attempts go to now.
    pub leg: Leg,
    /// A step ended rejected or failed, or an operator ordered the whole task undone, so the
    /// steps that succeeded are owed their compensation.
    pub compensating: bool,
    /// The operator who ordered the whole task undone, and why (`CompensationOrdered`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ordered_by: Option<(String, String)>,
}

/// The call a multi-step task's attempts go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "step", rename_all = "snake_case")]
pub enum Leg {
    /// Forward step `n` (from 0).
    Step(u32),
    /// The compensation of step `n`.
    Compensation(u32),
}

/// One step: its plan, what its call ended with, and its compensation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    pub name: String,
    pub target: String,
    /// The target that undoes the step, when it can be undone.
    pub compensate: Option<String>,
    pub outcome: StepOutcome,
    /// The fields of the step's answer that later calls read (`StepAnswer`).
    #[serde(default, skip_serializing_if = "Answer::is_empty")]
    pub answer: Answer,
    pub compensation: Option<Compensation>,
    /// Records the step's lookup found besides its own, which an operator ordered undone
    /// (`CompensationOrdered`): each by the step's compensating target, before the task goes
    /// on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub duplicates: Vec<Compensation>,
}

/// What a step's call ended with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum StepOutcome {
    /// Not ended yet (or not begun).
    Pending,
    Succeeded {
        remote_id: String,
    },
    Rejected {
        http_status: u16,
        detail: String,
    },
    Failed {
        reason: String,
    },
}

/// A step's compensation: the record it undoes, who ordered it, and how far it got.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compensation {
    /// The step's record being undone.
    pub undoes: String,
    pub by: String,
    pub outcome: CompensationOutcome,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum CompensationOutcome {
    /// Ordered by an operator, not begun yet (a duplicate record waiting its turn).
    Owed,
    Underway,
    /// Confirmed: by the compensating call's answer, a lookup, or an operator.
    Done {
        remote_id: String,
    },
    /// The compensating target refused it: a person must decide.
    Refused {
        http_status: u16,
        detail: String,
    },
    /// An operator gave up on undoing a duplicate record: it stays at the remote, and the task
    /// went on.
    Abandoned {
        reason: String,
    },
}

impl CompensationOutcome {
    /// Begun and not ended: its attempts, or the review of its refusal, hold up the next.
    pub fn is_open(&self) -> bool {
        matches!(
            self,
            CompensationOutcome::Underway | CompensationOutcome::Refused { .. }
        )
    }
}

/// Fields of a call's answer that later calls' templates read
/// (`{steps.NAME.response./pointer}`): JSON pointer → value, a string as it is, a number or
/// boolean as its JSON text. Taken from a step's 2xx answer, or from the record a lookup found.
pub type Answer = BTreeMap<String, String>;

/// A step's record as later calls' templates see it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StepRecord {
    pub remote_id: String,
    pub answer: Answer,
}

/// What a call's templates read of the steps before it, by step name. During a compensation,
/// its own step's entry is the record the compensation undoes (a duplicate's has no answer).
pub type StepRecords = BTreeMap<String, StepRecord>;

/// What a lookup found: the matching records' ids, each once, in the remote's order, and, when
/// exactly one matched, the fields of that record that later calls read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Found {
    pub ids: Vec<String>,
    pub answer: Answer,
}

impl From<Vec<String>> for Found {
    fn from(ids: Vec<String>) -> Found {
        Found {
            ids,
            answer: Answer::new(),
        }
    }
}

impl Saga {
    /// A saga about to run its first step.
    pub fn planned(steps: &[PlannedStep]) -> Saga {
        Saga {
            steps: steps
                .iter()
                .map(|p| Step {
                    name: p.name.clone(),
                    target: p.target.clone(),
                    compensate: p.compensate.clone(),
                    outcome: StepOutcome::Pending,
                    answer: Answer::new(),
                    compensation: None,
                    duplicates: Vec::new(),
                })
                .collect(),
            leg: Leg::Step(0),
            compensating: false,
            ordered_by: None,
        }
    }

    /// The target of the current leg's call.
    pub fn target(&self) -> Option<&str> {
        match self.leg {
            Leg::Step(n) => self.steps.get(n as usize).map(|s| s.target.as_str()),
            Leg::Compensation(n) => self
                .steps
                .get(n as usize)
                .and_then(|s| s.compensate.as_deref()),
        }
    }

    /// The step of the current leg.
    pub fn step(&self) -> Option<&Step> {
        let (Leg::Step(n) | Leg::Compensation(n)) = self.leg;
        self.steps.get(n as usize)
    }

    pub(crate) fn step_mut(&mut self) -> Option<&mut Step> {
        let (Leg::Step(n) | Leg::Compensation(n)) = self.leg;
        self.steps.get_mut(n as usize)
    }

    /// The step whose compensation comes next: none while one is underway or refused (they
    /// go in reverse order, one at a time), else the last step that succeeded, can be undone
    /// and was not. `None` also when the task is not compensating.
    pub fn next_compensation(&self) -> Option<u32> {
        if !self.compensating {
            return None;
        }
        if self.steps.iter().any(Step::compensation_open) {
            return None;
        }
        self.steps
            .iter()
            .rposition(|s| s.owes_compensation())
            .map(|n| n as u32)
    }

    /// Whether some step that succeeded and can be undone was not: a failure now is
    /// compensated rather than final.
    pub fn owes_compensation(&self) -> bool {
        self.steps.iter().any(Step::owes_compensation)
    }

    /// The compensation the current leg is: a duplicate record's of the leg's step while one
    /// is begun, else the step's own. `None` on a forward step.
    pub fn compensation(&self) -> Option<&Compensation> {
        let Leg::Compensation(_) = self.leg else {
            return None;
        };
        let step = self.step()?;
        (step.duplicates.iter().find(|c| c.outcome.is_open())).or(step.compensation.as_ref())
    }

    pub(crate) fn compensation_mut(&mut self) -> Option<&mut Compensation> {
        let Leg::Compensation(_) = self.leg else {
            return None;
        };
        let step = self.step_mut()?;
        match step.duplicates.iter().position(|c| c.outcome.is_open()) {
            Some(i) => step.duplicates.get_mut(i),
            None => step.compensation.as_mut(),
        }
    }

    /// Whether the current leg undoes a duplicate record rather than its step's own.
    pub fn undoing_duplicate(&self) -> bool {
        let Leg::Compensation(_) = self.leg else {
            return false;
        };
        self.step()
            .is_some_and(|s| s.duplicates.iter().any(|c| c.outcome.is_open()))
    }

    /// The next duplicate record an operator ordered undone (its step and record), while none
    /// is begun and not ended. Duplicates come before any other compensation.
    pub fn next_duplicate(&self) -> Option<(u32, &Compensation)> {
        if self.steps.iter().any(Step::compensation_open) {
            return None;
        }
        (self.steps.iter().enumerate())
            .find_map(|(n, s)| s.owed_duplicate(None).map(|c| (n as u32, c)))
    }

    /// The steps' records a template of the current leg reads (see [`StepRecords`]).
    pub fn step_records(&self) -> StepRecords {
        let mut records = StepRecords::new();
        for step in &self.steps {
            if let StepOutcome::Succeeded { remote_id } = &step.outcome {
                let record = StepRecord {
                    remote_id: remote_id.clone(),
                    answer: step.answer.clone(),
                };
                records.insert(step.name.clone(), record);
            }
        }
        if let (Some(c), Some(step)) = (self.compensation(), self.step()) {
            if c.undoes != records.get(&step.name).map_or("", |r| r.remote_id.as_str()) {
                let duplicate = StepRecord {
                    remote_id: c.undoes.clone(),
                    answer: Answer::new(),
                };
                records.insert(step.name.clone(), duplicate);
            }
        }
        records
    }

    /// Whether any compensation was started.
    pub fn compensation_began(&self) -> bool {
        self.steps.iter().any(|s| s.compensation.is_some())
    }
}

impl Step {
    /// A duplicate record of the step an operator ordered undone and whose undo has not
    /// begun: the one that undoes `remote_id`, or with `None` the first.
    pub fn owed_duplicate(&self, remote_id: Option<&str>) -> Option<&Compensation> {
        self.duplicates.iter().find(|c| {
            c.outcome == CompensationOutcome::Owed && remote_id.is_none_or(|id| c.undoes == id)
        })
    }

    /// Whether a compensation of the step (its own, or a duplicate's) is begun and not ended.
    pub fn compensation_open(&self) -> bool {
        (self.compensation.iter().chain(&self.duplicates)).any(|c| c.outcome.is_open())
    }

    /// Whether the step succeeded, can be undone, and its own compensation has not begun.
    pub fn owes_compensation(&self) -> bool {
        matches!(self.outcome, StepOutcome::Succeeded { .. })
            && self.compensate.is_some()
            && self.compensation.is_none()
    }
}

/// What a call's templates are rendered from: the task's request and, for a multi-step task,
/// the records of its steps ([`StepRecords`]). A one-step task's call is its request alone.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    pub request: &'a AcceptedRequest,
    pub steps: &'a StepRecords,
}

/// The steps of a one-step task's call: none.
static NO_STEPS: StepRecords = StepRecords::new();

impl<'a> From<&'a AcceptedRequest> for Call<'a> {
    fn from(request: &'a AcceptedRequest) -> Call<'a> {
        Call {
            request,
            steps: &NO_STEPS,
        }
    }
}
