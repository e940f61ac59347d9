//! Multi-step tasks' steps (`[sagas.NAME]`), checked against the targets at load: every
//! step's target exists, and every template reads only steps that have run when it is
//! rendered.

use std::collections::BTreeMap;

use sendledger_core::PlannedStep;

use super::{Target, Targets};
use crate::config::SagaConfig;
use crate::error::{Error, Result};

/// The most steps a saga may have.
pub const MAX_STEPS: usize = 16;

impl Targets {
    /// These targets with the sagas of `config`, checked: a saga's name is not a target's;
    /// it has 1 to [`MAX_STEPS`] steps of distinct names; each step's target and
    /// compensating target are configured; and the templates of a step's target read only
    /// the steps before it, those of its compensating target only it and the steps before it.
    pub fn with_sagas(mut self, config: &BTreeMap<String, SagaConfig>) -> Result<Targets> {
        for (name, saga) in config {
            let field = |rest: &str| format!("sagas.{name}{rest}");
            if self.by_name.contains_key(name) {
                return Err(Error::config(
                    field(""),
                    format!("`{name}` is also a target; a request's `target` names one or the other: rename one"),
                ));
            }
            if saga.steps.is_empty() || saga.steps.len() > MAX_STEPS {
                return Err(Error::config(
                    field(".steps"),
                    format!(
                        "has {} steps; a saga has 1 to {MAX_STEPS}",
                        saga.steps.len()
                    ),
                ));
            }
            let mut before: Vec<&str> = Vec::new();
            for (i, step) in saga.steps.iter().enumerate() {
                let at = |rest: &str| field(&format!(".steps[{i}]{rest}"));
                let valid = !step.name.is_empty()
                    && step
                        .name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                if !valid {
                    return Err(Error::config(
                        at(".name"),
                        format!(
                            "`{}` is not a step name: use letters, digits, `_` and `-`",
                            step.name
                        ),
                    ));
                }
                if before.contains(&step.name.as_str()) {
                    return Err(Error::config(
                        at(".name"),
                        format!("`{}` names two steps", step.name),
                    ));
                }
                let target = self.step_target(&step.target, &at(".target"))?;
                reads_only(target, &before, &at(".target"))?;
                before.push(&step.name);
                if let Some(undo) = &step.compensate {
                    let compensate = self.step_target(undo, &at(".compensate"))?;
                    reads_only(compensate, &before, &at(".compensate"))?;
                }
            }
            let steps = saga
                .steps
                .iter()
                .map(|s| PlannedStep {
                    name: s.name.clone(),
                    target: s.target.clone(),
                    compensate: s.compensate.clone(),
                })
                .collect();
            self.sagas.insert(name.clone(), steps);
        }
        Ok(self)
    }

    /// The steps of saga `name`, as a task of it records them when it is accepted.
    pub fn steps(&self, name: &str) -> Option<&[PlannedStep]> {
        self.sagas.get(name).map(Vec::as_slice)
    }

    fn step_target(&self, name: &str, field: &str) -> Result<&Target> {
        match self.by_name.get(name) {
            Some(target) => Ok(target),
            None => Err(Error::config(
                field,
                format!("`{name}` is not a configured target"),
            )),
        }
    }
}

/// Refuses `target` when one of its templates reads a step not in `steps`.
fn reads_only(target: &Target, steps: &[&str], field: &str) -> Result<()> {
    match target.steps_read().find(|read| !steps.contains(read)) {
        Some(read) => Err(Error::config(
            field,
            format!(
                "target `{}` reads `{{steps.{read}.remote_id}}`, and step `{read}` {}",
                target.name,
                if steps.is_empty() {
                    "is not one that has run when this call is made (none has)".to_string()
                } else {
                    format!(
                        "is not one that has run when this call is made ({})",
                        steps.join(", ")
                    )
                }
            ),
        )),
        None => Ok(()),
    }
}
