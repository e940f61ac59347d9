//! A circuit breaker per target: closed → open → half-open → closed.
//!
//! While closed, every attempt's outcome goes into a rolling window (the outcomes of the
//! latest `window_calls` attempts by when they started, optionally only those that started
//! within `window`). When the window holds
//! at least `minimum_calls` outcomes and at least `failure_rate` of them are failures, the
//! breaker opens: for `open_for` no task is admitted, so tasks wait *before* recording an
//! intent (no attempt spent, nothing sent, nothing to reconcile). Then it is half-open: at most
//! `half_open_probes` probes go out (a health request when the target has one, else real
//! attempts); as many successes close it, one failure opens it again. A probe with no verdict
//! after `probe_timeout` counts as failed, so a probe that hangs never keeps the breaker
//! half-open.
//!
//! Attempts still running count too, so a remote that hangs opens the breaker soon after
//! `slow_after` rather than after its request timeout: of the attempts admitted between
//! 2 × `slow_after` and `slow_after` ago, when at least `minimum_calls` and at least
//! `failure_rate` of them still run, the breaker opens. The share is taken within one cohort of
//! admissions, so a healthy remote's slow tail (1% of calls slow, at any throughput) stays a
//! small share however many slow calls pile up.
//!
//! What is a failure: an attempt proven not sent by the remote's refusal or failure (connect
//! refused or timed out, TLS handshake, 429, 503, a 5xx configured `not_sent`) when
//! `count_not_sent`, and an unknown outcome (timeout, reset after write, 5xx) when
//! `count_unknown`. A 2xx or 4xx answer is a success: the remote is up. An attempt this
//! process could not start (out of file descriptors, kafka mode's send lease) counts neither
//! way.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sendledger_core::decide::AttemptOutcome;
use sendledger_core::{NotSentCause, UnknownCause};
use tokio::time::Instant;

use crate::metric_definitions::{TARGET_STATE, TARGET_TRANSITIONS_TOTAL};

/// At most this many recent admissions are kept to judge slow calls by.
const MAX_ADMISSIONS_KEPT: usize = 100_000;

/// The validated settings of one target's breaker (`[targets.NAME.breaker]`).
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerSettings {
    pub window_calls: usize,
    pub window: Option<Duration>,
    pub minimum_calls: usize,
    pub failure_rate: f64,
    pub slow_after: Duration,
    pub open_for: Duration,
    pub half_open_probes: u32,
    pub probe_timeout: Duration,
    pub count_not_sent: bool,
    pub count_unknown: bool,
}

/// Where a breaker is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

impl BreakerState {
    pub fn name(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }

    /// The value of `sendledger_target_state`: 0 closed, 1 open, 2 half-open.
    fn gauge(self) -> f64 {
        match self {
            BreakerState::Closed => 0.0,
            BreakerState::Open => 1.0,
            BreakerState::HalfOpen => 2.0,
        }
    }
}

/// A breaker's state as people see it (`/healthz`, the console).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BreakerView {
    pub state: BreakerState,
    /// Outcomes in the window, and of those failures (closed only).
    pub calls: usize,
    pub failures: usize,
    /// Open: how long until probing starts.
    pub probing_in_ms: Option<u64>,
    /// How many times the breaker opened since the process started.
    pub opened: u64,
}

/// What the breaker says to a task that wants to send.
pub enum Admission {
    /// Send; report the attempt's outcome through the ticket.
    Go(Ticket),
    /// The breaker is half-open and wants its health request made before any task is risked:
    /// make it and report its verdict through the ticket, then ask again.
    Check(Ticket),
    /// Do not send before `until`.
    Wait { until: Instant },
}

/// How an attempt's outcome counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Success,
    Failure,
    /// Says nothing about the remote (this process could not start the attempt).
    Neither,
}

pub struct Breaker {
    target: String,
    settings: BreakerSettings,
    inner: Mutex<Inner>,
}

