//! Node status: the GPUs' health and the doctor's verdict on gpud's own Node object, as
//! conditions, events and opt-in taints that clear themselves when the GPUs recover.
//!
//! One job per file: [`conditions`] (what the conditions say), [`hold`] (anti-flap),
//! [`state`] (the desired Node, held), [`taints`] (policy and the taint list), [`events`]
//! (de-duplicated, rate-limited events), [`api`] (the API calls), [`service`] (the
//! subsystem's level-triggered loop) and [`args`] (the command line).

pub mod api;
pub mod args;
pub mod conditions;
pub mod events;
pub mod hold;
pub mod service;
pub mod state;
pub mod taints;

pub use args::{NodeStatusArgs, Settings};
pub use service::NodeStatus;
