//! Process exit codes, shared by every applet (sysexits.h values where one fits).

/// A command-line usage error: unknown applet, bad flag (`EX_USAGE`).
pub const USAGE: u8 = 64;
/// Bad input data: a config file or value that does not validate (`EX_DATAERR`).
pub const DATA: u8 = 65;
/// A file that cannot be created or replaced: a config folder or file gpud may not write
/// (`EX_CANTCREAT`).
pub const CANT_CREATE: u8 = 73;
/// NVML cannot be loaded or initialised: no driver on this node (`EX_UNAVAILABLE`).
pub const UNAVAILABLE: u8 = 69;
/// Any other failure.
pub const FAILURE: u8 = 1;
