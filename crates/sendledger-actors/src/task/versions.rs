//! What a task's actor learns of the other versions of its request before it decides
//! (`docs/rules.md`, Task versions): the latest version before a new one, whether an earlier
//! version is still unsettled, whether a later one exists.

use std::sync::Arc;

use actix::prelude::*;
use sendledger_core::decide::{OperatorResolution, Versions};
use sendledger_core::{Identity, PreviousVersion, TaskId};

use super::{Shared, TaskActor};
use crate::error::{Error, Result};
use crate::messages::{Reply, TaskInput};

/// What an input needs to know of the other versions.
enum Need {
    /// A new task's first delivery: the identity's latest version so far, and whether it is
    /// settled. A version at or below it is refused (unless it is this very task).
    New { identity: Identity, version: u32 },
    /// A task not yet sent that follows an earlier version: whether that one is settled.
    Earlier(PreviousVersion),
    /// A retry: whether a later version was accepted.
    Later { identity: Identity, version: u32 },
}

impl TaskActor {
    /// What `input` needs to know of the other versions before it is decided, if anything.
    fn versions_needed(&self, input: &TaskInput) -> Option<Need> {
        let state = &self.state;
        match input {
            TaskInput::Deliver { request, .. } if state.request.is_none() => Some(Need::New {
                identity: request.identity.clone(),
                version: request.version,
            }),
            TaskInput::Operator(OperatorResolution::Retry { .. }, _)
            | TaskInput::RetryOnClose { .. } => {
                let request = state.request.as_ref()?;
                Some(Need::Later {
                    identity: request.identity.clone(),
                    version: request.version,
                })
            }
            TaskInput::Wake { .. } | TaskInput::Continue | TaskInput::Recover => {
                let earlier = state.previous_version?;
                let waits = state.first_intent_at.is_none() && !state.phase.is_terminal();
                waits.then_some(Need::Earlier(earlier))
            }
            _ => None,
        }
    }

    /// Finds what `input` needs to know of the other versions, if anything, then decides it:
    /// `None` when it needs nothing (or found it already).
    pub(super) fn with_versions(
        &mut self,
        input: &TaskInput,
    ) -> Option<ResponseActFuture<Self, Result<Reply>>> {
        if self.versions.is_some() {
            return None;
        }
        let need = self.versions_needed(input)?;
        if let Need::New { version: 0, .. } = &need {
            if let Some(known) = self.known_later_version() {
                // Read with the task's events, and no version accepted since.
                self.versions = Some(Versions::default());
                return known.map(|latest| {
                    let refused = sendledger_core::Error::stale_version(0, latest.version);
                    Box::pin(fut::ready(Err(refused.into()))) as ResponseActFuture<Self, _>
                });
            }
        }
        if let Need::Later { identity, .. } = &need {
            // A retry is decided under the identity's lock, so that no later version is
            // accepted meanwhile; never waited for here (a delivery holding it may be waiting
            // for this very actor).
            match self.shared.identity_locks.try_lock(identity.task_id()) {
                Some(guard) => self.identity_guard = Some(guard),
                None => {
                    return Some(Box::pin(fut::ready(Err(Error::IdentityBusy(self.task_id)))));
                }
            }
        }
        let (shared, task_id) = (self.shared.clone(), self.task_id);
        let found = async move {
            let ledger = shared.ledger.clone();
            ledger
                .read(move |l| find(l, &shared, task_id, need))
                .await
                .map_err(Error::from)
        };
        let input = input.clone();
        Some(Box::pin(found.into_actor(self).then(
            move |found, act, _| -> ResponseActFuture<Self, Result<Reply>> {
                match found {
                    Ok(Ok(versions)) => {
                        act.versions = Some(versions);
                        act.decide_and_append(input)
                    }
                    Ok(Err(refused)) => Box::pin(fut::ready(Err(refused.into()))),
                    Err(e) => Box::pin(fut::ready(Err(e))),
                }
            },
        )))
    }
}

impl TaskActor {
    /// What the actor's start read of its identity's latest version above 0, while it holds:
    /// `Some(None)` when there is none.
    fn known_later_version(&self) -> Option<Option<sendledger_store::Latest>> {
        let super::LaterVersion::Read { accepted, latest } = &self.later_version else {
            return None;
        };
        let now = (self.shared.versions_accepted).load(std::sync::atomic::Ordering::SeqCst);
        (now == *accepted).then_some(*latest)
    }
}

/// Reads what `need` asks in the ledger. A new version that must wait is registered as
/// waiting before the earlier one's state is read, so that either the read finds it settled
/// or its settling finds the registration.
fn find(
    ledger: &sendledger_store::Ledger,
    shared: &Arc<Shared>,
    task_id: TaskId,
    need: Need,
) -> sendledger_store::Result<std::result::Result<Versions, sendledger_core::Error>> {
    let unsettled = |earlier: PreviousVersion| -> sendledger_store::Result<_> {
        shared.waiting.register(earlier.task_id, task_id);
        if ledger.settled(earlier.task_id)? {
            shared.waiting.unregister(earlier.task_id, task_id);
            return Ok(None);
        }
        Ok(Some(earlier))
    };
    Ok(Ok(match need {
        Need::New { identity, version } => match ledger.latest_version(&identity)? {
            Some(latest) if latest.task_id != task_id && latest.version >= version => {
                return Ok(Err(sendledger_core::Error::stale_version(
                    version,
                    latest.version,
                )));
            }
            Some(latest) if latest.task_id != task_id => {
                let previous = PreviousVersion {
                    version: latest.version,
                    task_id: latest.task_id,
                };
                Versions {
                    previous: Some(previous),
                    unsettled: unsettled(previous)?,
                    later: None,
                }
            }
            _ => Versions::default(),
        },
        Need::Earlier(earlier) => Versions {
            unsettled: unsettled(earlier)?,
            ..Versions::default()
        },
        Need::Later { identity, version } => Versions {
            later: (ledger.latest_version(&identity)?)
                .map(|latest| latest.version)
                .filter(|latest| *latest > version),
            ..Versions::default()
        },
    }))
}
