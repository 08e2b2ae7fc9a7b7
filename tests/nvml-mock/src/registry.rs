//! Opaque handles: every `nvmlDevice_t`, `nvmlGpuInstance_t`, `nvmlComputeInstance_t`,
//! `nvmlEventSet_t` and `nvmlGpmSample_t` the mock hands out is the address of a small leaked allocation, looked up
//! here to find what it stands for.
//!
//! Handles are interned (the same object always gets the same handle, as NVML's do), are never
//! freed (so an address is never reused and a stale handle stays recognisably stale), and carry
//! their kind, so passing a GPU-instance handle where a device is expected is rejected.

use std::collections::HashMap;

/// What a handle stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Obj {
    /// A physical GPU, by index.
    Gpu(usize),
    /// A MIG device: the compute instance `ci` of GPU instance `gi` on GPU `gpu`.
    Mig {
        gpu: usize,
        gi: u32,
        ci: u32,
    },
    GpuInstance {
        gpu: usize,
        gi: u32,
    },
    ComputeInstance {
        gpu: usize,
        gi: u32,
        ci: u32,
    },
    EventSet(u64),
    GpmSample(u64),
}

/// The allocation behind a handle; non-zero-sized so every handle has its own address.
#[derive(Debug)]
#[allow(dead_code)]
struct Slot {
    kind: u8,
}

/// Handle ↔ object maps for one session.
#[derive(Debug, Default)]
pub struct Registry {
    by_addr: HashMap<usize, Obj>,
    by_obj: HashMap<Obj, usize>,
}

impl Registry {
    /// The handle of an object, creating it on first use.
    pub fn handle(&mut self, obj: Obj) -> usize {
        if let Some(addr) = self.by_obj.get(&obj) {
            return *addr;
        }
        let kind = match obj {
            Obj::Gpu(_) => 1,
            Obj::Mig { .. } => 2,
            Obj::GpuInstance { .. } => 3,
            Obj::ComputeInstance { .. } => 4,
            Obj::EventSet(_) => 5,
            Obj::GpmSample(_) => 6,
        };
        let addr = Box::leak(Box::new(Slot { kind })) as *mut Slot as usize;
        self.by_addr.insert(addr, obj);
        self.by_obj.insert(obj, addr);
        addr
    }

    /// What a handle stands for, if it is one of ours.
    pub fn lookup(&self, addr: usize) -> Option<Obj> {
        self.by_addr.get(&addr).copied()
    }

    /// Retires a handle for good (used for freed event sets and GPM samples).
    pub fn forget(&mut self, obj: Obj) {
        if let Some(addr) = self.by_obj.remove(&obj) {
            self.by_addr.remove(&addr);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_stable_distinct_and_never_reused() {
        let mut r = Registry::default();
        let a = r.handle(Obj::Gpu(0));
        let b = r.handle(Obj::Gpu(1));
        assert_ne!(a, b);
        assert_eq!(r.handle(Obj::Gpu(0)), a);
        assert_eq!(r.lookup(b), Some(Obj::Gpu(1)));
        let s = r.handle(Obj::EventSet(1));
        r.forget(Obj::EventSet(1));
        assert_eq!(r.lookup(s), None);
        assert_ne!(r.handle(Obj::EventSet(2)), s);
        assert_eq!(r.lookup(0), None);
    }
}
