//! Retry math: capped exponential backoff with full jitter (or none) and a `Retry-After`
//! floor, for every attempt not sent or by the class of why it was not sent.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::event::NotSentCause;

/// How a target retries attempts that certainly did not reach it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetryPolicy {
    /// Attempts in all, the first included. At least 1.
    pub max_attempts: u32,
    pub initial_backoff_ms: u64,
    pub max_backoff_ms: u64,
    /// Growth of the backoff ceiling per attempt. At least 1.0 (1.0: a fixed interval).
    pub multiplier: f64,
    /// Full jitter: the delay is uniform in `[0, ceiling]`. Off: the delay is the ceiling.
    #[serde(default = "full_jitter")]
    pub jitter: bool,
    /// Overrides for the attempts not sent for one class of reason: their own attempts
    /// (counted within the class, and within `max_attempts` in all) and backoff (growing with
    /// the class's own count). Their own `classes` are not used.
    #[serde(default)]
    pub classes: BTreeMap<RetryClass, RetryPolicy>,
}

fn full_jitter() -> bool {
    true
}

/// Why an attempt was not sent, as retries tell it apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryClass {
    /// DNS, connect refused or timed out, TLS handshake.
    Connect,
    /// 429, or 503 with `Retry-After`.
    Throttled,
    /// A 5xx the target declares `not_sent`.
    ServerError,
}

impl RetryClass {
    pub const ALL: [RetryClass; 3] = [
        RetryClass::Connect,
        RetryClass::Throttled,
        RetryClass::ServerError,
    ];

    /// The class of a cause; `None` for this process's own (`LocalResources`), which no
    /// retry policy counts.
    pub fn of(cause: &NotSentCause) -> Option<RetryClass> {
        match cause {
            NotSentCause::Connect(_) => Some(RetryClass::Connect),
            NotSentCause::Throttled { .. } => Some(RetryClass::Throttled),
            NotSentCause::ServerError { .. } => Some(RetryClass::ServerError),
            NotSentCause::LocalResources(_) | NotSentCause::NotBuilt(_) => None,
        }
    }

    /// The name in configuration (`retry.connect`, ...).
    pub fn name(self) -> &'static str {
        match self {
            RetryClass::Connect => "connect",
            RetryClass::Throttled => "throttled",
            RetryClass::ServerError => "server_error",
        }
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 8,
            initial_backoff_ms: 100,
            max_backoff_ms: 30_000,
            multiplier: 2.0,
            jitter: true,
            classes: BTreeMap::new(),
        }
    }
}

impl RetryPolicy {
    /// The policy of one class: its override, or this one.
    pub fn for_class(&self, class: Option<RetryClass>) -> &RetryPolicy {
        class.and_then(|c| self.classes.get(&c)).unwrap_or(self)
    }

    /// The ceiling of the backoff after the given (1-based) attempt, before jitter.
    pub fn ceiling_ms(&self, attempt: u32) -> u64 {
        let exp = attempt.saturating_sub(1).min(64) as i32;
        let grown = self.initial_backoff_ms as f64 * self.multiplier.max(1.0).powi(exp);
        if grown.is_finite() && grown < self.max_backoff_ms as f64 {
            grown as u64
        } else {
            self.max_backoff_ms
        }
    }

    /// The delay before the attempt after `attempt`: uniform in `[0, ceiling]` ("full jitter",
    /// drawn from `random`), and never shorter than the remote's `Retry-After`.
    pub fn backoff_ms(&self, attempt: u32, retry_after_ms: Option<u64>, random: u64) -> u64 {
        let ceiling = self.ceiling_ms(attempt);
        let jittered = if !self.jitter {
            ceiling
        } else if ceiling == u64::MAX {
            random
        } else {
            random % (ceiling + 1)
        };
        jittered.max(retry_after_ms.unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 10,
            initial_backoff_ms: 100,
            max_backoff_ms: 5_000,
            multiplier: 2.0,
            ..RetryPolicy::default()
        }
    }

    #[test]
    fn without_jitter_the_delay_is_the_ceiling_and_a_class_has_its_own_policy() {
        let fixed = RetryPolicy {
            initial_backoff_ms: 2_000,
            max_backoff_ms: 2_000,
            multiplier: 1.0,
            jitter: false,
            ..RetryPolicy::default()
        };
        assert_eq!(fixed.backoff_ms(1, None, 7), 2_000);
        assert_eq!(fixed.backoff_ms(5, None, 7), 2_000);
        let p = RetryPolicy {
            classes: BTreeMap::from([(RetryClass::ServerError, fixed.clone())]),
            ..policy()
        };
        assert_eq!(p.for_class(Some(RetryClass::ServerError)), &fixed);
        assert_eq!(p.for_class(Some(RetryClass::Connect)), &p);
        assert_eq!(p.for_class(None), &p);
        assert_eq!(
            RetryClass::of(&NotSentCause::Throttled { status: 429 }),
            Some(RetryClass::Throttled)
        );
        assert_eq!(
            RetryClass::of(&NotSentCause::LocalResources("fd".into())),
            None
        );
    }

    #[test]
    fn ceiling_grows_then_caps() {
        let p = policy();
        let ceilings: Vec<u64> = (1..=8).map(|a| p.ceiling_ms(a)).collect();
        assert_eq!(ceilings, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        assert_eq!(p.ceiling_ms(u32::MAX), 5_000);
    }

    #[test]
    fn retry_after_is_a_floor() {
        let p = policy();
        assert_eq!(p.backoff_ms(1, Some(2_000), 7), 2_000);
        // Even above the cap: the remote said so.
        assert_eq!(p.backoff_ms(9, Some(60_000), 7), 60_000);
        assert_eq!(p.backoff_ms(1, None, 7), 7);
    }

    proptest! {
        #[test]
        fn backoff_stays_within_bounds(attempt in 1u32..100, random: u64, retry_after in proptest::option::of(0u64..100_000)) {
            let p = policy();
            let d = p.backoff_ms(attempt, retry_after, random);
            prop_assert!(d >= retry_after.unwrap_or(0));
            prop_assert!(d <= p.ceiling_ms(attempt).max(retry_after.unwrap_or(0)));
        }
    }
}
