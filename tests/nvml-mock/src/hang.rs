//! `hang <function>` / `unhang <function>` control lines: the named export blocks, as a driver
//! call on a sick GPU does, until `unhang` names it. Callers test that they survive a call that
//! never returns (a deadline, an abandoned thread).
//!
//! Process-wide and independent of the GPU fault state (a truncated control file does not
//! clear it). The blocked call holds no lock of the mock while it waits, so other threads (and
//! `nvmlShutdown`) carry on; the fast path for every export is one atomic load.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

/// Some function is hung (checked before taking the lock).
static ANY: AtomicBool = AtomicBool::new(false);
static HUNG: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
static CHANGED: Condvar = Condvar::new();

fn hung() -> MutexGuard<'static, BTreeSet<String>> {
    HUNG.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Parses and applies a `hang`/`unhang` line; `None` when the line is another command.
pub fn command(line: &str) -> Option<Result<(), String>> {
    let line = line.split('#').next().unwrap_or("").trim();
    let words: Vec<&str> = line.split_whitespace().collect();
    let (hang, name) = match words.as_slice() {
        ["hang", name] => (true, *name),
        ["unhang", name] => (false, *name),
        ["hang" | "unhang", ..] => {
            return Some(Err("expected one NVML function name".into()));
        }
        _ => return None,
    };
    if !name.starts_with("nvml") {
        return Some(Err(format!("{name:?} is not an NVML function")));
    }
    let mut set = hung();
    if hang {
        set.insert(name.to_owned());
    } else {
        set.remove(name);
    }
    ANY.store(!set.is_empty(), Ordering::Release);
    drop(set);
    CHANGED.notify_all();
    Some(Ok(()))
}

/// Called at the start of every export: blocks while `function` is hung.
pub fn wait_while_hung(function: &str) {
    if !ANY.load(Ordering::Acquire) {
        return;
    }
    let mut set = hung();
    while set.contains(function) {
        set = CHANGED.wait(set).unwrap_or_else(PoisonError::into_inner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn a_hung_function_blocks_until_unhung() {
        assert!(command("xid 0 79").is_none());
        assert!(command("hang").unwrap().is_err());
        assert!(command("hang gpuReset").unwrap().is_err());
        assert_eq!(command("hang nvmlTestOnlyHang # comment"), Some(Ok(())));
        let (tx, rx) = mpsc::channel();
        let caller = std::thread::spawn(move || {
            wait_while_hung("nvmlTestOnlyHang");
            tx.send(()).unwrap();
        });
        // Other functions are not held up.
        wait_while_hung("nvmlTestOnlyOther");
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
        assert_eq!(command("unhang nvmlTestOnlyHang"), Some(Ok(())));
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
        caller.join().unwrap();
    }
}
