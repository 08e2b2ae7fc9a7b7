//! Optional taints (off unless configured): which of gpud's taints the GPUs' health calls
//! for, and the new taint list that adds or removes only those.
//!
//! gpud owns exactly the keys in [`KEYS`]; every other taint (another controller's, an
//! operator's, the node lifecycle controller's) is copied through unchanged, in its place.
//! Cordoning is never touched.

use std::str::FromStr;

use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::conditions::Counts;

/// Taint while at least one GPU is unhealthy.
pub const UNHEALTHY_KEY: &str = "gpud.io/gpu-unhealthy";
/// Taint while at least one GPU is degraded.
pub const DEGRADED_KEY: &str = "gpud.io/gpu-degraded";
/// Taint while fewer GPUs than configured are healthy.
pub const TOO_FEW_KEY: &str = "gpud.io/gpu-too-few-healthy";
/// Every key gpud owns.
pub const KEYS: [&str; 3] = [UNHEALTHY_KEY, DEGRADED_KEY, TOO_FEW_KEY];
/// The value of gpud's taints.
pub const VALUE: &str = "true";

/// A taint effect, as Kubernetes spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

impl Effect {
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::NoSchedule => "NoSchedule",
            Effect::PreferNoSchedule => "PreferNoSchedule",
            Effect::NoExecute => "NoExecute",
        }
    }
}

impl FromStr for Effect {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "NoSchedule" => Ok(Effect::NoSchedule),
            "PreferNoSchedule" => Ok(Effect::PreferNoSchedule),
            "NoExecute" => Ok(Effect::NoExecute),
            other => Err(format!(
                "{other:?} is not a taint effect (NoSchedule, PreferNoSchedule or NoExecute)"
            )),
        }
    }
}

/// `N` or `N:EFFECT` for the minimum number of healthy GPUs (the effect defaults to
/// NoSchedule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MinHealthy {
    pub gpus: usize,
    pub effect: Effect,
}

impl FromStr for MinHealthy {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (count, effect) = match text.split_once(':') {
            Some((count, effect)) => (count, effect.parse()?),
            None => (text, Effect::NoSchedule),
        };
        let gpus = count
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("{count:?} is not a positive number of GPUs (N or N:EFFECT)"))?;
        Ok(MinHealthy { gpus, effect })
    }
}

/// Which taints to keep, per severity; all off by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Policy {
    pub unhealthy: Option<Effect>,
    pub degraded: Option<Effect>,
    pub min_healthy: Option<MinHealthy>,
}

/// One of gpud's taints, present or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wanted {
    pub key: &'static str,
    pub effect: Effect,
    pub present: bool,
}

impl super::hold::Severity for Wanted {
    fn severity(&self) -> u8 {
        u8::from(self.present)
    }
}

impl Policy {
    /// Whether any taint is configured (and gpud needs `nodes patch`).
    pub fn any(&self) -> bool {
        self.unhealthy.is_some() || self.degraded.is_some() || self.min_healthy.is_some()
    }

    /// The configured taints, each present or not for `counts`.
    pub fn wanted(&self, counts: Counts) -> Vec<Wanted> {
        let mut out = Vec::new();
        if let Some(effect) = self.unhealthy {
            out.push(Wanted {
                key: UNHEALTHY_KEY,
                effect,
                present: counts.unhealthy > 0,
            });
        }
        if let Some(effect) = self.degraded {
            out.push(Wanted {
                key: DEGRADED_KEY,
                effect,
                present: counts.degraded > 0,
            });
        }
        if let Some(min) = self.min_healthy {
            out.push(Wanted {
                key: TOO_FEW_KEY,
                effect: min.effect,
                present: counts.healthy < min.gpus,
            });
        }
        out
    }
}

/// The node's new taint list for `wanted`, or `None` when `current` already matches. Taints
/// with other keys keep their place and content; gpud's are appended.
pub fn plan(current: &[Taint], wanted: &[Wanted], now: &Time) -> Option<Vec<Taint>> {
    let mut next: Vec<Taint> = current
        .iter()
        .filter(|t| !KEYS.contains(&t.key.as_str()))
        .cloned()
        .collect();
    for want in wanted.iter().filter(|w| w.present) {
        let existing = current.iter().find(|t| {
            t.key == want.key
                && t.effect == want.effect.as_str()
                && t.value.as_deref() == Some(VALUE)
        });
        next.push(existing.cloned().unwrap_or_else(|| Taint {
            key: want.key.to_owned(),
            value: Some(VALUE.to_owned()),
            effect: want.effect.as_str().to_owned(),
            time_added: Some(now.clone()),
        }));
    }
    // An owned key whose taint is not configured any more stays as it is: gpud only changes
    // the taints its policy names.
    for taint in current
        .iter()
        .filter(|t| KEYS.contains(&t.key.as_str()) && !wanted.iter().any(|w| w.key == t.key))
    {
        next.push(taint.clone());
    }
    let same = |a: &[Taint], b: &[Taint]| a.len() == b.len() && a.iter().all(|t| b.contains(t));
    if same(current, &next) {
        None
    } else {
        Some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: value.map(Into::into),
            effect: effect.into(),
            time_added: None,
        }
    }

    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
    }

    fn counts(healthy: usize, degraded: usize, unhealthy: usize) -> Counts {
        Counts {
            healthy,
            degraded,
            unhealthy,
        }
    }

    #[test]
    fn parses_min_healthy() {
        assert_eq!(
            "7".parse::<MinHealthy>(),
            Ok(MinHealthy {
                gpus: 7,
                effect: Effect::NoSchedule
            })
        );
        assert_eq!(
            "7:NoExecute".parse::<MinHealthy>().map(|m| m.effect),
            Ok(Effect::NoExecute)
        );
        assert_eq!(
            "0".parse::<MinHealthy>(),
            Err("\"0\" is not a positive number of GPUs (N or N:EFFECT)".into())
        );
        assert_eq!(
            "7:Never".parse::<MinHealthy>(),
            Err(
                "\"Never\" is not a taint effect (NoSchedule, PreferNoSchedule or NoExecute)"
                    .into()
            )
        );
    }

    #[test]
    fn adds_and_removes_only_its_own_taints() {
        let policy = Policy {
            unhealthy: Some(Effect::NoSchedule),
            degraded: None,
            min_healthy: Some(MinHealthy {
                gpus: 8,
                effect: Effect::PreferNoSchedule,
            }),
        };
        let theirs = taint("example.com/maintenance", Some("yes"), "NoExecute");
        let current = vec![theirs.clone()];
        let next = plan(&current, &policy.wanted(counts(7, 0, 1)), &now()).unwrap_or_default();
        let keys: Vec<_> = next
            .iter()
            .map(|t| (t.key.as_str(), t.effect.as_str()))
            .collect();
        assert_eq!(
            keys,
            [
                ("example.com/maintenance", "NoExecute"),
                (UNHEALTHY_KEY, "NoSchedule"),
                (TOO_FEW_KEY, "PreferNoSchedule")
            ]
        );
        // Applied: nothing more to do; recovered: back to theirs only.
        assert_eq!(plan(&next, &policy.wanted(counts(7, 0, 1)), &now()), None);
        assert_eq!(
            plan(&next, &policy.wanted(counts(8, 0, 0)), &now()),
            Some(vec![theirs])
        );
    }

    #[test]
    fn no_policy_changes_nothing() {
        let current = vec![taint(UNHEALTHY_KEY, Some(VALUE), "NoSchedule")];
        assert_eq!(
            plan(&current, &Policy::default().wanted(counts(0, 0, 8)), &now()),
            None
        );
    }
}
