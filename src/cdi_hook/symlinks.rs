//! `create-symlinks --link TARGET::LINK`: symlinks inside the container, such as
//! `libcuda.so -> libcuda.so.1` for programs that open the unversioned name.

use std::path::{Path, PathBuf};

use super::error::HookError;
use super::root::{Linked, Root};

/// One `--link` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// What the link points at (as written; not resolved).
    pub target: PathBuf,
    /// Where the link is made, inside the container.
    pub link: PathBuf,
}

/// Parses `TARGET::LINK` (the form NVIDIA's hook takes), for clap.
pub fn parse_link(value: &str) -> Result<Link, String> {
    let (target, link) = value
        .split_once("::")
        .ok_or_else(|| format!("'{value}' is not TARGET::LINK"))?;
    if target.is_empty() || link.is_empty() {
        return Err(format!("'{value}' needs both a TARGET and a LINK"));
    }
    if !link.starts_with('/') {
        return Err(format!(
            "the LINK of '{value}' must be an absolute path in the container"
        ));
    }
    Ok(Link {
        target: PathBuf::from(target),
        link: PathBuf::from(link),
    })
}

/// Makes every link; a link already there with the same target is fine.
pub fn create(root: &Root, links: &[Link]) -> Result<Vec<Linked>, HookError> {
    links
        .iter()
        .map(|link| root.symlink(&link.target, Path::new(&link.link)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_target_and_link() {
        assert_eq!(
            parse_link("libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so").unwrap(),
            Link {
                target: PathBuf::from("libcuda.so.1"),
                link: PathBuf::from("/usr/lib/x86_64-linux-gnu/libcuda.so"),
            }
        );
        assert!(
            parse_link("libcuda.so.1")
                .unwrap_err()
                .contains("TARGET::LINK")
        );
        assert!(parse_link("::/x").unwrap_err().contains("both"));
        assert!(parse_link("a::b").unwrap_err().contains("absolute"));
    }

    #[test]
    fn creates_each_link_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::open(dir.path()).unwrap();
        let links = [
            parse_link("libcuda.so.1::/usr/lib64/libcuda.so").unwrap(),
            parse_link("/usr/bin/nvidia-smi::/usr/local/bin/nvidia-smi").unwrap(),
        ];
        assert_eq!(
            create(&root, &links).unwrap(),
            [Linked::Created, Linked::Created]
        );
        assert_eq!(
            create(&root, &links).unwrap(),
            [Linked::Existing, Linked::Existing]
        );
        assert_eq!(
            std::fs::read_link(dir.path().join("usr/lib64/libcuda.so")).unwrap(),
            PathBuf::from("libcuda.so.1")
        );
    }
}
