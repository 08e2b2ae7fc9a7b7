//! [`ApiSink`]: the one handle the labeller's loop pushes labels through and retries, over
//! whichever Kubernetes API sink the settings chose. Both sinks answer "did this sync write
//! anything?" so the loop logs real changes only.

use super::labels::Labels;
use super::node::NodeSink;
use super::node_feature::NodeFeatureSink;
use crate::kube::ApiError;

/// The API sink the labeller writes through (at most one: the Node and a NodeFeature
/// object would make gpud and nfd-master fight over the same Node labels). Boxed: the
/// variants differ in size and a process holds one.
#[derive(Debug)]
pub enum ApiSink {
    /// The Node's own labels.
    Node(Box<NodeSink>),
    /// NFD's NodeFeature object for this node.
    NodeFeature(Box<NodeFeatureSink>),
}

impl ApiSink {
    /// What the sink writes, for messages: `node n1`, `NodeFeature gpu/nvidia-features-for-n1`.
    pub fn target(&self) -> String {
        match self {
            ApiSink::Node(sink) => format!("node {}", sink.node()),
            ApiSink::NodeFeature(sink) => sink.target(),
        }
    }

    /// A per-node number that spreads the retries of many nodes apart.
    pub fn seed(&self) -> u64 {
        let node = match self {
            ApiSink::Node(sink) => sink.node(),
            ApiSink::NodeFeature(sink) => sink.node(),
        };
        crate::backoff::seed_from(node)
    }

    /// One attempt at bringing the sink up to `wanted`; returns whether anything was written.
    pub async fn sync(&mut self, wanted: &Labels) -> Result<bool, ApiError> {
        match self {
            ApiSink::Node(sink) => sink.sync(wanted).await,
            ApiSink::NodeFeature(sink) => sink.sync(wanted).await,
        }
    }
}
