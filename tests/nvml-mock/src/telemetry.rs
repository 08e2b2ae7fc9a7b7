//! Simulated live readings (utilisation, memory, temperature, power, energy, clocks, PCIe and
//! NVLink counters).
//!
//! Every value is a pure function of `(fixture seed, GPU index, field, t)`, where `t` is whole
//! seconds on the mock clock, so two processes (or two runs with `NVML_MOCK_CLOCK` fixed) see
//! the same numbers. Smoothness comes from value noise: hashed knots at a per-field period,
//! linearly interpolated. All knots repeat every [`PERIOD`] seconds, which lets the energy
//! counter (the integral of power) be computed in bounded time for any `t`.

use crate::models::Model;
use crate::node::Gpu;

/// Length of the repeating telemetry pattern, in seconds.
pub const PERIOD: u64 = 3600;

/// Field tags that decorrelate the noise of different readings.
#[derive(Debug, Clone, Copy)]
#[repr(u64)]
enum Field {
    UtilSlow = 1,
    UtilFast,
    MemUtil,
    MemUsed,
    Temp,
    Power,
    Clock,
    Pcie,
    NvLink,
    Energy,
    Replay,
    Bar1,
    MigMem,
    MigUtil,
}

/// SplitMix64: a tiny, well-mixed hash, ample for test data.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn hash(seed: u64, gpu: usize, field: Field, k: u64) -> u64 {
    mix(mix(mix(seed ^ field as u64) ^ gpu as u64) ^ k)
}

/// A uniform value in `[0, 1)` per knot.
fn unit(seed: u64, gpu: usize, field: Field, k: u64) -> f64 {
    (hash(seed, gpu, field, k) >> 11) as f64 / (1u64 << 53) as f64
}

/// Value noise in `[0, 1)` with knots every `period` seconds (which must divide [`PERIOD`]).
fn noise(seed: u64, gpu: usize, field: Field, t: u64, period: u64) -> f64 {
    let knots = PERIOD / period;
    let k = (t / period) % knots;
    let frac = (t % period) as f64 / period as f64;
    let a = unit(seed, gpu, field, k);
    let b = unit(seed, gpu, field, (k + 1) % knots);
    a + (b - a) * frac
}

/// The inputs every reading depends on.
#[derive(Debug, Clone, Copy)]
pub struct Probe<'a> {
    pub seed: u64,
    pub gpu: &'a Gpu,
    pub t: u64,
}

