//! `cargo xtask vm-test`: the integration tests inside real distro kernels.
//!
//! For each kernel of `xtask/vm-kernels.txt`: fetch it (cached under
//! target/vm), pack an initramfs with busybox, a static `pipelock` and the
//! static integration-test binary, boot it under qemu TCG, echo the console,
//! and judge the run from the console output (see `guest_log`).
mod image;

use std::{
    fs,
    path::Path,
    sync::atomic::{AtomicUsize, Ordering},
    thread,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result, bail, ensure};

use pipelock_vm::{
    guest_log::{self, Counts, Verdict},
    image::{BUSYBOX, is_static},
    kernels::{Kernel, PrivateApt, Source, parse_kernel_list, selects},
    qemu::{self, Accel, BootOptions, Machine, Stopped},
};

use self::image::{build_static, write_initramfs};

pub struct Options {
    /// Only kernels whose name contains one of these.
    pub only: Vec<String>,
    /// Per-kernel limit for boot + tests.
    pub timeout: Duration,
    /// How long a guest's console may stay silent before it is taken for
    /// hung (see `qemu::BootOptions::silence`).
    pub silence: Option<Duration>,
    /// Use KVM (opt-in: /dev/kvm hangs on the machines this was written on).
    pub kvm: bool,
    /// Keep the initramfs and print the qemu command, for debugging by hand.
    pub verbose: bool,
    /// Only the integration tests whose name contains one of these.
    pub tests: Vec<String>,
    /// How many guests run at once. Each single-threaded TCG guest keeps one
    /// host CPU busy, so more than the host's CPUs only slows them all;
    /// benchmarks boot one at a time so that no guest measures beside another.
    pub jobs: usize,
}

/// One kernel's boot: its name, console log, whether it was stopped before
/// its end, and the nonce of its result sentinel.
pub struct Boot {
    pub kernel: String,
    pub log: String,
    pub stopped: Option<Stopped>,
    pub nonce: String,
}

pub fn vm_test(root: &Path, tools: &crate::bootstrap::Tools, options: &Options) -> Result<Counts> {
    let mut total = Counts::default();
    let mut failures = Vec::new();
    for boot in boot_each(root, tools, options, &guest_command(options))? {
        let judgement = guest_log::judge(&boot.log, &boot.nonce, boot.stopped.as_ref());
        let counts = judgement.counts.unwrap_or_default();
        eprintln!(
            "vm-test: {}: {} ({} passed, {} failed, {} skipped; log {})",
            boot.kernel,
            judgement.verdict,
            counts.passed,
            counts.failed,
            counts.skipped,
            root.join(format!("target/vm/{}.log", boot.kernel)).display()
        );
        total.passed += counts.passed;
        total.skipped += counts.skipped;
        total.failed += counts.failed;
        if let Verdict::Failed(why) = judgement.verdict {
            // A boot that died before the tests counts as one failure.
            if counts.failed == 0 {
                total.failed += 1;
            }
            failures.push(format!("{}: {why}", boot.kernel));
        }
    }
    println!(
        "vm-test: {} passed, {} failed, {} skipped",
        total.passed, total.failed, total.skipped
    );
    if !failures.is_empty() {
        bail!("vm-test failed on {}", failures.join("; "));
    }
    Ok(total)
}

