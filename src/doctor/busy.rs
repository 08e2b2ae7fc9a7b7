//! The doctor's threads that have not finished yet, by what they do (a check id, an NVML
//! query): at most one per name, ever.
//!
//! A thread stuck in the driver cannot be cancelled, only abandoned at its deadline. The
//! periodic doctor in `gpud run` would leave one more behind on every run; instead a run finds
//! the name still claimed, does not start that work again, and reports since when it hangs.
//! One [`Busy`] lives as long as whoever repeats the runs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

/// The names whose thread is still running, with when it started.
#[derive(Debug, Clone, Default)]
pub struct Busy {
    running: Arc<Mutex<HashMap<String, SystemTime>>>,
}

impl Busy {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, SystemTime>> {
        // A panic while holding the lock cannot leave the map half-updated.
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Claims `name` for a new thread; `Err(started)` when the last thread under it, started
    /// then, has not finished.
    pub fn claim(&self, name: &str) -> Result<Claim, SystemTime> {
        let mut running = self.lock();
        if let Some(since) = running.get(name) {
            return Err(*since);
        }
        running.insert(name.to_owned(), SystemTime::now());
        Ok(Claim {
            busy: self.clone(),
            name: name.to_owned(),
        })
    }

    /// When the thread under `name` started, while it runs.
    pub fn since(&self, name: &str) -> Option<SystemTime> {
        self.lock().get(name).copied()
    }

    /// How many threads are running.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A claimed name, released when dropped: when its work returns or panics, or when the thread
/// meant to run it could not start.
#[derive(Debug)]
pub struct Claim {
    busy: Busy,
    name: String,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.busy.lock().remove(&self.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_claimed_once_until_released() {
        let busy = Busy::default();
        let claim = busy.claim("gpu.ecc").unwrap();
        let since = busy.since("gpu.ecc").unwrap();
        assert_eq!(busy.claim("gpu.ecc").unwrap_err(), since);
        let other = busy.claim("gpu.pcie").unwrap();
        assert_eq!(busy.len(), 2);
        drop(claim);
        drop(other);
        assert!(busy.is_empty());
        assert!(busy.claim("gpu.ecc").is_ok());
    }
}
