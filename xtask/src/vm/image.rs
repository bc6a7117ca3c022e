//! The VM tests' guest: static `pipelock` and integration-test binaries
//! (built here), packed with pipelock-vm's initramfs writer.
use std::{
    path::{Path, PathBuf},
    process::Stdio,
};

use anyhow::{Context as _, Result, ensure};
use pipelock_vm::{
    guest_log,
    image::{self, is_static},
    kernels::Kernel,
};

/// Builds `pipelock` and the integration-test binary, statically linked.
/// `cargo xtask test` has built them already with these very commands, so
/// cargo finds them fresh: another package selection would resolve features
/// anew and relink the binaries under the soak and `pipelock ab` running
/// beside the guests.
pub fn build_static(root: &Path, tools: &crate::bootstrap::Tools) -> Result<(PathBuf, PathBuf)> {
    crate::run(&mut crate::cargo_static(root, tools, crate::BUILD)?)?;
    let mut test_build = crate::INTEGRATION.to_vec();
    test_build.extend(["--no-run", "--message-format=json-render-diagnostics"]);
    let out = crate::cargo_static(root, tools, &test_build)?
        .stderr(Stdio::inherit())
        .output()?;
    ensure!(
        out.status.success(),
        "building the static integration tests failed"
    );
    let integration = String::from_utf8(out.stdout)?
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|msg| msg["reason"] == "compiler-artifact" && msg["target"]["name"] == "integration")
        .find_map(|msg| msg["executable"].as_str().map(PathBuf::from))
        .context("cargo reported no integration-test executable")?;
    let pipelock = root.join("target").join(crate::TARGET).join("release/pipelock");
    for binary in [&pipelock, &integration] {
        ensure!(is_static(binary), "{} is not statically linked", binary.display());
    }
    Ok((pipelock, integration))
}

/// The VM tests' initramfs: static /pipelock and /integration, and an
/// /init that runs `guest` (the tests) with the environment they expect.
pub fn write_initramfs(
    dest: &Path,
    pipelock: &Path,
    integration: &Path,
    kernel: &Kernel,
    nonce: &str,
    guest: &str,
) -> Result<()> {
    let env = format!(
        "PIPELOCK_BIN=/pipelock PIPELOCK_IN_VM=1 PIPELOCK_EXPECT_PROGRAM_TYPES={}",
        kernel.expected_program_types
    );
    let init = image::init_script(
        &format!("pipelock-vm: {}", kernel.name),
        &env,
        guest,
        &guest_log::sentinel(nonce),
    );
    let files = [
        image::GuestFile::copy(pipelock, "pipelock", 0o755)?,
        image::GuestFile::copy(integration, "integration", 0o755)?,
    ];
    image::write_initramfs(dest, &init, &files)?;
    Ok(())
}
