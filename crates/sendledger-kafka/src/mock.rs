//! librdkafka's mock cluster, owned through its C API: the one place of this crate with
//! `unsafe` code.
//!
//! rust-rdkafka's `MockCluster` keeps the cluster's pointer to itself, and its operations do
//! not include the group settings of the mock; the embedded cluster needs one of them (see
//! [`MockCluster::initial_rebalance_delay`]). This wrapper holds the pointer and calls the
//! few functions the embedded cluster uses, each checked here against librdkafka's source
//! (`rdkafka_mock.c`, the version rdkafka-sys builds):
//!
//! - the cluster lives from `rd_kafka_mock_cluster_new` to `rd_kafka_mock_cluster_destroy`,
//!   called once, in `Drop`, before the client handle it was created on is destroyed;
//! - every other function is safe to call from any thread at any time in between: the
//!   cluster's own thread does the work, and callers either hand it a command on its queue and
//!   wait for the reply (topics, broker up and down), or take the cluster's lock (error
//!   stacks, group settings); the bootstrap list is written once, before `new` returns.

#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::ptr::NonNull;

use rdkafka::bindings as rdsys;
use rdkafka::client::{Client, DefaultClientContext};
use rdkafka::error::{IsError, KafkaError, KafkaResult};
use rdkafka::types::{RDKafkaApiKey, RDKafkaMockCluster, RDKafkaRespErr, RDKafkaType};
use rdkafka::ClientConfig;

/// A mock cluster and the client handle it runs on.
pub(crate) struct MockCluster {
    cluster: NonNull<RDKafkaMockCluster>,
    /// librdkafka keeps the cluster's book-keeping on the handle it was created on, so the
    /// handle must outlive the cluster: fields drop after [`Drop::drop`] destroyed it.
    _handle: Client<DefaultClientContext>,
}

// SAFETY: the cluster is not tied to the thread that created it: its functions may be called
// from any thread (see the module documentation), and the client handle is `Send`.
unsafe impl Send for MockCluster {}
// SAFETY: every function called through `&MockCluster` synchronizes inside librdkafka (the
// cluster's command queue or its lock); none mutates anything Rust can see.
unsafe impl Sync for MockCluster {}

impl MockCluster {
    /// Starts a cluster of `brokers` brokers (ids 1 to `brokers`) listening on localhost.
    pub(crate) fn new(brokers: i32) -> KafkaResult<MockCluster> {
        let config = ClientConfig::new();
        let handle = Client::new(
            &config,
            config.create_native_config()?,
            RDKafkaType::RD_KAFKA_PRODUCER,
            DefaultClientContext,
        )?;
        // SAFETY: `handle` is a live client handle, and it outlives the cluster (see the field).
        let cluster = unsafe { rdsys::rd_kafka_mock_cluster_new(handle.native_ptr(), brokers) };
        let cluster = NonNull::new(cluster).ok_or(KafkaError::MockCluster(
            rdkafka::types::RDKafkaErrorCode::Fail,
        ))?;
        Ok(MockCluster {
            cluster,
            _handle: handle,
        })
    }

    /// The brokers' `host:port` list.
    pub(crate) fn bootstrap_servers(&self) -> String {
        // SAFETY: the cluster is live; the list is a NUL-terminated string written before
        // `new` returned and freed only when the cluster is destroyed, after this copy.
        let list = unsafe { CStr::from_ptr(rdsys::rd_kafka_mock_cluster_bootstraps(self.ptr())) };
        list.to_string_lossy().into_owned()
    }

    /// How long a consumer group's first member waits for others before the group's leader is
    /// elected and partitions are assigned (a broker's `group.initial.rebalance.delay.ms`).
    /// Groups formed later use the new value.
    pub(crate) fn initial_rebalance_delay(&self, ms: i32) {
        // SAFETY: the cluster is live; the setting is written under the cluster's lock.
        unsafe { rdsys::rd_kafka_mock_group_initial_rebalance_delay_ms(self.ptr(), ms) }
    }

    pub(crate) fn create_topic(&self, topic: &str, partitions: i32) -> KafkaResult<()> {
        let name = CString::new(topic)?;
        // SAFETY: the cluster is live; `name` is NUL-terminated and outlives the call (the
        // cluster copies it).
        let err =
            unsafe { rdsys::rd_kafka_mock_topic_create(self.ptr(), name.as_ptr(), partitions, 1) };
        mock_result(err)
    }

    /// Broker `id` closes its connections and refuses new ones (`up`: accepts them again).
    pub(crate) fn set_broker_up(&self, id: i32, up: bool) -> KafkaResult<()> {
        // SAFETY: the cluster is live; the command waits for the cluster's thread to apply it.
        let err = unsafe {
            if up {
                rdsys::rd_kafka_mock_broker_set_up(self.ptr(), id)
            } else {
                rdsys::rd_kafka_mock_broker_set_down(self.ptr(), id)
            }
        };
        mock_result(err)
    }

    pub(crate) fn push_request_errors(&self, api: RDKafkaApiKey, errors: &[RDKafkaRespErr]) {
        // SAFETY: the cluster is live; `errors` is valid for `errors.len()` elements and copied
        // under the cluster's lock.
        unsafe {
            rdsys::rd_kafka_mock_push_request_errors_array(
                self.ptr(),
                api.into(),
                errors.len(),
                errors.as_ptr(),
            )
        }
    }

    pub(crate) fn clear_request_errors(&self, api: RDKafkaApiKey) {
        // SAFETY: the cluster is live; the stack is cleared under the cluster's lock.
        unsafe { rdsys::rd_kafka_mock_clear_request_errors(self.ptr(), api.into()) }
    }

    fn ptr(&self) -> *mut RDKafkaMockCluster {
        self.cluster.as_ptr()
    }
}

impl Drop for MockCluster {
    fn drop(&mut self) {
        // SAFETY: the cluster is live and destroyed once, here; `&mut self` means no call on
        // it is in flight. The handle it was created on is dropped after this.
        unsafe { rdsys::rd_kafka_mock_cluster_destroy(self.ptr()) }
    }
}

fn mock_result(err: RDKafkaRespErr) -> KafkaResult<()> {
    if err.is_error() {
        return Err(KafkaError::MockCluster(err.into()));
    }
    Ok(())
}
