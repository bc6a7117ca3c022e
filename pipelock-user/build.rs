//! Builds `pipelock-ebpf` for the BPF target and leaves the object in OUT_DIR,
//! where `include_bytes_aligned!` embeds it into the `pipelock` binary.
//!
//! With `PIPELOCK_EBPF_STUB=1` an empty object is embedded instead, so unit
//! tests and clippy run on machines without nightly or bpf-linker; the binary
//! then refuses every command that needs the kernel programs.
use std::{env, fs, path::PathBuf};

use anyhow::{Context as _, bail};

const STUB_VAR: &str = "PIPELOCK_EBPF_STUB";
const OBJECT_NAME: &str = "pipelock";

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed={STUB_VAR}");
    println!("cargo:rerun-if-env-changed=PATH");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").context("OUT_DIR not set")?);
    let object = out_dir.join(OBJECT_NAME);

    if env::var(STUB_VAR).is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true")) {
        println!("cargo:warning={STUB_VAR}=1: embedding an empty eBPF object (tests only)");
        fs::write(&object, []).context("writing the stub eBPF object")?;
        return Ok(());
    }

    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").context("no manifest dir")?);
    let workspace = manifest_dir.parent().context("pipelock-user has no parent dir")?;
    // `cargo xtask build` bootstraps bpf-linker here; rustc finds the linker on PATH.
    let tools_bin = workspace.join("target/tools/bin");
    println!(
        "cargo:rerun-if-changed={}",
        tools_bin.join("bpf-linker").display()
    );
    if which::which("bpf-linker").is_err() {
        if !tools_bin.join("bpf-linker").is_file() {
            bail!(
                "bpf-linker not found on PATH nor in {}: run `cargo xtask build` (it bootstraps \
                 bpf-linker), or set {STUB_VAR}=1 to build without the eBPF programs (tests only)",
                tools_bin.display()
            );
        }
        let mut paths = vec![tools_bin];
        paths.extend(env::split_paths(&env::var_os("PATH").unwrap_or_default()));
        // SAFETY: build scripts are single-threaded at this point.
        unsafe { env::set_var("PATH", env::join_paths(paths)?) };
    }

    let ebpf_dir = workspace.join("pipelock-ebpf");
    let ebpf_dir = ebpf_dir.to_str().context("non-UTF-8 workspace path")?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "pipelock-ebpf",
            root_dir: ebpf_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::Nightly,
    )
}
