//! Shared test plumbing: the serialising session guard, a safe-ish `call!` wrapper around
//! the `unsafe extern "C"` exports, and small readers for strings and handles.

use std::os::raw::{c_char, c_uint};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

pub use nvidia_ml_mock::driver::{Config, testing};
pub use nvidia_ml_mock::ffi::rc;
pub use nvml_wrapper_sys::bindings::*;

/// Calls an export. Every pointer the tests pass is a live local of the pointee type or a
/// deliberate NULL, which is exactly the NVML contract.
macro_rules! call {
    ($f:ident($($arg:expr),* $(,)?)) => {{
        // SAFETY: arguments are live locals of the right types or deliberate NULLs (see above).
        unsafe { nvidia_ml_mock::$f($($arg),*) }
    }};
}
pub(crate) use call;

static SERIAL: Mutex<()> = Mutex::new(());

/// Serialises a test and starts the mock with `config`; the mock is reset first, so no state
/// leaks between tests.
pub fn start(config: Config) -> MutexGuard<'static, ()> {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    testing::reset();
    testing::configure(config);
    assert_eq!(call!(nvmlInit_v2()), rc::SUCCESS);
    guard
}

/// A config for a built-in fixture with the clock pinned at `t = 1000`.
pub fn fixture(name: &str) -> Config {
    Config {
        fixture: Some(name.into()),
        clock: Some(1000),
        ..Config::default()
    }
}

/// A fresh scratch directory for one test.
pub fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nvml-mock-it-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A config for a built-in fixture with a control file holding `initial`, and its path.
pub fn with_control(name: &str, tag: &str, initial: &str) -> (Config, PathBuf) {
    let dir = scratch(tag);
    let control = dir.join("control");
    std::fs::write(&control, initial).unwrap();
    (
        Config {
            control: Some(control.clone()),
            ..fixture(name)
        },
        control,
    )
}

/// The handle of GPU `index`.
pub fn gpu(index: u32) -> nvmlDevice_t {
    let mut h: nvmlDevice_t = std::ptr::null_mut();
    assert_eq!(
        call!(nvmlDeviceGetHandleByIndex_v2(index, &mut h)),
        rc::SUCCESS
    );
    h
}

/// Reads a string through a `(buffer, length)` getter.
pub fn string(
    get: impl FnOnce(*mut c_char, c_uint) -> nvmlReturn_t,
) -> Result<String, nvmlReturn_t> {
    let mut buf = [0 as c_char; 96];
    match get(buf.as_mut_ptr(), buf.len() as c_uint) {
        0 => {
            // SAFETY: on success the getter wrote a NUL-terminated string into `buf`.
            let s = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
            Ok(s.to_str().unwrap().to_owned())
        }
        code => Err(code),
    }
}

/// A device's name.
pub fn name(h: nvmlDevice_t) -> String {
    string(|b, n| call!(nvmlDeviceGetName(h, b, n))).unwrap()
}

/// A device's UUID.
pub fn uuid(h: nvmlDevice_t) -> String {
    string(|b, n| call!(nvmlDeviceGetUUID(h, b, n))).unwrap()
}

/// Turns a fixed C string field into a `String`.
pub fn c_field(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    String::from_utf8(bytes).unwrap()
}

/// Appends lines to a control file.
pub fn inject(path: &std::path::Path, lines: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    f.write_all(lines.as_bytes()).unwrap();
}

/// Polls `cond` for up to two seconds (the watcher applies appended lines within a few ms).
pub fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while std::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    false
}
