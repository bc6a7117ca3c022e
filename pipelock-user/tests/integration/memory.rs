//! The maps' kernel memory: `--max-locks` sizes them, and the model the
//! 256-CPU figure is computed with agrees with what the kernel accounts.
use pipelock_user::bpf::{
    memory::{MapSizes, kernel_bytes, object_shapes},
    object::OBJECT,
};

use super::*;

/// Possible CPUs (`/sys/devices/system/cpu/possible`, e.g. `0-3`), what
/// per-CPU kernel allocations are sized by.
fn possible_cpus() -> Result<u64> {
    let text = fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let mut count = 0;
    for range in text.trim().split(',') {
        let (first, last) = range.split_once('-').unwrap_or((range, range));
        count += last.parse::<u64>()? - first.parse::<u64>()? + 1;
    }
    Ok(count)
}

/// `trace --max-locks 8192`: the maps get the sizes asked, and each map's
/// `memlock` (the kernel's accounting, in the report) is within 5 % of the
/// model for this machine's CPU count.
fn map_memory_is_what_the_kernel_accounts() -> Result<Outcome> {
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    let release = fs::read_to_string("/proc/sys/kernel/osrelease")?;
    let mut version = release
        .trim()
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (version.next().unwrap_or(0), version.next().unwrap_or(0));
    if (major, minor) < (6, 4) {
        return Ok(Outcome::Skipped(format!(
            "{} accounts a map's memlock as max_entries × (key + value), not what it allocates \
             (the allocation is accounted since 6.4)",
            release.trim()
        )));
    }
    let json = scratch("memory.json");
    let out = run(pipelock()
        .args(["trace", "-a", "--duration", "1", "--max-locks", "8192", "--json"])
        .arg(&json))?;
    let report = fs::read_to_string(&json);
    let _ = fs::remove_file(&json);
    ensure!(out.status.success(), "trace: {}", text(&out.stderr));
    let report = parse_report(&report?)?;
    let shapes = object_shapes(OBJECT, &MapSizes::new(Some(8192))?)?;
    let cpus = possible_cpus()?;
    ensure!(!report.maps.is_empty(), "no maps in the report");
    for map in &report.maps {
        let name = map.name.as_str();
        let shape = shapes
            .iter()
            .find(|s| s.name == name)
            .with_context(|| format!("{name} is not in the object"))?;
        ensure!(
            map.capacity == shape.max_entries,
            "{name}: capacity {} but the object sized for --max-locks 8192 says {}",
            map.capacity,
            shape.max_entries
        );
        let kernel = map.memlock_bytes.context("memlock")? as f64;
        let model = kernel_bytes(shape, cpus) as f64;
        ensure!(
            (model / kernel - 1.0).abs() <= 0.05,
            "{name}: the kernel accounts {kernel} bytes, the model says {model} ({cpus} CPUs)"
        );
        println!(
            "  {name}: {} entries, kernel {kernel} B, model {model} B",
            shape.max_entries
        );
    }
    Ok(Outcome::Passed)
}
register!(Kernel map_memory_is_what_the_kernel_accounts);
