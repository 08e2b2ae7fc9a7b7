//! gpud's own config files: the one `gpud run` reads, and NVIDIA's device plugin / GFD file,
//! loaded with the very code that reads them at start, so a file that passes here starts.

use crate::doctor::env::Env;
use crate::doctor_report::Verdict;

const FIX: &str = "correct the field named above: gpud refuses to start with this file (exit 65) and keeps the old one on reload";

/// `config.gpud`
pub fn gpud(env: &Env) -> Verdict {
    let Some(path) = &env.options.gpud_config else {
        return Verdict::skip("no gpud config file given (--config)");
    };
    match crate::config::load(path) {
        Ok(_) => Verdict::ok(format!("{} is valid", path.display())),
        Err(err) => Verdict::fail(err.to_string(), FIX),
    }
}

/// `config.nvidia`
pub fn nvidia(env: &Env) -> Verdict {
    let Some(path) = &env.options.nvidia_config else {
        return Verdict::skip("no NVIDIA config file given (--nvidia-config)");
    };
    match crate::nvidia_config::load(path) {
        Ok(_) => Verdict::ok(format!("{} is valid", path.display())),
        Err(err) => Verdict::fail(err.to_string(), FIX),
    }
}
