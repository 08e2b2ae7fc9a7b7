//! The container-runtime seam: this node's pods as the container runtime knows them, asked
//! over its CRI socket (`runtime.v1.RuntimeService`), for a node where gpud is not to read
//! pods from the API server.
//!
//! [`client`] makes the two list calls, [`directory`] turns their answers into the same
//! [`crate::pod_directory::PodDirectory`] the API server's watch feeds, and [`follow`] asks again
//! on its own interval, so nothing here runs on a scrape.

pub mod client;
pub mod directory;
pub mod follow;
