//! The `gpud` executable: resolves the applet from argv and runs it.

use std::process::ExitCode;

fn main() -> ExitCode {
    gpud::multicall::main(std::env::args_os().collect())
}
