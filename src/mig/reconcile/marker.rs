//! The reboot marker: a file in the state directory naming the config a reboot was requested
//! for. A node reboots at most once per requested config: when the mode change still needs a
//! reboot after one, the config fails instead of rebooting in a loop. Remove the file by hand
//! to allow another reboot.

use std::path::{Path, PathBuf};

/// The marker's file name in the state directory.
pub const FILE: &str = "reboot-requested";

/// The marker of one state directory.
#[derive(Debug, Clone)]
pub struct Marker {
    path: PathBuf,
}

impl Marker {
    /// The marker in `state_dir`.
    pub fn new(state_dir: &Path) -> Self {
        Marker {
            path: state_dir.join(FILE),
        }
    }

    /// Where it lives, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether a reboot was already requested for `label`.
    pub fn holds(&self, label: &str) -> bool {
        crate::files::read_text(&self.path).is_ok_and(|text| text.trim() == label)
    }

    /// Records that a reboot is requested for `label` (written before the reboot starts, and
    /// synced, so that the rebooted node sees it).
    pub fn set(&self, label: &str) -> Result<(), String> {
        let fail = |e: std::io::Error| format!("{}: {e}", self.path.display());
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(fail)?;
        }
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, format!("{label}\n")).map_err(fail)?;
        std::fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(fail)?;
        std::fs::rename(&tmp, &self.path).map_err(fail)
    }

    /// Forgets the marker once a config is in effect.
    pub fn clear(&self) -> Result<(), String> {
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(format!("{}: {e}", self.path.display()))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_only_the_label_it_was_set_for() {
        let dir = tempfile::tempdir().unwrap();
        let marker = Marker::new(&dir.path().join("mig"));
        assert!(!marker.holds("all-1g.10gb"));
        marker.set("all-1g.10gb").unwrap();
        assert!(marker.holds("all-1g.10gb"));
        assert!(!marker.holds("all-disabled"));
        marker.clear().unwrap();
        assert!(!marker.holds("all-1g.10gb"));
        marker.clear().unwrap();
    }
}