struct Inner {
    state: BreakerState,
    /// Open: when probing may start.
    open_until: Instant,
    /// Closed: the latest outcomes by when their attempts started (start, ticket) → failed.
    /// Ordered by start, not by end, so that failures that end late (timeouts) do not crowd
    /// out the successes of the same moment when sends taper off.
    window: BTreeMap<(Instant, u64), bool>,
    /// Admitted attempts without a verdict yet, by ticket: when admitted.
    running: BTreeMap<u64, Instant>,
    /// Recent admissions, oldest first (ticket, when): the cohorts slow calls are judged in.
    admitted: VecDeque<(u64, Instant)>,
    /// When the cohort of slow calls was last judged: at most every tenth of `slow_after`, so
    /// that admitting an attempt does not scan the cohort each time.
    slow_judged_at: Option<Instant>,
    /// Half-open: the probes out, by ticket: when admitted.
    probes: BTreeMap<u64, Instant>,
    probe_successes: u32,
    next_ticket: u64,
    opened: u64,
}

/// One admitted attempt (or health request). Report its outcome with [`Ticket::finish`];
/// dropped unreported (the attempt was never sent) it counts neither way.
pub struct Ticket {
    breaker: Arc<Breaker>,
    id: u64,
    done: bool,
}

impl Ticket {
    /// The attempt starts (its request is about to be sent): from now on it runs, and counts
    /// as slow past `slow_after`. Time spent before (waiting for a send slot, recording the
    /// intent) is not the remote's.
    pub fn start(&self) {
        self.breaker.started(self.id, Instant::now());
    }

    /// Reports an attempt's outcome, counted by the breaker's settings.
    pub fn finish_outcome(self, outcome: &AttemptOutcome) {
        let verdict = self.breaker.verdict(outcome);
        self.finish(verdict);
    }

    pub fn finish(mut self, verdict: Verdict) {
        self.done = true;
        self.breaker.record(self.id, verdict, Instant::now());
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.done {
            self.breaker
                .record(self.id, Verdict::Neither, Instant::now());
        }
    }
}

impl Breaker {
    pub fn new(target: &str, settings: BreakerSettings) -> Arc<Breaker> {
        let now = Instant::now();
        metrics::gauge!(TARGET_STATE, "target" => target.to_string()).set(0.0);
        Arc::new(Breaker {
            target: target.to_string(),
            settings,
            inner: Mutex::new(Inner {
                state: BreakerState::Closed,
                open_until: now,
                window: BTreeMap::new(),
                running: BTreeMap::new(),
                admitted: VecDeque::new(),
                slow_judged_at: None,
                probes: BTreeMap::new(),
                probe_successes: 0,
                next_ticket: 0,
                opened: 0,
            }),
        })
    }

    pub fn settings(&self) -> &BreakerSettings {
        &self.settings
    }

    /// How an attempt's outcome counts, by the settings.
    pub fn verdict(&self, outcome: &AttemptOutcome) -> Verdict {
        match outcome {
            AttemptOutcome::Succeeded { .. } | AttemptOutcome::Rejected { .. } => Verdict::Success,
            AttemptOutcome::NotSent {
                cause: NotSentCause::LocalResources(_),
                ..
            } => Verdict::Neither,
            AttemptOutcome::NotSent { .. } if self.settings.count_not_sent => Verdict::Failure,
            AttemptOutcome::Unknown {
                cause: UnknownCause::Recovery,
            } => Verdict::Neither,
            AttemptOutcome::Unknown { .. } if self.settings.count_unknown => Verdict::Failure,
            // Configured not to count.
            _ => Verdict::Neither,
        }
    }