/// What a guest runs: the integration tests, those of `options.tests` only
/// if any are named.
pub fn guest_command(options: &Options) -> String {
    std::iter::once("/integration".to_owned())
        .chain(options.tests.iter().cloned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Boots each selected kernel with `guest` as the command its /init runs
/// (with /pipelock and /integration beside it); the logs are kept under
/// target/vm.
pub fn boot_each(
    root: &Path,
    tools: &crate::bootstrap::Tools,
    options: &Options,
    guest: &str,
) -> Result<Vec<Boot>> {
    let (list, kernels) = kernel_list(root)?;
    // One private package list for every suite the kernel list names.
    let suites = suites(&kernels);
    let selected: Vec<&Kernel> = kernels
        .iter()
        .filter(|k| options.only.is_empty() || options.only.iter().any(|o| selects(&k.name, o)))
        .collect();
    ensure!(
        !selected.is_empty(),
        "no kernel of {} matches {:?}",
        list.display(),
        options.only
    );

    ensure_host_packages()?;
    let (pipelock, integration) = build_static(root, tools)?;
    let vm_dir = root.join("target/vm");
    let apt = PrivateApt::new(&vm_dir.join("apt"));

    // Fetching and packing stay in order (one package cache); the boots,
    // which take minutes each, share out among `jobs` threads.
    let mut guests = Vec::new();
    for kernel in selected {
        let image = match &kernel.source {
            Source::File(path) => path.clone(),
            Source::Apt { suite, glob } => apt.kernel_image(suite, glob, &vm_dir.join("kernels"), &suites)?,
        };
        let nonce = nonce();
        let initramfs = vm_dir.join(format!("initramfs-{}.cpio", kernel.name));
        write_initramfs(&initramfs, &pipelock, &integration, kernel, &nonce, guest)?;
        guests.push((kernel, image, initramfs, nonce));
    }
    // Newest first: the list runs oldest to newest, and newer kernels run
    // more of the tests (measured: 6.18 the longest, 6.1 the shortest), so
    // the shortest is the one left to fill the end.
    let next = AtomicUsize::new(0);
    let boot_next = || -> Result<Vec<(usize, Boot)>> {
        let mut done = Vec::new();
        loop {
            let Some(at) = guests.len().checked_sub(1 + next.fetch_add(1, Ordering::Relaxed)) else {
                return Ok(done);
            };
            let (kernel, image, initramfs, nonce) = &guests[at];
            done.push((at, boot_one(&vm_dir, options, kernel, image, initramfs, nonce)?));
        }
    };
    let jobs = options.jobs.clamp(1, guests.len().max(1));
    let mut boots: Vec<(usize, Boot)> = thread::scope(|scope| {
        let workers: Vec<_> = (0..jobs).map(|_| scope.spawn(boot_next)).collect();
        workers
            .into_iter()
            .map(|worker| {
                worker
                    .join()
                    .unwrap_or_else(|_| bail!("a VM boot thread panicked"))
            })
            .collect::<Result<Vec<_>>>()
    })?
    .into_iter()
    .flatten()
    .collect();
    boots.sort_by_key(|(at, _)| *at);
    Ok(boots.into_iter().map(|(_, boot)| boot).collect())
}

/// Boots one guest and keeps its console log under target/vm.
fn boot_one(
    vm_dir: &Path,
    options: &Options,
    kernel: &Kernel,
    image: &Path,
    initramfs: &Path,
    nonce: &str,
) -> Result<Boot> {
    let boot = qemu::boot(
        image,
        initramfs,
        &BootOptions {
            name: &kernel.name,
            machine: Machine {
                accel: if options.kvm { Accel::Kvm } else { Accel::Tcg },
                ..Machine::default()
            },
            timeout: options.timeout,
            silence: options.silence,
            echo: true,
            verbose: options.verbose,
        },
    )?;
    eprintln!(
        "xtask: {}: qemu exited after {:.1} s",
        kernel.name,
        boot.took.as_secs_f64()
    );
    fs::write(vm_dir.join(format!("{}.log", kernel.name)), &boot.log)?;
    if !options.verbose {
        let _ = fs::remove_file(initramfs);
    }
    Ok(Boot {
        kernel: kernel.name.clone(),
        log: boot.log,
        stopped: boot.stopped,
        nonce: nonce.to_owned(),
    })
}

/// `xtask/vm-kernels.txt` and its kernels.
fn kernel_list(root: &Path) -> Result<(std::path::PathBuf, Vec<Kernel>)> {
    let list = root.join("xtask/vm-kernels.txt");
    let kernels = parse_kernel_list(&fs::read_to_string(&list).with_context(|| list.display().to_string())?)?;
    Ok((list, kernels))
}

/// The Debian suites the kernels come from, once each.
fn suites(kernels: &[Kernel]) -> Vec<&str> {
    let mut suites: Vec<&str> = kernels
        .iter()
        .filter_map(|k| match &k.source {
            Source::Apt { suite, .. } => Some(suite.as_str()),
            Source::File(_) => None,
        })
        .collect();
    suites.sort_unstable();
    suites.dedup();
    suites
}

/// The kernel image of the kernel of `xtask/vm-kernels.txt` that `selector`
/// picks (fetched and cached as for the VM tests).
pub fn kernel_image(root: &Path, selector: &str) -> Result<std::path::PathBuf> {
    let (list, kernels) = kernel_list(root)?;
    let suites = suites(&kernels);
    let kernel = kernels
        .iter()
        .find(|k| selects(&k.name, selector))
        .with_context(|| format!("no kernel of {} is {selector}", list.display()))?;
    let vm_dir = root.join("target/vm");
    Ok(match &kernel.source {
        Source::File(path) => path.clone(),
        Source::Apt { suite, glob } => PrivateApt::new(&vm_dir.join("apt")).kernel_image(
            suite,
            glob,
            &vm_dir.join("kernels"),
            &suites,
        )?,
    })
}

fn nonce() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{:x}{:x}", nanos, std::process::id())
}

/// qemu and a static busybox come from Debian's packages.
/// The kernel tree `pipelock ab --source`'s tests build: Debian's
/// linux-source-6.1 unpacked under target/vm (once), with what building it
/// needs installed. Returns the tree.
pub fn ensure_kernel_source(root: &Path) -> Result<std::path::PathBuf> {
    const TARBALL: &str = "/usr/src/linux-source-6.1.tar.xz";
    let header = |path: &'static str| move || Path::new(path).is_file();
    let tool = |name: &'static str| move || crate::bootstrap::which(name).is_some();
    crate::bootstrap::ensure_debian_packages(&[
        ("linux-source-6.1", &header(TARBALL)),
        ("bc", &tool("bc")),
        ("bison", &tool("bison")),
        ("flex", &tool("flex")),
        ("dwarves", &tool("pahole")),
        ("gcc", &tool("gcc")),
        ("make", &tool("make")),
        ("patch", &tool("patch")),
        ("libelf-dev", &header("/usr/include/libelf.h")),
        ("libssl-dev", &header("/usr/include/openssl/opensslv.h")),
    ])?;
    let vm = root.join("target/vm");
    let tree = vm.join("linux-source-6.1");
    if !tree.join("Makefile").is_file() {
        let partial = vm.join("linux-source-6.1.partial");
        let _ = fs::remove_dir_all(&partial);
        fs::create_dir_all(&partial)?;
        eprintln!("xtask: unpacking {TARBALL}");
        crate::run(
            std::process::Command::new("tar")
                .arg("-xf")
                .arg(TARBALL)
                .arg("-C")
                .arg(&partial),
        )?;
        fs::rename(partial.join("linux-source-6.1"), &tree)?;
        let _ = fs::remove_dir_all(&partial);
    }
    Ok(tree)
}

pub fn ensure_host_packages() -> Result<()> {
    crate::bootstrap::ensure_debian_packages(&[
        ("qemu-system-x86", &|| {
            crate::bootstrap::which("qemu-system-x86_64").is_some()
        }),
        ("busybox-static", &|| {
            Path::new(BUSYBOX).is_file() && is_static(Path::new(BUSYBOX))
        }),
    ])
}
