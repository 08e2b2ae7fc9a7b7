//! The health watcher's sources, one file each, started from one table ([`table::TABLE`]):
//! NVML events, the kernel log and the polled signals. Each hands what it sees, as
//! [`feed::Observation`]s, over one bounded queue to the watcher's task, which alone judges;
//! starting, "unmonitored" and the end of a source are handled once, in [`feed`] and
//! [`table`]. A new source (NVLink fabric health) is one file here and one row in the table.

pub mod events;
pub mod feed;
pub mod kmsg;
pub mod observer;
pub mod poll;
pub mod table;
