//! Node status: the GPUs' health and the doctor's verdict on gpud's own Node object, as
//! conditions, events and opt-in taints that clear themselves when the GPUs recover.
//!
//! One job per file: [`conditions`] (what the conditions say), [`hold`] (anti-flap),
//! [`state`] (the desired Node, held), [`taints`] (policy and the taint list), [`events`]
//! (which events a change makes), [`service`] (the subsystem's level-triggered loop) and
//! [`args`] (the command line). The API calls, the event outbox and the backoff are the
//! Kubernetes seam's ([`crate::kube`]).

pub mod args;
pub mod conditions;
pub mod events;
pub mod hold;
pub mod service;
pub mod state;
pub mod taints;

pub use args::{NodeStatusArgs, Settings};
pub use service::NodeStatus;
