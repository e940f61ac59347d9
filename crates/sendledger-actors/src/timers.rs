//! Timers: wakes tasks whose retry or check is due. The durable copy of every timer is in the
//! ledger's `timers` column family (written with the task's events); this actor holds the
//! schedule in memory and is reloaded from the ledger at start-up.

use std::collections::BTreeSet;
use std::time::Duration;

use actix::prelude::*;
use sendledger_core::TaskId;

use crate::messages::{Route, Schedule, TaskInput};

pub struct Timers {
    due: BTreeSet<(u64, TaskId)>,
    registry: Recipient<Route>,
    tick: Duration,
}

impl Timers {
    pub fn new(registry: Recipient<Route>, tick: Duration) -> Timers {
        Timers {
            due: BTreeSet::new(),
            registry,
            tick,
        }
    }

    fn fire(&mut self) {
        let now = crate::now_ms();
        while let Some(&(at, task_id)) = self.due.first() {
            if at > now {
                break;
            }
            self.due.pop_first();
            self.registry.do_send(Route {
                task_id,
                input: TaskInput::Wake { due: at },
            });
        }
    }
}

impl Actor for Timers {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(usize::MAX);
        ctx.run_interval(self.tick, |act, _| act.fire());
    }
}

impl Handler<Schedule> for Timers {
    type Result = ();

    fn handle(&mut self, msg: Schedule, _ctx: &mut Context<Self>) {
        self.due.insert((msg.at, msg.task_id));
    }
}
