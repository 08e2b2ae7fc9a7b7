//! The Kubernetes seam: the one way gpud talks to the API server.
//!
//! - [`connect`]: a client from a kubeconfig file or the in-cluster service account;
//! - [`pace`]: every request of the process through one token bucket (`--api-qps`,
//!   `--api-burst`) and a gate that, while the API server cannot be reached, lets one probe
//!   through after a fully jittered pause, so a fleet comes back spread out;
//! - [`bounded`]: every call with a time limit, failures as one [`ApiError`]; a call is one
//!   request (kube-rs's own retry layer is off), and its caller retries on gpud's backoff,
//!   lengthened by [`ApiError::paced`] to the wait a 429 or 5xx asks for (its `Retry-After`
//!   header or its `Status`'s `retryAfterSeconds`, whichever is longer);
//! - [`NodeClient`]: the one client of this node's Node object (labels, annotations,
//!   conditions, taints, a watch, events about it);
//! - [`events`]: Node events de-duplicated, rate-limited and held in a small outbox;
//!   [`EventSender`] sends them in the background for subsystems whose loop does not;
//! - [`ApiReadiness`]: a subsystem that needs the API server is ready while it gets answers;
//! - [`pods`]: this node's pods as a directory from UID and container ID to names (one list,
//!   then one watch), for the exporter's per-pod usage;
//! - [`SlotBudget`]: a cluster-wide budget of slots on Leases, so that at most N nodes
//!   remediate at once; a slot taken is a [`HeldSlot`], renewed while it lives;
//! - [`evict`]: one pod evicted through the Eviction API, which keeps its disruption budgets.
//!
//! Subsystems that write to the API server (labeller, node status, DRA, MIG reconciler, MPS)
//! use this seam and none of each other's code. Retry pauses come from [`crate::backoff`].

mod call;
mod client;
mod event_sender;
pub mod events;
mod eviction;
mod lease;
mod node;
pub mod pace;
pub mod pods;
pub mod readiness;

pub use call::{ApiError, CALL_TIMEOUT, bounded, within};
pub use client::connect;
pub use event_sender::EventSender;
pub use eviction::{Eviction, evict};
pub use lease::{HeldSlot, SLOT_PREFIX, SlotBudget, slot_name};
pub use node::{
    ConditionRecord, MAX_CONDITION_MESSAGE, NodeClient, NodeView, Watched, clip_message,
};
pub use readiness::ApiReadiness;
