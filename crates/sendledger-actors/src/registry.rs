//! The registry: task id → actor. Routes every message, spawns actors on demand, bounds how
//! many are alive, and passivates idle ones without ever letting two actors of one task live.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use actix::prelude::*;
use sendledger_core::TaskId;
use tokio::sync::oneshot;

use crate::error::{Error, Result};
use crate::messages::{Drain, Idle, Load, Reply, Route, TaskInput, TaskMsg};
use crate::task::{Shared, TaskActor};

struct Entry {
    addr: Addr<TaskActor>,
    /// Messages forwarded to the actor. An actor reporting idle after handling exactly this
    /// many has none in its mailbox, so it can be dropped without losing one.
    forwarded: u64,
}

type Pending = (TaskId, TaskInput, oneshot::Sender<Result<Reply>>);

pub struct Registry {
    shared: Arc<Shared>,
    /// Worker threads the task actors run on (they stop with the system).
    arbiters: Vec<Arbiter>,
    next_arbiter: usize,
    live: HashMap<TaskId, Entry>,
    max_live: usize,
    pending: VecDeque<Pending>,
    /// How many pending messages each task has, to keep a task's messages in order.
    pending_per_task: HashMap<TaskId, usize>,
    draining: bool,
}

impl Registry {
    pub fn new(shared: Arc<Shared>, arbiters: Vec<Arbiter>, max_live: usize) -> Registry {
        Registry {
            shared,
            arbiters,
            next_arbiter: 0,
            live: HashMap::new(),
            max_live: max_live.max(1),
            pending: VecDeque::new(),
            pending_per_task: HashMap::new(),
            draining: false,
        }
    }

    /// Forwards to a live actor, or spawns one. The caller checked for room.
    fn forward(&mut self, task_id: TaskId, input: TaskInput) -> Request<TaskActor, TaskMsg> {
        let entry = self.live.entry(task_id).or_insert_with(|| {
            let shared = self.shared.clone();
            let arbiter = &self.arbiters[self.next_arbiter % self.arbiters.len()];
            self.next_arbiter = self.next_arbiter.wrapping_add(1);
            // A request without a version: its actor reads, with its events, whether its
            // identity has a later version (see `TaskActor::started`).
            let identity = match &input {
                TaskInput::Deliver { request, .. } if request.version == 0 => {
                    Some(request.identity.clone())
                }
                _ => None,
            };
            let addr = TaskActor::start_in_arbiter(&arbiter.handle(), move |_| {
                TaskActor::new(task_id, shared, identity)
            });
            Entry { addr, forwarded: 0 }
        });
        entry.forwarded += 1;
        entry.addr.send(TaskMsg(input))
    }

    fn has_room(&self, task_id: &TaskId) -> bool {
        self.live.contains_key(task_id) || self.live.len() < self.max_live
    }

    fn pump(&mut self, ctx: &mut Context<Self>) {
        while let Some((task_id, _, _)) = self.pending.front() {
            if !self.has_room(task_id) {
                break;
            }
            let Some((task_id, input, tx)) = self.pending.pop_front() else {
                break;
            };
            if let Some(n) = self.pending_per_task.get_mut(&task_id) {
                *n -= 1;
                if *n == 0 {
                    self.pending_per_task.remove(&task_id);
                }
            }
            let request = self.forward(task_id, input);
            ctx.spawn(
                async move {
                    let _ = tx.send(request.await.unwrap_or(Err(Error::Stopped)));
                }
                .into_actor(self),
            );
        }
    }
}

impl Actor for Registry {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(usize::MAX);
    }
}

impl Handler<Route> for Registry {
    type Result = ResponseFuture<Result<Reply>>;

    fn handle(&mut self, msg: Route, _ctx: &mut Context<Self>) -> Self::Result {
        let Route { task_id, input } = msg;
        let live = self.live.contains_key(&task_id);
        let takes_new_work = matches!(
            input,
            TaskInput::Deliver { .. }
                | TaskInput::Reject { .. }
                | TaskInput::Operator(..)
                | TaskInput::RetryOnClose { .. }
        ) || !live;
        if self.draining && takes_new_work && !matches!(input, TaskInput::Lookup { .. }) {
            return Box::pin(async { Err(Error::ShuttingDown) });
        }
        // Keep each task's messages in order: once one waits, later ones wait behind it.
        let queued = self.pending_per_task.contains_key(&task_id);
        if !queued && self.has_room(&task_id) {
            let request = self.forward(task_id, input);
            return Box::pin(async move { request.await.unwrap_or(Err(Error::Stopped)) });
        }
        let (tx, rx) = oneshot::channel();
        self.pending.push_back((task_id, input, tx));
        *self.pending_per_task.entry(task_id).or_default() += 1;
        Box::pin(async move { rx.await.unwrap_or(Err(Error::Stopped)) })
    }
}

impl Handler<Idle> for Registry {
    type Result = ();

    fn handle(&mut self, msg: Idle, ctx: &mut Context<Self>) {
        if self
            .live
            .get(&msg.task_id)
            .is_some_and(|e| e.forwarded == msg.handled)
        {
            // Dropping the last address stops the actor: its mailbox is empty and it has
            // nothing in flight.
            self.live.remove(&msg.task_id);
            self.pump(ctx);
        }
    }
}

impl Handler<Drain> for Registry {
    type Result = ();

    fn handle(&mut self, _: Drain, _ctx: &mut Context<Self>) {
        self.draining = true;
        self.pending_per_task.clear();
        for (_, _, tx) in self.pending.drain(..) {
            let _ = tx.send(Err(Error::ShuttingDown));
        }
    }
}

impl Handler<Load> for Registry {
    type Result = MessageResult<Load>;

    fn handle(&mut self, _: Load, _ctx: &mut Context<Self>) -> Self::Result {
        MessageResult((self.live.len(), self.pending.len()))
    }
}
