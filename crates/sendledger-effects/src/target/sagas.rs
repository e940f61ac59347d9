//! Multi-step tasks' steps (`[sagas.NAME]`), checked against the targets at load: every
//! step's target exists, and every template reads only steps that have run when it is
//! rendered.

use std::collections::BTreeMap;
use std::sync::Arc;

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
            self.keep_answers(saga, &field(""))?;
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

    /// Tells each step's target which fields of its answers the saga's templates read
    /// (`{steps.NAME.response./pointer}`), so that they are kept when the step is confirmed.
    fn keep_answers(&mut self, saga: &SagaConfig, field: &str) -> Result<()> {
        let mut keep: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for step in &saga.steps {
            let undo = step.compensate.iter();
            for name in std::iter::once(&step.target).chain(undo) {
                let Some(target) = self.by_name.get(name) else {
                    continue;
                };
                for (read, pointer) in target.answers_read() {
                    let Some(of) = saga.steps.iter().find(|s| s.name == read) else {
                        continue;
                    };
                    keep.entry(of.target.as_str())
                        .or_default()
                        .push(pointer.to_string());
                }
            }
        }
        for (name, pointers) in keep {
            let Some(target) = self.by_name.get_mut(name).and_then(Arc::get_mut) else {
                return Err(Error::config(
                    field,
                    "the targets are in use already: sagas are added to targets as they are loaded",
                ));
            };
            let fields = &mut target.rules.answer_fields;
            fields.extend(pointers);
            fields.sort();
            fields.dedup();
        }
        Ok(())
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
                "target `{}` reads step `{read}`'s record (`{{steps.{read}...}}`), and step `{read}` {}",
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
