//! The C boundary: return codes, the panic guard every export runs inside, and the macros that
//! turn caller-supplied raw pointers into checked reads and writes.
//!
//! Every pointer an NVML caller hands us is either NULL or valid for the access the NVML header
//! documents; that contract is the justification behind each `unsafe` block in this module. The
//! macros reject NULL with `NVML_ERROR_INVALID_ARGUMENT` before touching anything, so the
//! exported functions never dereference a NULL pointer, and the unsafe code is written once
//! here instead of at every call site.

use std::panic::{AssertUnwindSafe, catch_unwind};

use nvml_wrapper_sys::bindings::nvmlReturn_t;

/// The NVML return codes the mock produces, under their C names without the enum prefix.
pub mod rc {
    use nvml_wrapper_sys::bindings as b;

    pub const SUCCESS: u32 = b::nvmlReturn_enum_NVML_SUCCESS;
    pub const UNINITIALIZED: u32 = b::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
    pub const INVALID_ARGUMENT: u32 = b::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    pub const NOT_SUPPORTED: u32 = b::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
    pub const NOT_FOUND: u32 = b::nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
    pub const INSUFFICIENT_SIZE: u32 = b::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
    pub const TIMEOUT: u32 = b::nvmlReturn_enum_NVML_ERROR_TIMEOUT;
    pub const GPU_IS_LOST: u32 = b::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;
    pub const RESET_REQUIRED: u32 = b::nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED;
    pub const IN_USE: u32 = b::nvmlReturn_enum_NVML_ERROR_IN_USE;
    pub const INSUFFICIENT_RESOURCES: u32 = b::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES;
    pub const ARGUMENT_VERSION_MISMATCH: u32 =
        b::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    pub const UNKNOWN: u32 = b::nvmlReturn_enum_NVML_ERROR_UNKNOWN;
}

/// What the body of an export returns: `Err` carries the NVML error code.
pub(crate) type Res<T = ()> = Result<T, nvmlReturn_t>;

/// Runs an export's body, turning a panic into `NVML_ERROR_UNKNOWN`.
///
/// A panic must never unwind into C (it would abort the host process, which for gpud means
/// the daemon under test). The mock holds no lock across code that can panic in a way that
/// leaves state half-updated, and poisoned locks are recovered, so carrying on after a caught
/// panic is sound.
pub(crate) fn guard(body: impl FnOnce() -> Res) -> nvmlReturn_t {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => rc::SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => rc::UNKNOWN,
    }
}

/// Builds an NVML struct version word: the struct size in the low 24 bits, the version above.
pub(crate) const fn struct_version<T>(version: u32) -> u32 {
    (std::mem::size_of::<T>() as u32) | (version << 24)
}

/// Copies `text` plus a NUL into a C buffer of `len` bytes, after checking it fits.
pub(crate) fn fill_c_string(dst: &mut [u8], text: &str) -> Res {
    let bytes = text.as_bytes();
    if bytes.len() >= dst.len() {
        return Err(rc::INSUFFICIENT_SIZE);
    }
    dst[..bytes.len()].copy_from_slice(bytes);
    dst[bytes.len()] = 0;
    Ok(())
}

/// Fills a fixed `c_char` array field (e.g. `busId[32]`), truncating and always terminating.
pub(crate) fn fill_char_array<const N: usize>(dst: &mut [std::os::raw::c_char; N], text: &str) {
    let bytes = text.as_bytes();
    let n = bytes.len().min(N.saturating_sub(1));
    for (slot, byte) in dst.iter_mut().zip(bytes[..n].iter()) {
        *slot = *byte as std::os::raw::c_char;
    }
    for slot in dst.iter_mut().skip(n) {
        *slot = 0;
    }
}

