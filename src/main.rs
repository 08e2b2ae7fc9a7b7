//! The `gpud` executable: resolves the applet from argv and runs it.

use std::process::ExitCode;

fn main() -> ExitCode {
    // Before anything else: a SIGHUP that arrives while an applet is still starting must not
    // kill it (see gpud::daemon::signals).
    gpud::daemon::signals::block();
    gpud::multicall::main(std::env::args_os().collect())
}
