//! Reading back what sendledger publishes, as its consumers do (the demo, the Kafka benchmark,
//! the tests): [`TopicReader`] reads every partition of a topic from its beginning, and
//! [`ResultsReader`] follows the results topic on a thread of its own, deduplicating results by
//! their event id.
//!
//! Readers are assigned their partitions and commit nothing, so they never disturb a consumer
//! group. Creating a reader (a metadata request) and polling block: they belong on a thread of
//! their own, in `spawn_blocking` or `block_in_place`, never directly on an async executor
//! thread.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use sendledger_core::{ResultStatus, TaskResult};

use crate::cluster::Kafka;
use crate::config::Role;
use crate::error::{Error, Result};
use crate::publisher::EVENT_ID_HEADER;

/// One record as read from a topic.
#[derive(Debug, Clone)]
pub struct Record {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    /// Header names and values, in order.
    pub headers: Vec<(String, Vec<u8>)>,
    pub payload: Option<Vec<u8>>,
}

impl Record {
    /// The first header named `name`, as text (invalid UTF-8 replaced).
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }

    /// The id of the event the record announces (the `sendledger-event-id` header).
    pub fn event_id(&self) -> Option<String> {
        self.header(EVENT_ID_HEADER)
    }

    /// A copy of a consumed message.
    pub fn from_message(message: &impl Message) -> Record {
        let headers = message
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
                    .collect()
            })
            .unwrap_or_default();
        Record {
            partition: message.partition(),
            offset: message.offset(),
            key: message.key().map(<[u8]>::to_vec),
            headers,
            payload: message.payload().map(<[u8]>::to_vec),
        }
    }

    /// The key as text (empty when there is none).
    pub fn key_text(&self) -> String {
        String::from_utf8_lossy(self.key.as_deref().unwrap_or_default()).into_owned()
    }
}

/// How long [`TopicReader::from_beginning`] waits for the topic's metadata.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Reads every partition of one topic from its beginning.
pub struct TopicReader {
    consumer: BaseConsumer,
}

impl TopicReader {
    /// Assigns the configured number of partitions (`kafka.partitions`) of `topic`, each from
    /// its beginning. Blocking: looks the topic up first (for at most 5 s).
    pub fn from_beginning(kafka: &Kafka, topic: &str) -> Result<TopicReader> {
        let consumer: BaseConsumer = kafka.client_config(Role::Replay).create()?;
        // librdkafka asks for the start of a partition assigned before its leader is known
        // only 500 ms later: without the lookup, every reader read its first record half a
        // second late. When the lookup fails librdkafka keeps trying, as before.
        if let Err(e) = consumer.fetch_metadata(Some(topic), LOOKUP_TIMEOUT) {
            tracing::debug!(topic, error = %e, "cannot look the topic up before reading it");
        }
        let mut tpl = TopicPartitionList::new();
        for p in 0..kafka.config().partitions {
            tpl.add_partition_offset(topic, p, Offset::Beginning)?;
        }
        consumer.assign(&tpl)?;
        Ok(TopicReader { consumer })
    }

    /// The next record, if one arrives within `timeout`. Blocking.
    pub fn next(&self, timeout: Duration) -> Option<Result<Record>> {
        let message = match self.consumer.poll(timeout)? {
            Ok(m) => m,
            Err(e) => return Some(Err(e.into())),
        };
        Some(Ok(Record::from_message(&message)))
    }
}

/// Follows the results topic from its beginning, as a consumer of sendledger would: results
/// are deduplicated by event id, and per task it keeps its distinct terminal results and when
/// its first answer was read.
pub struct ResultsReader {
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

#[derive(Default)]
struct Seen {
    event_ids: HashSet<String>,
    /// Task id → its distinct terminal results (event ids).
    terminal: HashMap<String, HashSet<String>>,
    /// Tasks with a terminal or manual-review result, and when the first was read.
    answered: HashMap<String, Instant>,
    /// Tasks with more than one distinct terminal result (kept as they arrive: progress is
    /// asked for every few milliseconds, and counting would walk every task each time).
    conflicting: usize,
}

impl Seen {
    fn add(&mut self, event_id: String, result: TaskResult, read_at: Instant) {
        if !self.event_ids.insert(event_id.clone()) {
            return;
        }
        if result.status.is_terminal() {
            let ids = self.terminal.entry(result.task_id.clone()).or_default();
            ids.insert(event_id);
            if ids.len() == 2 {
                self.conflicting += 1;
            }
        }
        if result.status.is_terminal() || result.status == ResultStatus::ManualReview {
            self.answered.entry(result.task_id).or_insert(read_at);
        }
    }
}

impl ResultsReader {
    /// Starts reading the results topic on a thread of its own. Blocking, briefly (see
    /// [`TopicReader::from_beginning`]).
    pub fn start(kafka: &Kafka) -> Result<ResultsReader> {
        let reader = TopicReader::from_beginning(kafka, &kafka.config().results_topic)?;
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (seen.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("sendledger-results-reader".into())
            .spawn(move || {
                while !st.load(Ordering::Relaxed) {
                    let Some(Ok(record)) = reader.next(Duration::from_millis(50)) else {
                        continue;
                    };
                    let result: Option<TaskResult> = record
                        .payload
                        .as_deref()
                        .and_then(|p| serde_json::from_slice(p).ok());
                    let (Some(id), Some(result)) = (record.event_id(), result) else {
                        tracing::error!("a results record without event id or not a TaskResult");
                        continue;
                    };
                    let read_at = Instant::now();
                    s.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .add(id, result, read_at);
                }
            })
            .map_err(|_| Error::Thread {
                what: "results reader",
            })?;
        Ok(ResultsReader { seen, stop, thread })
    }

    /// Tasks answered so far, and tasks with more than one distinct terminal result.
    pub fn progress(&self) -> (usize, usize) {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        (seen.answered.len(), seen.conflicting)
    }

    /// When the first answer (a terminal or manual-review result) of each answered task was
    /// read, by task id.
    pub fn answered_at(&self) -> HashMap<String, Instant> {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .answered
            .clone()
    }

    /// Stops reading; returns the last [`ResultsReader::progress`].
    pub fn stop(self) -> (usize, usize) {
        let out = self.progress();
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        out
    }
}