/// Defines one exported NVML entry point.
///
/// The body is a block evaluating to [`Res`]; it runs inside [`guard`]. Every export is an
/// `unsafe extern "C" fn` because its pointer arguments carry the NVML C contract, which Rust
/// cannot check.
macro_rules! export {
    ($(#[doc = $doc:literal])* fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $body:block) => {
        $(#[doc = $doc])*
        ///
        /// # Safety
        ///
        /// Every pointer argument must be NULL or valid for the reads and writes the NVML
        /// header documents for this function; handles are validated by the mock itself.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> nvml_wrapper_sys::bindings::nvmlReturn_t {
            $crate::hang::wait_while_hung(stringify!($name));
            $crate::ffi::guard(move || -> $crate::ffi::Res { $body })
        }
    };
}

/// Writes `value` through an out-pointer, failing with `NVML_ERROR_INVALID_ARGUMENT` on NULL.
/// Must be used inside a closure or function returning [`Res`].
macro_rules! put {
    ($ptr:expr, $value:expr) => {{
        let ptr = $ptr;
        if ptr.is_null() {
            return Err($crate::ffi::rc::INVALID_ARGUMENT);
        }
        let value = $value;
        // SAFETY: the pointer is non-NULL, and the NVML contract makes a non-NULL out-pointer
        // valid and aligned for a write of its pointee type. `write` does not read or drop the
        // (possibly uninitialised) old contents.
        unsafe { ptr.write(value) };
    }};
}

/// Fails with `NVML_ERROR_INVALID_ARGUMENT` unless every listed pointer is non-NULL; used to
/// validate all out-pointers before any of them is written.
macro_rules! require {
    ($($ptr:expr),+ $(,)?) => {{
        if $($ptr.is_null())||+ {
            return Err($crate::ffi::rc::INVALID_ARGUMENT);
        }
    }};
}

/// Reads the value behind an in-pointer (NULL → `NVML_ERROR_INVALID_ARGUMENT`).
macro_rules! get {
    ($ptr:expr) => {{
        let ptr = $ptr;
        if ptr.is_null() {
            return Err($crate::ffi::rc::INVALID_ARGUMENT);
        }
        // SAFETY: non-NULL, and the NVML contract makes it valid and aligned for a read of an
        // initialised value of its pointee type (all pointees here are plain C integers/structs).
        unsafe { ptr.read() }
    }};
}

/// Reads only the leading `version` word of a versioned struct the caller passed in.
macro_rules! get_version {
    ($ptr:expr) => {{
        let ptr = $ptr;
        if ptr.is_null() {
            return Err($crate::ffi::rc::INVALID_ARGUMENT);
        }
        // SAFETY: non-NULL; by the NVML contract the caller has initialised the struct's
        // `version` field (the first field), which is all that is read here.
        unsafe { std::ptr::addr_of!((*ptr).version).read() }
    }};
}

/// Borrows a NUL-terminated input string as UTF-8 (NULL or invalid UTF-8 →
/// `NVML_ERROR_INVALID_ARGUMENT`).
macro_rules! get_str {
    ($ptr:expr) => {{
        let ptr: *const std::os::raw::c_char = $ptr;
        if ptr.is_null() {
            return Err($crate::ffi::rc::INVALID_ARGUMENT);
        }
        // SAFETY: non-NULL, and the NVML contract makes string arguments NUL-terminated and
        // valid for reads up to the terminator for the duration of the call.
        let cstr = unsafe { std::ffi::CStr::from_ptr(ptr) };
        match cstr.to_str() {
            Ok(text) => text.to_owned(),
            Err(_) => return Err($crate::ffi::rc::INVALID_ARGUMENT),
        }
    }};
}

/// Copies `text` into a caller buffer of `length` bytes, NUL-terminated
/// (`NVML_ERROR_INSUFFICIENT_SIZE` when it does not fit).
macro_rules! put_str {
    ($buf:expr, $length:expr, $text:expr) => {{
        let buf: *mut std::os::raw::c_char = $buf;
        if buf.is_null() {
            return Err($crate::ffi::rc::INVALID_ARGUMENT);
        }
        let length = $length as usize;
        // SAFETY: non-NULL, and the NVML contract makes `buf` valid for writes of `length`
        // bytes. `c_char` and `u8` have the same size and alignment, and every byte pattern is
        // a valid `u8`, so viewing the buffer as `&mut [u8]` is sound for the call's duration.
        let dst = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), length) };
        $crate::ffi::fill_c_string(dst, $text)?;
    }};
}

/// Copies a slice into a caller array known (by the caller's own count) to hold it.
macro_rules! put_slice {
    ($ptr:expr, $values:expr) => {{
        let ptr = $ptr;
        let values = $values;
        if ptr.is_null() {
            return Err($crate::ffi::rc::INVALID_ARGUMENT);
        }
        // SAFETY: non-NULL; every use of this macro first checks that the caller's array
        // capacity (its in/out count, the size argument, or the NVML-documented minimum for
        // the call) covers `values.len()` elements, and Rust-owned `values` cannot overlap
        // caller memory.
        unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), ptr, values.len()) };
    }};
}

/// The NVML count protocol for an array result: `*count` holds the caller's capacity on entry
/// and the number of items on return. Too small a capacity sets the count and fails with
/// `NVML_ERROR_INSUFFICIENT_SIZE` (so `count = 0, array = NULL` asks for the size); an empty
/// result is `NVML_SUCCESS` with a count of 0.
macro_rules! put_counted {
    ($count:expr, $array:expr, $items:expr) => {{
        let count = $count;
        let items = $items;
        let capacity = $crate::ffi::get!(count) as usize;
        if capacity < items.len() {
            $crate::ffi::put!(count, items.len() as std::os::raw::c_uint);
            return Err($crate::ffi::rc::INSUFFICIENT_SIZE);
        }
        if !items.is_empty() {
            $crate::ffi::put_slice!($array, items);
        }
        $crate::ffi::put!(count, items.len() as std::os::raw::c_uint);
    }};
}

pub(crate) use {export, get, get_str, get_version, put, put_counted, put_slice, put_str, require};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_string_needs_room_for_the_terminator() {
        let mut buf = [0xffu8; 4];
        assert_eq!(fill_c_string(&mut buf, "abcd"), Err(rc::INSUFFICIENT_SIZE));
        assert_eq!(fill_c_string(&mut buf, "abc"), Ok(()));
        assert_eq!(buf, *b"abc\0");
    }

    #[test]
    fn guard_maps_panics_to_unknown() {
        #[allow(clippy::panic)]
        let code = guard(|| panic!("boom"));
        assert_eq!(code, rc::UNKNOWN);
        assert_eq!(guard(|| Err(rc::NOT_FOUND)), rc::NOT_FOUND);
    }

    #[test]
    fn version_words_match_the_nvml_header() {
        use nvml_wrapper_sys::bindings::*;
        assert_eq!(struct_version::<nvmlMemory_v2_t>(2), 0x0200_0028);
        assert_eq!(
            struct_version::<nvmlGpuInstanceProfileInfo_v2_t>(2),
            0x0200_0098
        );
        assert_eq!(
            struct_version::<nvmlGpuInstanceProfileInfo_v3_t>(3),
            0x0300_0098
        );
        assert_eq!(
            struct_version::<nvmlComputeInstanceProfileInfo_v2_t>(2),
            0x0200_0088
        );
        assert_eq!(
            struct_version::<nvmlComputeInstanceProfileInfo_v3_t>(3),
            0x0300_008C
        );
        assert_eq!(struct_version::<nvmlGpuFabricInfo_v2_t>(2), 0x0200_0024);
        assert_eq!(struct_version::<nvmlGpuFabricInfo_v3_t>(3), 0x0300_0028);
    }
}
