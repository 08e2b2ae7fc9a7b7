//! SELinux: under enforcing mode without NVIDIA's policy, a driver container's `modprobe` and
//! containers' access to `/dev/nvidia*` are denied.

use crate::doctor::env::Env;
use crate::doctor_report::Verdict;

/// `selinux.mode`
pub fn mode(env: &Env) -> Verdict {
    match env
        .host
        .read("/sys/fs/selinux/enforce")
        .as_deref()
        .map(str::trim)
    {
        None => Verdict::ok("SELinux is not enabled"),
        Some("0") => Verdict::ok("SELinux permissive"),
        Some("1") => Verdict::warn(
            "SELinux enforcing",
            "make sure a policy lets containers use the NVIDIA devices (container_use_devices=on, or the driver container's policy); denials show in ausearch -m avc",
        ),
        Some(other) => Verdict::warn(
            format!("/sys/fs/selinux/enforce says {other:?}"),
            "check the SELinux mode with getenforce",
        ),
    }
}
