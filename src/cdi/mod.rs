//! CDI (Container Device Interface) specs for the node's GPUs: the `gpud cdi generate` applet
//! and the spec the device plugin writes for its CDI device-list strategies.
//!
//! The pure core is [`build()`]: a [`Snapshot`](crate::inventory::Snapshot), the
//! [`HostFiles`] found on the host and [`Options`] (kind, device names, `all` device, hooks)
//! give a [`Spec`]. [`discover`] finds the host files, [`render`] turns a spec into YAML or
//! JSON and [`write`] puts it on disk atomically; those three are the thin I/O shell.

pub mod build;
pub mod discover;
pub mod host;
pub mod kind;
pub mod names;
pub mod render;
pub mod spec;
pub mod version;
pub mod write;

pub use build::{BuildError, Generated, HookName, Options, build};
pub use host::{HostFiles, HostPath, MigCaps};
pub use kind::{Kind, KindError};
pub use names::NameStrategy;
pub use render::Format;
pub use spec::{ContainerEdits, Device, DeviceNode, Hook, Mount, Spec};
