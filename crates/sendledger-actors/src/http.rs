//! The engine's remote over HTTP: the targets configured in the effects crate.

use sendledger_core::decide::AttemptOutcome;
use sendledger_core::event::{Millis, NotSentCause};
use sendledger_core::{AcceptedRequest, BoxFuture, Policy};
use sendledger_effects::Targets;

use crate::remote::{Remote, Slot};

pub struct HttpRemote {
    targets: Targets,
}

impl HttpRemote {
    pub fn new(targets: Targets) -> HttpRemote {
        HttpRemote { targets }
    }
}

impl Remote for HttpRemote {
    fn policy(&self, target: &str) -> Option<Policy> {
        self.targets.get(target).map(|t| t.policy())
    }

    fn reserve(&self, target: &str) -> BoxFuture<Slot> {
        match self.targets.get(target).cloned() {
            Some(target) => Box::pin(async move { Box::new(target.reserve().await) as Slot }),
            None => Box::pin(std::future::ready(Box::new(()) as Slot)),
        }
    }

    fn attempt(
        &self,
        request: &AcceptedRequest,
        attempt: u32,
        idempotency_key: Option<&str>,
    ) -> BoxFuture<AttemptOutcome> {
        let Some(target) = self.targets.get(&request.target).cloned() else {
            let cause =
                NotSentCause::Connect(format!("target `{}` is not configured", request.target));
            return Box::pin(std::future::ready(AttemptOutcome::NotSent {
                cause,
                retry_after_ms: None,
            }));
        };
        let request = request.clone();
        let key = idempotency_key.map(str::to_owned);
        Box::pin(async move { target.execute(&request, attempt, key.as_deref()).await })
    }

    fn lookup(
        &self,
        request: &AcceptedRequest,
        since: Millis,
    ) -> BoxFuture<Result<Vec<String>, String>> {
        let Some(target) = self.targets.get(&request.target).cloned() else {
            let err = format!("target `{}` is not configured", request.target);
            return Box::pin(std::future::ready(Err(err)));
        };
        let request = request.clone();
        Box::pin(async move {
            target
                .lookup(&request, Some(since))
                .await
                .map_err(|e| e.to_string())
        })
    }
}
