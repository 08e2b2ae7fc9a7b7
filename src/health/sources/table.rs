//! The table of health sources, and starting them: every row is started the same way, and
//! what a source that cannot watch means ("unmonitored": said once, the others carry on) is
//! decided here once.

use tracing::{debug, warn};

use super::feed::{Feed, Row, Setup, Started};
use super::{events, kmsg, poll};
use crate::nvml::NvmlError;

/// Every source, started in this order. NVLink fabric health (GB200) is the next row.
pub const TABLE: [Row; 3] = [events::ROW, kmsg::ROW, poll::ROW];

/// The running sources; dropping it stops them (after their stop token fired).
pub struct Running {
    _sources: Vec<Box<dyn Send>>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Running({} sources)", self._sources.len())
    }
}

/// Starts every source of [`TABLE`] feeding `feed`. Fails when a source the watcher cannot do
/// without cannot start; a source that cannot watch on this node is said once and left out.
pub fn start_all(setup: &Setup<'_>, feed: &Feed) -> Result<Running, NvmlError> {
    let mut sources = Vec::new();
    for row in &TABLE {
        match (row.start)(setup, feed.clone()) {
            Started::Running(source) => sources.push(source),
            Started::Off => debug!(source = row.name, "Health source off by configuration"),
            Started::Unmonitored(why) => {
                warn!(source = row.name, reason = %why, "Health source unmonitored; the other sources carry on")
            }
            Started::Fatal(err) => {
                // The rows started before it stop again.
                setup.stop.cancel();
                return Err(err);
            }
        }
    }
    Ok(Running { _sources: sources })
}
