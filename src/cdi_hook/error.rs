//! Why a CDI hook could not do its job: one line each, naming the path and what to do. The
//! applet prints it and exits non-zero, and the runtime then fails the container's start,
//! which is right for a container that would otherwise start without its GPU setup.

use std::path::PathBuf;

/// A hook's failure.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// The container state could not be read.
    #[error(
        "cannot read the container state from {from}: {source} (the runtime writes it on the \
         hook's stdin; --container-spec FILE reads it from a file)"
    )]
    ReadState {
        /// `stdin` or the file named.
        from: String,
        /// Why.
        source: std::io::Error,
    },
    /// The container state or config is not the JSON it should be.
    #[error(
        "cannot parse {from}: {reason} (expected the OCI state, with \"bundle\", or the bundle's \
         config.json, with \"root\")"
    )]
    ParseState {
        /// `stdin` or the file named.
        from: String,
        /// What was wrong.
        reason: String,
    },
    /// The bundle's config.json could not be read.
    #[error("cannot read the container config {path}: {source} (the state's bundle must hold it)")]
    ReadConfig {
        /// The config.json path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The container root is the host's own root: there is nothing the hook may change.
    #[error(
        "the container root {path} is the host's /: refusing to change the host (check the \
         bundle's root.path)"
    )]
    HostRoot {
        /// The root named.
        path: PathBuf,
    },
    /// The container root could not be opened.
    #[error("cannot open the container root {path}: {source} (check the bundle's root.path)")]
    OpenRoot {
        /// The root named.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file operation inside the container root failed.
    #[error("cannot {op} {path} inside the container root {root}: {source}")]
    InRoot {
        /// What was being done (`create the directory`, `create the link`, …).
        op: &'static str,
        /// The path inside the container.
        path: String,
        /// The container root on the host.
        root: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A path inside the container is not what the hook may safely change.
    #[error("refusing to {op} {path} inside the container root {root}: {why}")]
    Refused {
        /// What was asked.
        op: &'static str,
        /// The path inside the container.
        path: String,
        /// The container root on the host.
        root: PathBuf,
        /// Why not.
        why: &'static str,
    },
    /// ldconfig could not be started.
    #[error("cannot run {path}: {source} (--ldconfig-path names the host's ldconfig)")]
    StartLdconfig {
        /// The ldconfig run.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// ldconfig ran and failed.
    #[error("{path} failed for the container root {root} ({status}): {stderr}")]
    Ldconfig {
        /// The ldconfig run.
        path: PathBuf,
        /// The container root.
        root: PathBuf,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// The last line it wrote on stderr.
        stderr: String,
    },
    /// The ldconfig named is not a static program, so it cannot run inside the container's
    /// root without loading the image's libraries.
    #[error(
        "{path} is {kind}, not a static program: the linker cache is rebuilt with the container \
         root as ldconfig's root, where only a static ldconfig runs without the image's libc \
         (--ldconfig-path names the host's static ldconfig, e.g. /sbin/ldconfig.real on Ubuntu)"
    )]
    NotStatic {
        /// The ldconfig named.
        path: PathBuf,
        /// What it is instead.
        kind: &'static str,
    },
    /// The process that runs ldconfig inside the container's root could not set it up.
    #[error("cannot {step} for ldconfig in the container root {root}: {source}")]
    Sandbox {
        /// The step that failed.
        step: &'static str,
        /// The container root (or the mount) concerned.
        root: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// ldconfig did not finish in time and was ended: the image's linker config names
    /// something that never ends (a FIFO, a device) or is huge.
    #[error(
        "{path} did not finish within {secs} s for the container root {root} and was ended: the \
         image's /etc/ld.so.conf, its includes or its library folders name something that does \
         not end (a FIFO, a device) or is huge ({stderr})"
    )]
    LdconfigTimeout {
        /// The ldconfig run.
        path: PathBuf,
        /// The container root.
        root: PathBuf,
        /// The deadline, in seconds.
        secs: u64,
        /// The last line it wrote on stderr.
        stderr: String,
    },
    /// The ldconfig sandbox (a child gpud) failed before ldconfig ran; its own line.
    #[error("{0}")]
    Said(String),
    /// The host's driver parameters could not be read.
    #[error("cannot read the driver parameters {path}: {source}")]
    ReadParams {
        /// The params file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A mount for the container failed.
    #[error("cannot {op} {path} inside the container root {root}: {source}")]
    Mount {
        /// What was being mounted.
        op: &'static str,
        /// The path inside the container.
        path: String,
        /// The container root on the host.
        root: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}