    /// Asks to send one attempt now. `health_check`: the target has a health request, which
    /// probes in half-open instead of a task's attempt.
    pub fn admit(self: &Arc<Self>, health_check: bool) -> Admission {
        let now = Instant::now();
        let mut inner = self.lock();
        self.expire(&mut inner, now);
        match inner.state {
            BreakerState::Closed => {
                if let Some(why) = self.tripped(&mut inner, now) {
                    self.open(&mut inner, now, &why);
                    return Admission::Wait {
                        until: inner.open_until,
                    };
                }
                let id = self.ticket(&mut inner);
                Admission::Go(self.issue(id))
            }
            BreakerState::Open => Admission::Wait {
                until: inner.open_until,
            },
            BreakerState::HalfOpen => {
                if inner.probes.len() as u32 >= self.settings.half_open_probes {
                    return Admission::Wait {
                        until: now + self.settings.open_for,
                    };
                }
                let id = self.ticket(&mut inner);
                inner.probes.insert(id, now);
                match health_check {
                    true => Admission::Check(self.issue(id)),
                    false => Admission::Go(self.issue(id)),
                }
            }
        }
    }

    /// The breaker's state now, for people.
    pub fn view(&self) -> BreakerView {
        let now = Instant::now();
        let mut inner = self.lock();
        self.expire(&mut inner, now);
        let failures = inner.window.values().filter(|failed| **failed).count();
        BreakerView {
            state: inner.state,
            calls: inner.window.len(),
            failures,
            probing_in_ms: (inner.state == BreakerState::Open).then(|| {
                u64::try_from(inner.open_until.saturating_duration_since(now).as_millis())
                    .unwrap_or(u64::MAX)
            }),
            opened: inner.opened,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ticket(&self, inner: &mut Inner) -> u64 {
        let id = inner.next_ticket;
        inner.next_ticket += 1;
        id
    }

    /// The attempt of ticket `id` starts now: from here it runs, and may become slow.
    fn started(&self, id: u64, now: Instant) {
        let mut inner = self.lock();
        inner.running.insert(id, now);
        inner.admitted.push_back((id, now));
        // Only the last 2 × slow_after of admissions are ever judged; a bound on memory too.
        let horizon = self.settings.slow_after * 2;
        while inner
            .admitted
            .front()
            .is_some_and(|(_, at)| now.saturating_duration_since(*at) > horizon)
            || inner.admitted.len() > MAX_ADMISSIONS_KEPT
        {
            inner.admitted.pop_front();
        }
    }

    fn issue(self: &Arc<Self>, id: u64) -> Ticket {
        Ticket {
            breaker: self.clone(),
            id,
            done: false,
        }
    }

    fn record(&self, id: u64, verdict: Verdict, now: Instant) {
        let mut inner = self.lock();
        let started = inner.running.remove(&id).unwrap_or(now);
        if inner.probes.remove(&id).is_some() {
            match verdict {
                Verdict::Failure => self.open(&mut inner, now, "a probe failed"),
                Verdict::Success => {
                    inner.probe_successes += 1;
                    if inner.probe_successes >= self.settings.half_open_probes {
                        self.close(&mut inner);
                    }
                }
                Verdict::Neither => {}
            }
            return;
        }
        // Outcomes of attempts admitted before the breaker opened say nothing more once it is
        // open; only the probes decide when it closes.
        if inner.state != BreakerState::Closed || verdict == Verdict::Neither {
            return;
        }
        inner
            .window
            .insert((started, id), verdict == Verdict::Failure);
        while inner.window.len() > self.settings.window_calls {
            inner.window.pop_first();
        }
        if let Some(why) = self.tripped(&mut inner, now) {
            self.open(&mut inner, now, &why);
        }
    }

    /// Time passing: an open breaker's time is up, a probe's time is up.
    fn expire(&self, inner: &mut Inner, now: Instant) {
        if let Some(window) = self.settings.window {
            while inner
                .window
                .first_key_value()
                .is_some_and(|((at, _), _)| now.saturating_duration_since(*at) > window)
            {
                inner.window.pop_first();
            }
        }
        if inner.state == BreakerState::Open && now >= inner.open_until {
            inner.state = BreakerState::HalfOpen;
            inner.probes.clear();
            inner.probe_successes = 0;
            self.transition(BreakerState::HalfOpen);
            tracing::info!(target_name = %self.target, "circuit breaker half-open: probing whether the remote is back");
        }
        if inner.state == BreakerState::HalfOpen
            && inner
                .probes
                .values()
                .any(|at| now.saturating_duration_since(*at) > self.settings.probe_timeout)
        {
            self.open(inner, now, "a probe had no answer in time");
        }
    }

    /// Why the breaker must open, if it must: the window fails often enough, or the attempts
    /// started between 2 × `slow_after` and `slow_after` ago still run often enough.
    fn tripped(&self, inner: &mut Inner, now: Instant) -> Option<String> {
        let settings = &self.settings;
        let over = |failures: usize, calls: usize| {
            calls >= settings.minimum_calls
                && calls > 0
                && failures as f64 >= settings.failure_rate * calls as f64
        };
        let failures = inner.window.values().filter(|failed| **failed).count();
        if over(failures, inner.window.len()) {
            return Some(format!(
                "{failures} of the latest {} attempts failed",
                inner.window.len()
            ));
        }
        if inner
            .slow_judged_at
            .is_some_and(|at| now.saturating_duration_since(at) < settings.slow_after / 10)
        {
            return None;
        }
        inner.slow_judged_at = Some(now);
        // Admissions are in start order: the cohort is one run of them.
        let older_than =
            |d: Duration| move |(_, at): &(u64, Instant)| now.saturating_duration_since(*at) > d;
        let first = inner
            .admitted
            .partition_point(older_than(settings.slow_after * 2));
        let end = inner
            .admitted
            .partition_point(older_than(settings.slow_after));
        let (mut calls, mut slow) = (0, 0);
        for (id, _) in inner.admitted.range(first..end.max(first)) {
            calls += 1;
            slow += usize::from(inner.running.contains_key(id));
        }
        (slow >= settings.minimum_calls && over(slow, calls)).then(|| {
            format!(
                "{slow} of the {calls} attempts started between {} and {} ago still run",
                humantime::format_duration(settings.slow_after * 2),
                humantime::format_duration(settings.slow_after)
            )
        })
    }

    fn open(&self, inner: &mut Inner, now: Instant, why: &str) {
        let from = inner.state;
        inner.state = BreakerState::Open;
        inner.open_until = now + self.settings.open_for;
        inner.window.clear();
        inner.probes.clear();
        inner.probe_successes = 0;
        inner.opened += 1;
        self.transition(BreakerState::Open);
        tracing::warn!(
            target_name = %self.target,
            from = from.name(),
            reason = why,
            open_for_ms = self.settings.open_for.as_millis() as u64,
            "circuit breaker open: tasks of this target wait before their intent, nothing is sent"
        );
    }

    fn close(&self, inner: &mut Inner) {
        inner.state = BreakerState::Closed;
        inner.window.clear();
        inner.probe_successes = 0;
        self.transition(BreakerState::Closed);
        tracing::info!(target_name = %self.target, "circuit breaker closed: the remote answers again");
    }

    fn transition(&self, to: BreakerState) {
        metrics::gauge!(TARGET_STATE, "target" => self.target.clone()).set(to.gauge());
        metrics::counter!(TARGET_TRANSITIONS_TOTAL, "target" => self.target.clone(), "to" => to.name())
            .increment(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> BreakerSettings {
        BreakerSettings {
            window_calls: 10,
            window: None,
            minimum_calls: 4,
            failure_rate: 0.5,
            slow_after: Duration::from_secs(5),
            open_for: Duration::from_secs(2),
            half_open_probes: 1,
            probe_timeout: Duration::from_secs(3),
            count_not_sent: true,
            count_unknown: true,
        }
    }

    /// An admitted attempt, started.
    fn go(b: &Arc<Breaker>) -> Ticket {
        match b.admit(false) {
            Admission::Go(t) => {
                t.start();
                t
            }
            Admission::Check(_) => panic!("asked for a health check"),
            Admission::Wait { .. } => panic!("told to wait in {:?}", b.view().state),
        }
    }

    fn waits(b: &Arc<Breaker>) -> bool {
        matches!(b.admit(false), Admission::Wait { .. })
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn opens_on_the_failure_rate_probes_then_closes() {
        let b = Breaker::new("t", settings());
        // Three failures of three: under the minimum of four, still closed.
        let few = Breaker::new("few", settings());
        for _ in 0..3 {
            go(&few).finish(Verdict::Failure);
        }
        assert_eq!(few.view().state, BreakerState::Closed);
        for _ in 0..4 {
            go(&b).finish(Verdict::Success);
        }
        // 1 of 5, 2 of 6, 3 of 7: under 50%, closed.
        for _ in 0..3 {
            go(&b).finish(Verdict::Failure);
        }
        assert_eq!(b.view().state, BreakerState::Closed);
        // 4 of 8: open.
        go(&b).finish(Verdict::Failure);
        assert_eq!(b.view().state, BreakerState::Open);
        assert!(waits(&b));
        tokio::time::advance(Duration::from_millis(2_001)).await;
        assert_eq!(b.view().state, BreakerState::HalfOpen);
        let probe = go(&b);
        assert!(waits(&b), "one probe at a time");
        probe.finish(Verdict::Success);
        assert_eq!(b.view().state, BreakerState::Closed);
        assert_eq!(b.view().opened, 1);
        go(&b).finish(Verdict::Success);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_failed_probe_opens_again_and_a_hanging_one_does_too_on_time() {
        let b = Breaker::new("t", settings());
        for _ in 0..4 {
            go(&b).finish(Verdict::Failure);
        }
        tokio::time::advance(Duration::from_millis(2_001)).await;
        go(&b).finish(Verdict::Failure);
        assert_eq!(b.view().state, BreakerState::Open);
        tokio::time::advance(Duration::from_millis(2_001)).await;
        let hanging = go(&b);
        tokio::time::advance(Duration::from_millis(2_999)).await;
        assert_eq!(b.view().state, BreakerState::HalfOpen);
        tokio::time::advance(Duration::from_millis(2)).await;
        assert_eq!(
            b.view().state,
            BreakerState::Open,
            "a probe with no verdict after probe_timeout is a failure"
        );
        // Its late answer changes nothing.
        hanging.finish(Verdict::Success);
        assert_eq!(b.view().state, BreakerState::Open);
        assert_eq!(b.view().opened, 3);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn attempts_running_past_slow_after_open_it_before_they_end() {
        let b = Breaker::new("t", settings());
        let running: Vec<Ticket> = (0..4).map(|_| go(&b)).collect();
        tokio::time::advance(Duration::from_secs(4)).await;
        go(&b).finish(Verdict::Success);
        tokio::time::advance(Duration::from_millis(1_001)).await;
        assert!(waits(&b), "four hanging of five: open");
        drop(running);
    }

    /// When sends stop, the failures that end last (timeouts) are judged with the successes
    /// that started with them, not alone.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn late_ending_failures_are_judged_with_their_own_start() {
        let b = Breaker::new("t", settings());
        let mut hung = Vec::new();
        for i in 0..100 {
            let ticket = go(&b);
            if i % 10 == 0 {
                hung.push(ticket);
            } else {
                ticket.finish(Verdict::Success);
            }
        }
        tokio::time::advance(Duration::from_secs(1)).await;
        for ticket in hung {
            ticket.finish(Verdict::Failure);
        }
        assert_eq!(
            b.view().state,
            BreakerState::Closed,
            "10 timeouts ending last, of 100 started together"
        );
    }

    /// A healthy remote with a slow tail: at a high rate, 1 call in 50 runs past `slow_after`
    /// while the others answer at once. Slow calls pile up by the hundred, but within each
    /// cohort of admissions they stay 2%: the breaker stays closed.
    /// Time before the attempt starts (waiting for a send slot) is not the remote's.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn admitted_attempts_not_yet_started_are_not_slow() {
        let b = Breaker::new("t", settings());
        let waiting: Vec<Ticket> = (0..10)
            .map(|_| match b.admit(false) {
                Admission::Go(t) => t,
                _ => panic!("closed"),
            })
            .collect();
        tokio::time::advance(Duration::from_secs(8)).await;
        assert_eq!(b.view().state, BreakerState::Closed);
        assert!(matches!(b.admit(false), Admission::Go(_)));
        for t in waiting {
            t.start();
            t.finish(Verdict::Success);
        }
        assert_eq!(b.view().state, BreakerState::Closed);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_slow_tail_at_a_high_rate_does_not_open_it() {
        let b = Breaker::new("t", settings());
        let mut slow = Vec::new();
        for i in 0..10_000 {
            let ticket = go(&b);
            if i % 50 == 0 {
                slow.push(ticket);
            } else {
                ticket.finish(Verdict::Success);
            }
            // 1,000 a second for 10 s: 200 slow calls run at once by the end.
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        assert_eq!(b.view().state, BreakerState::Closed);
        assert_eq!(slow.len(), 200);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn unsent_tickets_and_local_failures_count_neither_way() {
        let b = Breaker::new("t", settings());
        for _ in 0..20 {
            drop(go(&b));
            go(&b).finish(Verdict::Neither);
        }
        assert_eq!(b.view().state, BreakerState::Closed);
        assert_eq!(b.view().calls, 0);
        // A dropped probe frees its place.
        for _ in 0..4 {
            go(&b).finish(Verdict::Failure);
        }
        tokio::time::advance(Duration::from_millis(2_001)).await;
        drop(go(&b));
        go(&b).finish(Verdict::Success);
        assert_eq!(b.view().state, BreakerState::Closed);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_time_window_forgets_old_outcomes_and_health_checks_probe_first() {
        let b = Breaker::new(
            "t",
            BreakerSettings {
                window: Some(Duration::from_secs(10)),
                ..settings()
            },
        );
        for _ in 0..3 {
            go(&b).finish(Verdict::Failure);
        }
        tokio::time::advance(Duration::from_secs(11)).await;
        go(&b).finish(Verdict::Failure);
        assert_eq!(
            b.view().state,
            BreakerState::Closed,
            "old failures forgotten"
        );
        for _ in 0..3 {
            go(&b).finish(Verdict::Failure);
        }
        assert_eq!(b.view().state, BreakerState::Open);
        tokio::time::advance(Duration::from_millis(2_001)).await;
        let Admission::Check(check) = b.admit(true) else {
            panic!("half-open with a health request: check first");
        };
        assert!(matches!(b.admit(true), Admission::Wait { .. }));
        check.finish(Verdict::Success);
        assert!(matches!(b.admit(true), Admission::Go(_)));
    }

    #[test]
    fn outcomes_count_by_what_they_say_about_the_remote() {
        let b = Breaker::new(
            "t",
            BreakerSettings {
                count_unknown: false,
                ..settings()
            },
        );
        let not_sent = |cause| AttemptOutcome::NotSent {
            cause,
            retry_after_ms: None,
        };
        assert_eq!(
            b.verdict(&not_sent(NotSentCause::Connect("refused".into()))),
            Verdict::Failure
        );
        assert_eq!(
            b.verdict(&not_sent(NotSentCause::Throttled { status: 503 })),
            Verdict::Failure
        );
        assert_eq!(
            b.verdict(&not_sent(NotSentCause::LocalResources("fds".into()))),
            Verdict::Neither
        );
        assert_eq!(
            b.verdict(&AttemptOutcome::Unknown {
                cause: UnknownCause::Timeout
            }),
            Verdict::Neither,
            "unknowns not counted when so configured"
        );
        assert_eq!(
            b.verdict(&AttemptOutcome::Rejected {
                status: 422,
                detail: String::new()
            }),
            Verdict::Success
        );
    }
}
