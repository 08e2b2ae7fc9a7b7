//! The Node events a change makes: one per GPU health transition (failures, degradations,
//! recoveries) and one per change of a condition's shown status. They go out through the
//! Kubernetes seam's outbox ([`crate::kube::events::Outbox`]).

use std::time::SystemTime;

use super::conditions::{Condition, Status};
use crate::inventory::health::HealthState;
use crate::inventory::transitions::Transition;
use crate::kube::events::{Kind, NodeEvent};

/// The event for a device's health transition.
pub fn transition(change: &Transition, at: SystemTime) -> NodeEvent {
    let (kind, reason) = match change.to.state {
        HealthState::Unhealthy => (Kind::Warning, "GPUUnhealthy"),
        HealthState::Degraded => (Kind::Warning, "GPUDegraded"),
        HealthState::Healthy => (Kind::Normal, "GPURecovered"),
    };
    NodeEvent {
        kind,
        reason,
        message: change.line(),
        at,
    }
}

/// The event for a condition whose shown status changed.
pub fn condition(condition: &Condition, at: SystemTime) -> NodeEvent {
    let kind = if condition.status == Status::False {
        Kind::Warning
    } else {
        Kind::Normal
    };
    NodeEvent {
        kind,
        reason: condition.reason,
        message: format!(
            "{} is {}: {}",
            condition.kind,
            condition.status.as_str(),
            condition.message
        ),
        at,
    }
}
