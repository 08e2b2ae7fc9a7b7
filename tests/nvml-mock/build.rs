//! Link settings of the cdylib: the SONAME of the real driver library, so that a copy or
//! symlink named `libnvidia-ml.so.1` is indistinguishable from NVIDIA's to the dynamic loader,
//! and `-z nodelete`, because nvml-wrapper `dlclose`s the library on shutdown while another
//! thread may still be returning from a blocking `nvmlEventSetWait_v2`; keeping the code mapped
//! makes that harmless and keeps the simulated state for the next `dlopen`.
//!
//! The real library's DT_NEEDED entries are libc, libm, libdl, libpthread and librt; the mock
//! declares the same (`--no-as-needed` keeps them although it calls nothing in some), so an
//! image that lacks one of them fails its tests here rather than on a GPU node. They are
//! named by file (`-l:libdl.so.2`): since glibc 2.34 libdl, libpthread and librt live inside
//! libc, have no `.so` link name and only empty static archives, so `-ldl` would record nothing.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    for arg in [
        "-Wl,--no-as-needed",
        "-l:libm.so.6",
        "-l:libdl.so.2",
        "-l:libpthread.so.0",
        "-l:librt.so.1",
        "-Wl,--as-needed",
    ] {
        println!("cargo:rustc-cdylib-link-arg={arg}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
