//! Files gpud reads as configuration and files it publishes for other programs, handled in one
//! place so every reader has the same limits and every writer the same guarantees.
//!
//! - [`read_yaml`] / [`read_text`]: a config file, refused before parsing when it is larger
//!   than [`MAX_CONFIG_BYTES`] or (YAML) nested deeper than [`MAX_NESTING`].
//! - [`excerpt`] / [`clip_quoted`]: what error messages quote of an offending value.
//! - [`write_atomic`]: a file replaced in one step, its temporaries never left behind.
//!
//! This module depends on nothing else in gpud, so every subsystem may use it.

mod atomic;
mod excerpt;
mod nesting;
mod read;

pub use atomic::{
    WriteError, remove_stale_temporaries, write_atomic, write_atomic_beside_others,
    write_atomic_owned,
};
pub use excerpt::{EXCERPT_CHARS, clip_quoted, excerpt};
pub use nesting::{MAX_NESTING, nesting_beyond};
pub use read::{
    MAX_CONFIG_BYTES, ReadError, check_nesting, open_regular, read_bytes, read_stdin_yaml,
    read_text, read_yaml,
};
