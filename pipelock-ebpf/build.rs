//! Link flags for bpf-linker.
//!
//! By default bpf-linker asks LLVM to expand `memcpy` "in order" (for old
//! JITs' pattern matchers), which also keeps LLVM from expanding `memset`
//! inline at all: every zeroed array or struct became a BPF-to-BPF call to
//! compiler-builtins' byte-at-a-time `memset` (a 96-byte clear: 500
//! instructions). Without it, LLVM writes both as stores.
fn main() {
    println!("cargo::rustc-link-arg-bins=--disable-expand-memcpy-in-order");
}
