//! Library lifetime and system-wide queries: init/shutdown, error strings, driver, NVML and
//! CUDA versions.

use std::os::raw::{c_char, c_int, c_uint};

use crate::driver;
use crate::ffi::{export, put, put_str, rc};
use nvml_wrapper_sys::bindings::nvmlReturn_t;

export! {
    /// Initialises the library (reference counted).
    fn nvmlInit_v2() {
        match driver::init() {
            rc::SUCCESS => Ok(()),
            code => Err(code),
        }
    }
}

export! {
    /// Initialises the library with flags. `NVML_INIT_FLAG_NO_GPUS` and
    /// `NVML_INIT_FLAG_NO_ATTACH` are accepted; init never fails for lack of GPUs.
    fn nvmlInitWithFlags(flags: c_uint) {
        let _ = flags;
        match driver::init() {
            rc::SUCCESS => Ok(()),
            code => Err(code),
        }
    }
}

export! {
    /// Drops one reference taken by an init.
    fn nvmlShutdown() {
        match driver::shutdown() {
            rc::SUCCESS => Ok(()),
            code => Err(code),
        }
    }
}

/// The text NVML gives for a return code; static so the pointer stays valid forever.
fn error_text(result: nvmlReturn_t) -> &'static std::ffi::CStr {
    use nvml_wrapper_sys::bindings as b;
    match result {
        b::nvmlReturn_enum_NVML_SUCCESS => c"Success",
        b::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED => c"Uninitialized",
        b::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        b::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED => c"Not Supported",
        b::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION => c"Insufficient Permissions",
        b::nvmlReturn_enum_NVML_ERROR_ALREADY_INITIALIZED => c"Already Initialized",
        b::nvmlReturn_enum_NVML_ERROR_NOT_FOUND => c"Not Found",
        b::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        b::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_POWER => c"Insufficient External Power",
        b::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED => c"Driver Not Loaded",
        b::nvmlReturn_enum_NVML_ERROR_TIMEOUT => c"Timeout",
        b::nvmlReturn_enum_NVML_ERROR_IRQ_ISSUE => c"Interrupt Request Issue",
        b::nvmlReturn_enum_NVML_ERROR_LIBRARY_NOT_FOUND => c"NVML Shared Library Not Found",
        b::nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND => c"Function Not Found",
        b::nvmlReturn_enum_NVML_ERROR_CORRUPTED_INFOROM => c"Corrupted infoROM",
        b::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => c"GPU is lost",
        b::nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED => c"GPU requires restart",
        b::nvmlReturn_enum_NVML_ERROR_OPERATING_SYSTEM => c"The operating system has blocked the request.",
        b::nvmlReturn_enum_NVML_ERROR_LIB_RM_VERSION_MISMATCH => c"RM has detected an NVML/RM version mismatch.",
        b::nvmlReturn_enum_NVML_ERROR_IN_USE => c"In use by another client",
        b::nvmlReturn_enum_NVML_ERROR_MEMORY => c"Insufficient Memory",
        b::nvmlReturn_enum_NVML_ERROR_NO_DATA => c"No data",
        b::nvmlReturn_enum_NVML_ERROR_VGPU_ECC_NOT_SUPPORTED => {
            c"The requested vgpu operation is not available on target device, because ECC is enabled"
        }
        b::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES => c"Insufficient resources",
        b::nvmlReturn_enum_NVML_ERROR_FREQ_NOT_SUPPORTED => c"Frequency not supported",
        b::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH => c"Argument version mismatch",
        b::nvmlReturn_enum_NVML_ERROR_DEPRECATED => c"Deprecated",
        b::nvmlReturn_enum_NVML_ERROR_NOT_READY => c"Not ready",
        b::nvmlReturn_enum_NVML_ERROR_GPU_NOT_FOUND => c"GPU not found",
        b::nvmlReturn_enum_NVML_ERROR_INVALID_STATE => c"Invalid state",
        _ => c"Unknown Error",
    }
}

/// Returns a static, NUL-terminated description of a return code. Valid before init, as in
/// NVML.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    error_text(result).as_ptr()
}

export! {
    /// The driver version, e.g. `570.133.20`.
    fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) {
        let s = driver::session()?;
        put_str!(version, length, &s.node.driver_version);
        Ok(())
    }
}

export! {
    /// The NVML library version, e.g. `12.570.133.20`.
    fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) {
        let s = driver::session()?;
        put_str!(version, length, &s.node.nvml_version);
        Ok(())
    }
}

export! {
    /// The CUDA version the driver supports, as `1000 * major + 10 * minor`.
    fn nvmlSystemGetCudaDriverVersion(cuda_driver_version: *mut c_int) {
        let s = driver::session()?;
        put!(cuda_driver_version, s.node.cuda_driver_version);
        Ok(())
    }
}

export! {
    /// Same as `nvmlSystemGetCudaDriverVersion`; the `_v2` symbol is what nvml-wrapper calls.
    fn nvmlSystemGetCudaDriverVersion_v2(cuda_driver_version: *mut c_int) {
        let s = driver::session()?;
        put!(cuda_driver_version, s.node.cuda_driver_version);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_a_text() {
        assert_eq!(error_text(rc::GPU_IS_LOST).to_str().unwrap(), "GPU is lost");
        assert_eq!(error_text(12345).to_str().unwrap(), "Unknown Error");
    }
}
