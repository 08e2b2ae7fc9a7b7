//! Link settings of the cdylib: the SONAME of the real driver library, so that a copy or
//! symlink named `libnvidia-ml.so.1` is indistinguishable from NVIDIA's to the dynamic loader,
//! and `-z nodelete`, because nvml-wrapper `dlclose`s the library on shutdown while another
//! thread may still be returning from a blocking `nvmlEventSetWait_v2`; keeping the code mapped
//! makes that harmless and keeps the simulated state for the next `dlopen`.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rerun-if-changed=build.rs");
}
