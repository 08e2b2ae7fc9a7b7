//! What gpud runs as child processes and judges by their outcome: the admin's reset, verify
//! and reboot commands ([`command`]: default signal mask, output drained, a time limit past
//! which the command and every process it started are ended) and the doctor's GPU checks in a
//! child gpud ([`doctor`]). A seam below the subsystems that act on those outcomes: the
//! remediation checks a reset GPU with them, the health watcher a GPU whose saved verdict was
//! lost.

pub mod command;
pub mod doctor;
