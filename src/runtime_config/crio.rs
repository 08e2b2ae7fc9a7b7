//! CRI-O: gpud's settings go to a drop-in file of their own (`/etc/crio/crio.conf.d/`, read
//! after `crio.conf` in name order), never into `crio.conf`.
//!
//! CRI-O reads CDI specs whenever it runs (since 1.24: there is no switch), so CDI needs
//! nothing but `[crio.runtime] cdi_spec_dirs` when other folders are wanted. A runtime entry is
//! `[crio.runtime.runtimes.<name>]` with `runtime_path` and `runtime_type = "oci"`; the default
//! is `[crio.runtime] default_runtime`.

use super::{Plan, Request, Wanted, key};

/// nvidia-ctk's default `--config` for CRI-O; gpud leaves it alone and writes the drop-in.
pub const DEFAULT_CONFIG: &str = "/etc/crio/crio.conf";

/// Where gpud writes its settings for CRI-O by default.
pub const DEFAULT_DROP_IN: &str = "/etc/crio/crio.conf.d/99-gpud.conf";

/// What `request` sets in the drop-in, and the keys gpud owns there.
pub fn plan(request: &Request) -> Plan {
    let mut plan = Plan::default();
    let dirs = key(&["crio", "runtime", "cdi_spec_dirs"]);
    if !request.cdi_spec_dirs.is_empty() {
        plan.settings
            .push((dirs.clone(), Wanted::Strings(request.cdi_spec_dirs.clone())));
    }
    plan.owned.push(dirs);
    plan.add_runtime(
        request,
        &["crio", "runtime", "runtimes"],
        &["crio", "runtime", "default_runtime"],
        |path| {
            vec![
                (&["runtime_path"], Wanted::Str(path.to_owned())),
                (&["runtime_type"], Wanted::Str("oci".to_owned())),
            ]
        },
    );
    plan
}

#[cfg(test)]
mod tests {
    use crate::runtime_config::NvidiaRuntime;
    use std::path::Path;

    use super::*;
    use crate::runtime_config::{Edited, Runtime, configure, revert};

    #[test]
    fn the_drop_in_holds_the_runtime_and_the_spec_folders() {
        let request = Request {
            enable_cdi: true,
            cdi_spec_dirs: vec!["/etc/cdi".into()],
            runtime: Some(NvidiaRuntime {
                name: "nvidia".into(),
                path: "/usr/bin/nvidia-container-runtime".into(),
            }),
            set_as_default: true,
        };
        let path = Path::new(DEFAULT_DROP_IN);
        let (out, _) = configure(Runtime::Crio, path, None, &request, 2).unwrap();
        assert_eq!(
            out,
            "[crio.runtime]\n\
             cdi_spec_dirs = [\"/etc/cdi\"]\n\
             default_runtime = \"nvidia\"\n\
             \n\
             [crio.runtime.runtimes.nvidia]\n\
             runtime_path = \"/usr/bin/nvidia-container-runtime\"\n\
             runtime_type = \"oci\"\n"
        );
        assert_eq!(
            configure(Runtime::Crio, path, Some(&out), &request, 2).unwrap(),
            (out.clone(), vec![])
        );
        assert_eq!(
            revert(Runtime::Crio, path, &out, None, "nvidia").unwrap(),
            Edited::Remove
        );
    }

    #[test]
    fn cdi_alone_needs_no_drop_in() {
        let request = Request {
            enable_cdi: true,
            ..Request::default()
        };
        let (out, _) = configure(Runtime::Crio, Path::new("d.conf"), None, &request, 2).unwrap();
        assert_eq!(out, "");
    }
}