impl Probe<'_> {
    fn model(&self) -> &Model {
        &self.gpu.model
    }

    fn noise(&self, field: Field, period: u64) -> f64 {
        noise(self.seed, self.gpu.index, field, self.t, period)
    }

    fn at(&self, t: u64) -> Self {
        Probe { t, ..*self }
    }

    /// GPU utilisation, percent.
    pub fn gpu_util(&self) -> u32 {
        let v = 0.75 * self.noise(Field::UtilSlow, 120) + 0.25 * self.noise(Field::UtilFast, 8);
        (v * 100.0).round().min(100.0) as u32
    }

    /// Memory-controller utilisation, percent (tracks the GPU, a bit lower).
    pub fn mem_util(&self) -> u32 {
        let v = self.gpu_util() as f64 * (0.4 + 0.3 * self.noise(Field::MemUtil, 30));
        v.round() as u32
    }

    /// Framebuffer in use by applications, bytes (excludes the driver reservation).
    pub fn mem_used_bytes(&self) -> u64 {
        let usable = self.model().memory_mib - self.model().reserved_memory_mib;
        let frac = 0.05 + 0.8 * self.noise(Field::MemUsed, 300);
        ((usable as f64 * frac) as u64) << 20
    }

    /// Core temperature, °C; stays below the max operating temperature.
    pub fn temperature(&self) -> u32 {
        let t = self.model().temperature;
        let span = t.gpu_max.saturating_sub(5).saturating_sub(t.idle) as f64;
        let heat = 0.7 * self.gpu_util() as f64 / 100.0 + 0.3 * self.noise(Field::Temp, 60);
        t.idle + (span * heat).round() as u32
    }

    /// HBM temperature, °C; `None` on boards without a memory sensor.
    pub fn memory_temperature(&self) -> Option<u32> {
        self.model()
            .temperature
            .memory_max
            .map(|_| self.temperature() + 4)
    }

    /// Board power draw, mW; stays below the current power limit.
    pub fn power_mw(&self) -> u32 {
        let idle = self.model().power.idle_mw as f64;
        let ceiling = self.gpu.power_limit_mw as f64 * 0.92;
        let load = self.gpu_util() as f64 / 100.0 * (0.85 + 0.15 * self.noise(Field::Power, 40));
        (idle + (ceiling - idle).max(0.0) * load).round() as u32
    }

    /// Energy since driver load, mJ: a seeded starting value plus the integral of
    /// [`Probe::power_mw`] over every whole second before `t`. Monotonic by construction.
    pub fn energy_mj(&self) -> u64 {
        let start = 86_400
            * self.model().power.idle_mw as u64
            * (1 + hash(self.seed, self.gpu.index, Field::Energy, 0) % 30);
        let per_period: u64 = (0..PERIOD).map(|s| self.at(s).power_mw() as u64).sum();
        let whole = self.t / PERIOD;
        let partial: u64 = (0..self.t % PERIOD)
            .map(|s| self.at(s).power_mw() as u64)
            .sum();
        start + whole * per_period + partial
    }

    fn busy(&self) -> bool {
        self.gpu_util() >= 5
    }

    /// Current clock of a domain, MHz: idle clocks when idle, near max under load, on a
    /// 15 MHz grid like real boost steps.
    pub fn clock(&self, idle: u32, max: u32) -> u32 {
        if !self.busy() {
            return idle;
        }
        let v = max as f64 * (0.93 + 0.07 * self.noise(Field::Clock, 20));
        ((v as u32) / 15 * 15).clamp(idle, max)
    }

    /// Memory clock: HBM and GDDR under load run at their fixed maximum.
    pub fn memory_clock(&self) -> u32 {
        let c = self.model();
        if self.busy() {
            c.max_clocks.memory
        } else {
            c.idle_clocks.memory
        }
    }

    /// `nvmlClocksEventReasons` bitmask for the current state.
    pub fn clock_event_reasons(&self, temperature: u32) -> u64 {
        use nvml_wrapper_sys::bindings as b;
        let mut reasons = 0u64;
        if !self.busy() {
            reasons |= b::nvmlClocksEventReasonGpuIdle as u64;
        } else if self.power_mw() as f64 > self.gpu.power_limit_mw as f64 * 0.9 {
            reasons |= b::nvmlClocksEventReasonSwPowerCap as u64;
        }
        if temperature >= self.model().temperature.slowdown {
            reasons |= (b::nvmlClocksEventReasonSwThermalSlowdown
                | b::nvmlClocksThrottleReasonHwThermalSlowdown) as u64;
        }
        reasons
    }

    /// PCIe replays since boot: a handful, growing every couple of hours on some GPUs.
    pub fn pcie_replays(&self) -> u32 {
        let h = hash(self.seed, self.gpu.index, Field::Replay, 0);
        (h % 3 + (h >> 8) % 2 * (self.t / 7200)) as u32
    }

    /// PCIe throughput over the last sample, KB/s (`tx` selects direction).
    pub fn pcie_kbps(&self, tx: bool) -> u32 {
        let scale = if tx { 9_000_000.0 } else { 12_000_000.0 };
        let v = scale * self.gpu_util() as f64 / 100.0 * (0.5 + 0.5 * self.noise(Field::Pcie, 10));
        v as u32 + 1_000
    }

    /// Cumulative NVLink data counter of one link, KiB: a per-link rate times `t`.
    pub fn nvlink_kib(&self, link: u32, tx: bool) -> u64 {
        self.nvlink_kib_per_s(link, tx) * self.t
    }

    /// Data rate of one link, KiB/s (constant per link, so the counter grows linearly).
    pub fn nvlink_kib_per_s(&self, link: u32, tx: bool) -> u64 {
        let k = (link as u64) << 1 | tx as u64;
        50_000 + hash(self.seed, self.gpu.index, Field::NvLink, k) % 950_000
    }

    /// Activity of one GPU instance, percent: its own load, independent of its neighbours'.
    pub fn mig_util(&self, gi: u32) -> u32 {
        let seed = self.seed ^ ((Field::MigUtil as u64) << 16) ^ u64::from(gi);
        let v = noise(seed, self.gpu.index, Field::MigUtil, self.t, 120);
        (v * 100.0).round().min(100.0) as u32
    }

    /// BAR1 in use, MiB.
    pub fn bar1_used_mib(&self) -> u64 {
        2 + hash(self.seed, self.gpu.index, Field::Bar1, 0) % 8
    }

    /// Fan speed, percent of maximum.
    pub fn fan_percent(&self) -> u32 {
        30 + self.gpu_util() / 2
    }

    /// Memory in use inside one MIG device of `total_mib`, bytes.
    pub fn mig_mem_used_bytes(&self, gi: u32, ci: u32, total_mib: u64) -> u64 {
        let key = Field::MigMem as u64 ^ ((gi as u64) << 8 | ci as u64);
        let frac = 0.02 + 0.5 * noise(self.seed ^ key, self.gpu.index, Field::MigMem, self.t, 300);
        ((total_mib as f64 * frac) as u64) << 20
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture;

    #[test]
    fn readings_stay_within_physical_limits() {
        let node = fixture::load(Some("mixed")).unwrap();
        for gpu in &node.gpus {
            let m = &gpu.model;
            for t in (0..2 * PERIOD).step_by(37) {
                let p = Probe {
                    seed: node.seed,
                    gpu,
                    t,
                };
                assert!(p.gpu_util() <= 100 && p.mem_util() <= 100);
                assert!(p.mem_used_bytes() >> 20 <= m.memory_mib - m.reserved_memory_mib);
                assert!(p.temperature() < m.temperature.slowdown);
                assert!(p.power_mw() < gpu.power_limit_mw);
                assert!(p.clock(m.idle_clocks.sm, m.max_clocks.sm) <= m.max_clocks.sm);
            }
        }
    }

    #[test]
    fn counters_are_monotonic_and_energy_matches_power() {
        let node = fixture::load(Some("dgx-h100")).unwrap();
        let gpu = &node.gpus[3];
        let p = |t| Probe {
            seed: node.seed,
            gpu,
            t,
        };
        let mut last = 0;
        for t in [
            0,
            1,
            2,
            100,
            PERIOD - 1,
            PERIOD,
            PERIOD + 1,
            5 * PERIOD + 17,
        ] {
            let e = p(t).energy_mj();
            assert!(e >= last);
            last = e;
            assert!(p(t + 1).pcie_replays() >= p(t).pcie_replays());
        }
        assert_eq!(
            p(11).energy_mj() - p(10).energy_mj(),
            p(10).power_mw() as u64
        );
        assert_eq!(
            p(PERIOD + 5).energy_mj() - p(PERIOD + 4).energy_mj(),
            p(4).power_mw() as u64
        );
    }

    #[test]
    fn readings_are_deterministic_and_differ_between_gpus() {
        let node = fixture::load(Some("dgx-h100")).unwrap();
        let a = Probe {
            seed: node.seed,
            gpu: &node.gpus[0],
            t: 1234,
        };
        let b = Probe {
            seed: node.seed,
            gpu: &node.gpus[1],
            t: 1234,
        };
        assert_eq!(a.power_mw(), Probe { ..a }.power_mw());
        assert_ne!(
            (a.gpu_util(), a.mem_used_bytes()),
            (b.gpu_util(), b.mem_used_bytes())
        );
    }
}
